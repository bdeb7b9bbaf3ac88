"""Where sweep instances are solved: the executors of :mod:`synth.synthesis.parallel`, with workers that have
imported the sweep's solver stack before they fork."""

from __future__ import annotations

from typing import Sequence

from synth.synthesis import parallel
from synth.synthesis.parallel import check_scheduler_address, dask_cluster, default_workers

__all__ = ["SWEEP_PRELOAD", "check_scheduler_address", "dask_cluster", "default_workers", "local_pool",
           "open_executor"]

SWEEP_PRELOAD: Sequence[str] = ("synth.sweep.frontier", "highspy")


def local_pool(workers: int):
    """:func:`synth.synthesis.parallel.local_pool` with the sweep's modules preloaded."""
    return parallel.local_pool(workers, SWEEP_PRELOAD)


def open_executor(workers: int | None = None, scheduler: str | None = None):
    """:func:`synth.synthesis.parallel.open_executor` with the sweep's modules preloaded."""
    return parallel.open_executor(workers, scheduler, SWEEP_PRELOAD)
