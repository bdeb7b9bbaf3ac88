"""Shared CLI plumbing: error conversion, signals, shared options with checked ranges."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time

import click

from synth.errors import SynthError

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130          # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143           # 128 + SIGTERM
EXIT_INTERNAL = 70              # EX_SOFTWARE: a bug of ours, not the user's input
SHOW_TRACEBACK = "SYNTH_TRACEBACK"
MAX_SOLVER_THREADS = 256
# Largest step-formulation S, R and C a command accepts (each beyond anything a runtime could load).
MAX_STEPS, MAX_ROUNDS, MAX_CHUNKS = 256, 4096, 1024
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's limit, ``kill``): unwinds like Ctrl-C, so no output is half-written."""


@contextlib.contextmanager
def terminate_as_interrupt():
    """Turn SIGTERM into :class:`Terminated` while a command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def hard_stop(deadline):
    """Raise :class:`~synth.solver.deadline.DeadlinePassed` in the main thread once ``deadline`` and its grace
    (:func:`~synth.solver.deadline.hard_stop_s`) have passed, wherever the work is then (a real-time timer,
    ``SIGALRM``); nothing when unbounded, off the main thread, or when a caller's timer (a test harness's) goes off
    sooner. On leaving, the timer is disarmed and a caller's later one re-armed with its time left."""
    from synth.solver.deadline import DeadlinePassed, hard_stop_s

    seconds = hard_stop_s(deadline)
    outer_s, _ = signal.getitimer(signal.ITIMER_REAL) if threading.current_thread() is threading.main_thread() \
        else (0.0, 0.0)
    if (not math.isfinite(seconds) or threading.current_thread() is not threading.main_thread()
            or 0.0 < outer_s <= seconds):
        yield
        return

    def stop(signum, frame):
        raise DeadlinePassed

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
        if outer_s > 0.0:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_s - (time.monotonic() - started)))


