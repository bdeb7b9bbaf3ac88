"""Where independent pieces of work run: here, in a local process pool, or on a Dask distributed cluster.

``synth solve`` writes its candidates (lower, lint, execute, simulate) and ``synth pareto`` solves its instances
through the same helpers. Every backend is a :class:`concurrent.futures.Executor` plus a number of *slots* (how
many pieces to keep in flight); :func:`open_executor` is a context manager that yields ``(executor, slots)`` and
always cleans up: interrupting (Ctrl-C) terminates the local worker processes instead of waiting for them.

Local workers fork from a ``forkserver`` that has already imported the modules the caller names (``preload``), so
starting one costs tens of milliseconds, and no worker inherits HiGHS threads from this process. Workers ignore
SIGINT: Ctrl-C reaches only this process, which then stops them. Dask (``pip install distributed``, the ``dask``
extra) needs ``synth`` importable on every worker; tasks are submitted with ``pure=False``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import re
import signal
from typing import Iterator, Sequence

from synth.errors import InputError

# What a local worker imports before it forks: the solver (its import is the slow part of starting one).
DEFAULT_PRELOAD = ("highspy",)
# How long a Dask client tries to reach its scheduler (seconds).
CONNECT_TIMEOUT_S = 10.0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_workers() -> int:
    """Worker processes used when none are asked for: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def local_pool(workers: int, preload: Sequence[str] = DEFAULT_PRELOAD) -> Iterator[tuple[cf.Executor | None, int]]:
    """A process pool of ``workers`` whose processes have imported ``preload`` (None and 0 slots for one
    worker: work in this process)."""
    if workers <= 1:
        yield None, 0
        return
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_ignore_sigint)
    try:
        yield pool, workers
    finally:
        _terminate(pool)   # speculative work still running is no longer needed


def _terminate(pool: cf.ProcessPoolExecutor) -> None:
    """Stop our own worker processes now: a running HiGHS solve or lowering cannot be cancelled, and results
    that were still wanted have been collected by the time the pool closes."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=5)


_ADDRESS = re.compile(r"^(?:(tcp|tls|ucx|ws|wss)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}))"
                      r"(?::([0-9]{1,5}))?$")


def check_scheduler_address(address: str) -> str:
    """Refuse a Dask scheduler address that is not ``[tcp|tls|ucx|ws|wss://]host[:port]`` before connecting
    (Dask's own errors for such text are tracebacks of its parser).

    >>> check_scheduler_address("tcp://10.0.0.5:8786")
    'tcp://10.0.0.5:8786'
    >>> check_scheduler_address("tcp://:x")
    Traceback (most recent call last):
    ...
    synth.errors.InputError: --scheduler: cannot read address 'tcp://:x'; write e.g. tcp://host:8786
    """
    match = _ADDRESS.match(address.strip()) if isinstance(address, str) else None
    port = match.group(3) if match else None
    if match is None or (port is not None and not 1 <= int(port) <= 65535):
        raise InputError("--scheduler", "", f"cannot read address {str(address)[:80]!r}; write e.g. tcp://host:8786")
    return address.strip()


@contextlib.contextmanager
def dask_cluster(address: str) -> Iterator[tuple[cf.Executor, int]]:
    """An executor on the Dask scheduler at ``address`` (``tcp://host:port``); slots = its worker threads."""
    address = check_scheduler_address(address)
    try:
        from distributed import Client
    except ImportError:
        raise InputError("--scheduler", "", "needs the Dask distributed package: pip install distributed "
                         "(or the synth 'dask' extra)") from None
    try:
        client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError("--scheduler", "", f"cannot reach the Dask scheduler at {address!r} ({exc}); start one "
                         "with `dask scheduler` and `dask worker ADDRESS`, or drop --scheduler") from None
    try:
        threads = sum(client.nthreads().values())
        if threads < 1:
            raise InputError("--scheduler", "", f"the Dask scheduler at {address} has no workers; start some with "
                             f"`dask worker {address}`")
        yield client.get_executor(pure=False), threads
    finally:
        client.close()


def open_executor(workers: int | None = None, scheduler: str | None = None,
                  preload: Sequence[str] = DEFAULT_PRELOAD):
    """The Dask cluster at ``scheduler`` if given, else a local pool of ``workers`` (default: all CPUs) whose
    processes have imported ``preload``."""
    if scheduler:
        return dask_cluster(scheduler)
    return local_pool(default_workers() if workers is None else workers, preload)
