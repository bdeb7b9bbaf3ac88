"""One exception tree for the whole library.

The library never prints or exits; the CLI maps these to ``Error: ...`` lines and exit codes
(1 bad input, 2 usage, 3 infeasible or no solution in time).
"""


class SynthError(Exception):
    """Base of every error this library raises on purpose."""

    exit_code = 1


class InputError(SynthError):
    """A user-supplied file or option is wrong.

    The message names the file (or option), the field and how to fix it.
    """

    def __init__(self, source: str, field: str, problem: str):
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}")


class InfeasibleError(SynthError):
    """The model has no solution (proven), e.g. too few steps or rounds."""

    exit_code = 3


class NoSolutionError(SynthError):
    """The solver stopped (time limit) before finding any solution."""

    exit_code = 3


class SolverError(SynthError):
    """The solver failed in a way that is not the user's fault."""


class BackendError(SynthError):
    """A schedule cannot be written in the requested format (e.g. breaks a runtime limit)."""


class VerificationError(SynthError):
    """A schedule or program does not implement its collective (the replay check failed)."""


def shown(value, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for quoting a hostile value in a one-line error.

    >>> shown([0] * 30)
    '[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ...'
    """
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