class SynthGroup(click.Group):
    """A click group that turns library errors, Ctrl-C and SIGTERM into one ``Error: ...`` line and the
    documented exit code. Commands commit their outputs only at the end, so an interrupted run leaves none."""

    def invoke(self, ctx):
        try:
            with terminate_as_interrupt():
                return super().invoke(ctx)
        except SynthError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except Terminated:
            click.echo("Error: terminated (SIGTERM); no output was written", err=True)
            ctx.exit(EXIT_TERMINATED)
        except KeyboardInterrupt:
            click.echo("Error: interrupted (Ctrl-C); no output was written", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except MemoryError:
            click.echo("Error: out of memory; no output was written (try fewer --nodes, a smaller --chunks or "
                       "--method hierarchy)", err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:     # a bug: one line, no file, and the traceback only when asked for
            if os.environ.get(SHOW_TRACEBACK):
                raise
            where = " ".join(ctx.command_path.split()[1:] + [ctx.invoked_subcommand or ""]).strip()
            click.echo(f"Error: internal error in synth {where} ({type(exc).__name__}: {exc}); no output was "
                       f"written. Please report it with the command line; {SHOW_TRACEBACK}=1 shows the traceback",
                       err=True)
            ctx.exit(EXIT_INTERNAL)


class FiniteFloat(click.ParamType):
    """A float option that must be finite and within ``[low, high]`` (click's FloatRange lets NaN through)."""

    name = "number"

    def __init__(self, low: float | None = None, high: float | None = None):
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        if isinstance(value, float) and math.isfinite(value):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            self.fail(f"{number:g} is not in the range {self._range()}", param, ctx)
        return number

    def _range(self) -> str:
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"{low}..{high}"


def echo_err(message: str) -> None:
    """Progress and summaries go to stderr; stdout is kept for --json."""
    click.echo(message, err=True)


def option_group(options: list):
    """One decorator that applies ``options`` (click decorators) in the order they are listed in ``--help``."""
    def decorate(func):
        for option in reversed(options):
            func = option(func)
        return func
    return decorate


def solver_options_for(time_limit_s: float = 60.0, time_limit_help: str | None = None, threads_help: str | None = None):
    """--time-limit, --mip-gap, --threads, --seed for a command that runs the solver (defaults per command)."""
    return option_group([
        click.option("--time-limit", type=FiniteFloat(0.1, MAX_TIME_LIMIT_S), default=time_limit_s,
                     show_default=True,
                     help=time_limit_help or "Solver wall-clock limit in seconds; the best schedule found by "
                                             "then is used."),
        click.option("--mip-gap", type=FiniteFloat(0.0, 1.0), default=0.0, show_default=True,
                     help="Relative MIP gap at which the solver may stop."),
        click.option("--threads", type=click.IntRange(1, MAX_SOLVER_THREADS), default=None,
                     help=threads_help or "Solver threads (default: HiGHS' choice)."),
        click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True,
                     help="Solver random seed."),
    ])


solver_options = solver_options_for()


def is_tty() -> bool:
    return sys.stderr.isatty()


# ----------------------------------------------------------------------------------------------- added checks

MAX_FIFO_DEPTH = 64                  # messages per connection; NCCL's deepest FIFO holds 8
MAX_REDUCE_US_PER_BYTE = 1.0         # 1 us per byte is 1 MB/s, slower than any reduction that runs


def nodes_option(help_text: str = "Compose this many copies of a single-node topology, joined through their NICs."):
    """``--nodes``, ``--fabric`` and ``--oversubscription`` (the command takes ``nodes, fabric, oversubscription``
    and passes them to ``load_topology``). The number of nodes a machine allows depends on its GPUs per node, so
    ``compose_nodes`` refuses too many with the range, right after reading the one-node file."""
    from synth.model.topology import MAX_OVERSUBSCRIPTION, MAX_RANKS, Fabric

    options = [
        click.option("--nodes", type=click.IntRange(1, MAX_RANKS), default=1, show_default=True,
                     help=help_text),
        click.option("--fabric", type=click.Choice([f.value for f in Fabric]), default=Fabric.SWITCH.value,
                     show_default=True,
                     help="How --nodes are joined: one network switch, or rail-optimized (NIC k of every node on "
                          "leaf switch k, leaves joined by a spine)."),
        click.option("--oversubscription", type=FiniteFloat(1.0, MAX_OVERSUBSCRIPTION), default=1.0,
                     show_default=True,
                     help="Rail fabric: leaf-to-spine oversubscription (1 = non-blocking; 2 = each leaf's uplink "
                          "carries half of what its NICs can send)."),
    ]
    return option_group(options)


def workers_options(work: str, workers_help: str):
    """``--workers N`` and ``--scheduler ADDRESS``: where ``work`` runs (the command takes ``workers, scheduler``
    and calls :func:`check_workers` before any work)."""
    return option_group([
        click.option("--workers", type=click.IntRange(1, MAX_SOLVER_THREADS), default=None, help=workers_help),
        click.option("--scheduler", default=None, metavar="ADDRESS",
                     help=f"Run {work} on a Dask distributed cluster, e.g. tcp://host:8786 (pip install "
                          "distributed; synth importable on its workers)."),
    ])


def check_workers(workers: int | None, scheduler: str | None) -> None:
    """Refuse ``--workers`` with ``--scheduler``, and a scheduler address that cannot be read, before any work."""
    if workers is not None and scheduler:
        raise click.UsageError("give --workers or --scheduler, not both")
    if scheduler is not None:
        from synth.synthesis.parallel import check_scheduler_address

        check_scheduler_address(scheduler)


def check_root(collective: str, root: int | None) -> None:
    """Refuse ``--root`` for a collective that has none (it used to be ignored without a word)."""
    from synth.model.collectives import ROOTED, normalize_name

    name = normalize_name(collective)
    if root is not None and name not in ROOTED:
        from synth.errors import InputError

        raise InputError("--root", "", f"{name} has no root; drop --root (only {', '.join(ROOTED)} take one)")


def check_output_dir(option: str, path: str, files: tuple[str, ...], subdirs: tuple[str, ...] = ()) -> None:
    """Check an output directory before any work: an existing writable directory, or a new name whose nearest
    existing ancestor is a writable directory; the ``files`` it will hold must be regular files if they exist,
    and ``subdirs`` directories. Nothing is created here."""
    import os
    from pathlib import Path

    from synth.errors import InputError

    text = str(path)
    if not text.strip():
        raise InputError(option, "", "the output directory is empty; give a directory name")
    try:
        os.lstat(text)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise InputError(option, text[:80], f"cannot be used as a path ({exc.strerror})") from None
    target = Path(text)
    if target.exists():
        if not target.is_dir():
            raise InputError(option, text, "exists and is not a directory")
        if not os.access(target, os.W_OK | os.X_OK):
            raise InputError(option, text, "is not writable")
        for name in files:
            entry = target / name
            if (entry.exists() or entry.is_symlink()) and not entry.is_file():
                raise InputError(option, str(entry), "exists and is not a regular file; refusing to replace it")
            if entry.is_file() and not os.access(entry, os.W_OK):
                raise InputError(option, str(entry), "is not writable")
        for name in subdirs:
            entry = target / name
            if (entry.exists() or entry.is_symlink()) and not entry.is_dir():
                raise InputError(option, str(entry), "exists and is not a directory")
            for inner in entry.iterdir() if entry.is_dir() else ():
                if not inner.is_file():          # the command replaces files in here: never a FIFO or device
                    raise InputError(option, str(inner), "is not a regular file; move it out of the directory")
        return
    ancestor = target.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(option, text, f"{str(ancestor)!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(option, text, f"directory {str(ancestor)!r} is not writable")
