"""When a command must be done: one clock reading and a budget, shared by every stage of the command.

``synth solve --time-limit T`` bounds the whole command, not each solver call. The CLI starts a
:class:`Deadline` of T seconds; the request carries it to every phase (the step search, the alpha-beta drivers,
tree packing, hierarchical compositions, writing the file). Each HiGHS call gets at most the time that is left
(:func:`synth.solver.highs.solve_model` caps its limit), and a phase that cannot start in time is skipped.

The clock is injectable, so tests drive a deadline by hand instead of sleeping.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

Clock = Callable[[], float]


@dataclass(frozen=True)
class Deadline:
    """``budget_s`` seconds from ``started_s`` on ``clock`` (a monotonic clock in seconds).

    An unbounded deadline (``budget_s`` infinite) never expires: :data:`UNBOUNDED`, the library's default.

    >>> ticks = iter([0.0, 0.0, 4.0, 12.0])
    >>> d = Deadline.after(10.0, clock=lambda: next(ticks))
    >>> d.remaining_s(), d.remaining_s(), d.expired
    (10.0, 6.0, True)
    """

    budget_s: float
    started_s: float = 0.0
    clock: Clock = field(default=time.monotonic, compare=False, repr=False)

    @classmethod
    def after(cls, budget_s: float, clock: Clock = time.monotonic) -> Deadline:
        """A deadline ``budget_s`` seconds from now."""
        return cls(float(budget_s), clock(), clock)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.budget_s)

    def elapsed_s(self) -> float:
        """Seconds since the deadline started (meaningful for one made by :meth:`after`, bounded or not)."""
        return self.clock() - self.started_s

    def remaining_s(self) -> float:
        """Seconds left (0 once expired; infinite when unbounded)."""
        return max(0.0, self.budget_s - self.elapsed_s()) if self.bounded else math.inf

    @property
    def expired(self) -> bool:
        return self.remaining_s() <= 0.0

    def cap(self, seconds: float) -> float:
        """``seconds`` or the time left, whichever is shorter (a solver call's limit)."""
        return min(seconds, self.remaining_s())

    def reserving(self, seconds: float) -> Deadline:
        """The same start with ``seconds`` held back at the end (time kept for what must follow)."""
        return Deadline(self.budget_s - seconds, self.started_s, self.clock) if self.bounded else self


UNBOUNDED = Deadline(math.inf)


class DeadlinePassed(BaseException):
    """The command's time limit and its grace (:func:`hard_stop_s`) ran out in the middle of work that does not
    look at the clock (lowering and checking a 1024-GPU program takes minutes). Raised by the CLI's timer, so it
    can arrive anywhere: like ``KeyboardInterrupt`` it derives from ``BaseException``, and no handler of library
    errors swallows it. :func:`synth.synthesis.solve.solve` keeps the files verified before it."""


# Past its deadline a command still finishes the file it is writing for this share of the budget, at least
# HARD_STOP_GRACE_MIN_S seconds, then stops (:class:`DeadlinePassed`): a plan that needs more is out of reach of
# the limit, and the user is told to raise it.
HARD_STOP_GRACE_SHARE = 0.10
HARD_STOP_GRACE_MIN_S = 10.0


def grace_s(deadline: Deadline) -> float:
    """Seconds past ``deadline`` a command may take to finish the file it is writing.

    >>> grace_s(Deadline(300.0)), grace_s(Deadline(1.0))
    (30.0, 10.0)
    """
    return max(HARD_STOP_GRACE_MIN_S, HARD_STOP_GRACE_SHARE * deadline.budget_s)


def hard_stop_s(deadline: Deadline) -> float:
    """Seconds from now until the command must stop (infinite when unbounded): the time left and the grace.

    >>> hard_stop_s(Deadline.after(300.0, clock=lambda: 0.0))
    330.0
    """
    return deadline.remaining_s() + grace_s(deadline)


# What writing and verifying the chosen file may take is held back from the search: this share of the budget,
# at least WRITE_RESERVE_MIN_S and at most WRITE_RESERVE_MAX_S seconds.
WRITE_RESERVE_SHARE = 0.15
WRITE_RESERVE_MIN_S = 0.5
WRITE_RESERVE_MAX_S = 60.0


def search_deadline(deadline: Deadline) -> Deadline:
    """The part of a command's deadline the search may use: the rest is kept for writing the chosen file.

    >>> search_deadline(Deadline(20.0)).budget_s, search_deadline(Deadline(1000.0)).budget_s
    (17.0, 940.0)
    """
    reserve = min(WRITE_RESERVE_MAX_S, max(WRITE_RESERVE_MIN_S, WRITE_RESERVE_SHARE * deadline.budget_s))
    return deadline.reserving(min(reserve, deadline.budget_s))
