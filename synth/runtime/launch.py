"""Run a function on N local processes joined by ``torch.distributed`` (``synth run``, ``synth profile run``).

PyTorch is an optional dependency: :func:`require_torch` raises :class:`TorchMissingError` (one ``Error:``
line in the CLI) naming the extra to install. Processes are forked where the platform allows it (the parent
imports torch once; forking takes milliseconds instead of seconds per process) and spawned elsewhere. They
meet through a file store in a fresh temporary directory, so no port is chosen or opened by us; gloo then
talks over the loopback interface.

Every rank reports exactly once through a queue; a rank that raises reports the error, a rank that dies or
hangs is reported by the parent, which stops the remaining processes it started once the outcome is known.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from queue import Empty

from synth.errors import SynthError

TORCH_EXTRA = "pip install 'synth-collectives[torch]'"
GRACE_S = 3.0          # how long the parent waits for other ranks' reports after the first failure
MAX_PROCS = 64


class TorchMissingError(SynthError):
    """PyTorch (with torch.distributed) is needed for this command but is not installed."""


@dataclass(frozen=True)
class RankOutcome:
    """What one rank reported: its return value, or the error that stopped it."""

    rank: int
    ok: bool
    value: object = None
    error: str = ""


def require_torch(command: str):
    """Import and return torch, or raise :class:`TorchMissingError` saying how to install it."""
    if importlib.util.find_spec("torch") is None:
        raise TorchMissingError(f"{command} needs PyTorch, which is not installed; install the extra: "
                                f"{TORCH_EXTRA}")
    import torch
    import torch.distributed as dist
    if not dist.is_available():
        raise TorchMissingError(f"{command} needs torch.distributed, which this PyTorch build lacks; "
                                f"install a full build: {TORCH_EXTRA}")
    return torch


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods and sys.platform != "darwin" else "spawn")


def _child(rank, nprocs, init_method, backend, pg_timeout_s, worker, args, queue):
    """Entry point of every rank: join the process group, run ``worker``, report once, exit."""
    ok = False
    try:
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch.distributed as dist
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=nprocs,
                                timeout=timedelta(seconds=pg_timeout_s))
        value = worker(rank, nprocs, *args)
        queue.put((rank, True, value, ""))
        ok = True
    except BaseException as exc:  # every failure is reported, never lost in a child's stderr
        detail = f"{exc.__class__.__name__}: {exc}"
        if not isinstance(exc, SynthError):
            detail += " | " + traceback.format_exc(limit=3).strip().splitlines()[-1]
        queue.put((rank, False, None, detail[:2000]))
    finally:
        queue.close()
        queue.join_thread()
        if ok:
            try:
                import torch.distributed as dist
                dist.destroy_process_group()
            except Exception:
                pass
        os._exit(0)  # do not wait for threads that may still block on a peer that failed


def run_ranks(worker, nprocs: int, args: tuple = (), backend: str = "gloo", timeout_s: float = 120.0) -> list[RankOutcome]:
    """Run ``worker(rank, nprocs, *args)`` on ``nprocs`` processes in one process group.

    ``worker`` must be a module-level function (it may be pickled). The process group's own timeout is
    ``timeout_s``; the parent gives up ``timeout_s + 30`` seconds after the start. Returns one outcome per rank.
    """
    require_torch("this command")
    if not 1 <= nprocs <= MAX_PROCS:
        raise SynthError(f"--nprocs must be between 1 and {MAX_PROCS}, got {nprocs}")
    ctx = _context()
    queue = ctx.Queue()
    workdir = tempfile.mkdtemp(prefix="synth-torch-")
    init_method = "file://" + os.path.join(workdir, "store")
    procs = [ctx.Process(target=_child, args=(r, nprocs, init_method, backend, timeout_s, worker, args, queue),
                         daemon=True) for r in range(nprocs)]
    outcomes: dict[int, RankOutcome] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s + 30.0
        failed_at = None
        while len(outcomes) < nprocs:
            now = time.monotonic()
            limit = deadline if failed_at is None else min(deadline, failed_at + GRACE_S)
            if now >= limit:
                break
            try:
                rank, ok, value, error = queue.get(timeout=min(0.5, limit - now))
            except Empty:
                for r, p in enumerate(procs):
                    if r not in outcomes and p.exitcode is not None and p.exitcode != 0:
                        outcomes[r] = RankOutcome(r, False, error=f"process exited with code {p.exitcode}")
                        failed_at = failed_at or time.monotonic()
                continue
            outcomes[rank] = RankOutcome(rank, ok, value, error)
            if not ok and failed_at is None:
                failed_at = time.monotonic()
    finally:
        for p in procs:
            p.join(timeout=2.0 if len(outcomes) == nprocs else 0.1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
        queue.close()
        shutil.rmtree(workdir, ignore_errors=True)
    for r in range(nprocs):
        if r not in outcomes:
            outcomes[r] = RankOutcome(r, False, error="did not finish (waiting for a peer that failed, or hung)")
    return [outcomes[r] for r in range(nprocs)]
