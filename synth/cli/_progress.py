"""Progress lines on stderr for long commands, with a heartbeat so that a user waiting minutes sees life.

The library reports through a ``progress(message)`` callback and never prints. :class:`ProgressLog` is that
callback for the CLI: it echoes each message to stderr, remembers the phase (the last message that is not a
solver line), and while it is running a heartbeat thread re-states the phase whenever nothing was printed for
:data:`HEARTBEAT_S` seconds. Every line starts with the seconds since the command started. stdout stays for results (``--json``).
"""

from __future__ import annotations

import math
import threading
from typing import Callable

import click

from synth.solver.deadline import Deadline

# Silence on stderr after which the heartbeat restates the phase (seconds): below the 10 s promised between
# lines, because a loaded machine and single C calls over a 1024-GPU program's text (regex scans of 355 MB) hold
# the heartbeat thread up to 4 s (gaps of 14 s at 10).
HEARTBEAT_S = 8.0

# Lines that report inside a phase (HiGHS' MIP progress) and so do not name a new phase.
_SOLVER_PREFIX = "MIP "


def _stderr(message: str) -> None:
    click.echo(message, err=True)


class ProgressLog:
    """A progress callback that echoes to stderr, plus a heartbeat after ``interval_s`` of silence.

    Use it as a context manager around the work; messages may come from any thread (HiGHS' callbacks run in
    its solver thread).

    >>> lines = []
    >>> ticks = iter([0.0, 1.0, 1.0, 12.0, 12.0, 12.0])
    >>> log = ProgressLog(Deadline.after(60.0, clock=lambda: next(ticks)), echo=lines.append)
    >>> log("  alpha-beta (auto)"); log.beat(); lines
    ['[   1.0s]   alpha-beta (auto)', '[  12.0s]   ... still in alpha-beta (auto), 48 s left']
    """

    def __init__(self, deadline: Deadline | None = None, interval_s: float = HEARTBEAT_S,
                 echo: Callable[[str], None] = _stderr):
        self.deadline = deadline or Deadline.after(math.inf)     # unbounded, but it still counts the seconds
        self.interval_s, self.echo = interval_s, echo
        self.last = self._elapsed()
        self.phase = "starting"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, message: str) -> None:
        with self._lock:
            if not message.strip().startswith(_SOLVER_PREFIX):
                self.phase = message.strip()
            self.last = self._elapsed()
            self.echo(f"[{self.last:6.1f}s] {message}")

    def beat(self) -> None:
        """Re-state the phase when nothing was printed for ``interval_s``, with the time left if bounded."""
        with self._lock:
            elapsed = self._elapsed()
            if elapsed - self.last < self.interval_s:
                return
            left = self.deadline.remaining_s()
            state = "" if not self.deadline.bounded else f", {left:.0f} s left" if left > 0 else ", past the time limit"
            self.echo(f"[{elapsed:6.1f}s]   ... still in {self.phase}{state}")
            self.last = elapsed

    def _elapsed(self) -> float:
        return self.deadline.elapsed_s()

    def __enter__(self) -> ProgressLog:
        self._thread = threading.Thread(target=self._run, name="synth-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.interval_s)):
            self.beat()
