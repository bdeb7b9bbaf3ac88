"""Measure point-to-point latency and bandwidth between local ranks with torch.distributed (``synth profile run``).

Every unordered pair of ranks (a, b) in turn plays ping-pong while the other ranks wait at a barrier: rank a
sends ``size`` bytes to b, b sends them back, and half the round trip is one one-way sample. After
``warmup`` untimed round trips (at the largest size, then at each size), the fastest of ``iters`` samples per size is kept (on a shared host the
median is dominated by other processes' scheduling; the fastest sample is the link's capability), and
``t = alpha + size / bw`` is fitted to those times with :func:`backends.nccl.nccl_tests.fit_line` (relative least squares). The result is a
single-node topology with one bidirectional link per pair (alpha in us, bandwidth in GB/s).

Backends: ``gloo`` measures CPU processes over loopback (useful to test the pipeline, not a GPU fabric);
``nccl`` measures GPU ``cuda:rank`` to ``cuda:rank'`` when the machine has at least ``nprocs`` GPUs.
``auto`` picks ``nccl`` in that case and ``gloo`` otherwise.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

from synth.errors import InputError, SynthError
from backends.nccl.nccl_tests import BYTES_PER_US_PER_GBPS, fit_line
from synth.model.topology import FORMAT, topology_from_dict
from synth.runtime.launch import require_torch, run_ranks

DEFAULT_SIZES = tuple(1 << k for k in range(10, 25, 2))   # 1 KiB .. 16 MiB
BACKENDS = ("auto", "gloo", "nccl")
MAX_SIZE_BYTES = 1 << 30


@dataclass(frozen=True)
class PairProfile:
    """Measured one-way times of the pair (a, b) and the fitted alpha (us) and bandwidth (GB/s)."""

    a: int
    b: int
    sizes: tuple[int, ...]
    times_us: tuple[float, ...]
    alpha_us: float
    bw_GBps: float
    rel_rms_error: float

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "sizes": list(self.sizes), "times_us": list(self.times_us),
                "alpha_us": self.alpha_us, "bw_GBps": self.bw_GBps, "rel_rms_error": self.rel_rms_error}


@dataclass(frozen=True)
class ProfileResult:
    """All pairs of one run, with the backend actually used."""

    nprocs: int
    backend: str
    pairs: tuple[PairProfile, ...]

    def topology_dict(self, name: str | None = None) -> dict:
        """The measured machine in the topology JSON format (one node, a bidirectional link per pair)."""
        links = [{"src": p.a, "dst": p.b, "alpha_us": round(p.alpha_us, 4), "bw_GBps": round(p.bw_GBps, 4),
                  "bidirectional": True} for p in self.pairs]
        return {"format": FORMAT, "name": name or f"profiled-{self.backend}-{self.nprocs}",
                "description": f"measured by synth profile run: {self.backend} ping-pong between {self.nprocs} "
                               f"local processes on {platform.node() or 'this host'}",
                "ranks": self.nprocs, "gpus_per_node": self.nprocs, "links": links}


def resolve_backend(backend: str, nprocs: int) -> str:
    """``auto`` -> ``nccl`` when there are at least ``nprocs`` GPUs, else ``gloo``."""
    torch = require_torch("synth profile run")
    if backend not in BACKENDS:
        raise InputError("--backend", "", f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= nprocs
    if backend == "auto":
        return "nccl" if has_gpus else "gloo"
    if backend == "nccl" and not has_gpus:
        raise InputError("--backend", "", f"nccl needs {nprocs} GPUs but this machine has "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}; use --backend gloo")
    return backend


def profile_pairs(nprocs: int, backend: str = "auto", sizes=DEFAULT_SIZES, iters: int = 10, warmup: int = 2,
                  timeout_s: float = 300.0) -> ProfileResult:
    """Ping-pong every pair of ``nprocs`` local ranks at every size (bytes) and fit alpha and bandwidth."""
    if nprocs < 2:
        raise InputError("--nprocs", "", "needs at least 2 processes to measure a pair")
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if len(sizes) < 2 or sizes[0] < 1 or sizes[-1] > MAX_SIZE_BYTES:
        raise InputError("--sizes", "", f"give at least two distinct sizes between 1 byte and {MAX_SIZE_BYTES}")
    if iters < 1 or warmup < 0:
        raise InputError("--iters", "", "must be at least 1")
    backend = resolve_backend(backend, nprocs)
    outcomes = run_ranks(_pingpong_rank, nprocs, (sizes, iters, warmup, backend), backend=backend,
                         timeout_s=timeout_s)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SynthError(f"profiling failed on rank {failed[0].rank}: {failed[0].error}")
    pairs = []
    for o in outcomes:
        for a, b, times in o.value:
            try:
                line = fit_line(sizes, times)
            except ValueError as exc:
                raise SynthError(f"the measurements of ranks {a} and {b} cannot be fitted ({exc}): the host is too "
                                 "noisy at these sizes; measure larger --sizes or more --iters") from None
            pairs.append(PairProfile(a, b, sizes, tuple(times), line.intercept_us,
                                     1.0 / line.slope_us_per_byte / BYTES_PER_US_PER_GBPS, line.rel_rms_error))
    pairs.sort(key=lambda p: (p.a, p.b))
    result = ProfileResult(nprocs, backend, tuple(pairs))
    topology_from_dict(result.topology_dict(), "synth profile run")  # the output must load
    return result


def _pingpong_rank(rank: int, nprocs: int, sizes, iters: int, warmup: int, backend: str) -> list:
    """Child process body: take part in every pair's ping-pong; rank a of each pair returns its times (us)."""
    import torch
    import torch.distributed as dist
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda *a: None)
    measured = []
    for a in range(nprocs):
        for b in range(a + 1, nprocs):
            if rank in (a, b):
                peer = b if rank == a else a
                big = torch.zeros(sizes[-1], dtype=torch.uint8, device=device)
                for _ in range(warmup):  # the largest size first: wakes the connection up
                    _round_trip(dist, big, peer, rank == a)
                best = []
                for size in sizes:
                    buf = torch.zeros(size, dtype=torch.uint8, device=device)
                    samples = []
                    for it in range(warmup + iters):
                        start = time.perf_counter()
                        _round_trip(dist, buf, peer, rank == a)
                        sync()
                        if it >= warmup:
                            samples.append((time.perf_counter() - start) * 1e6 / 2)
                    best.append(min(samples))
                if rank == a:
                    measured.append((a, b, best))
            dist.barrier()
    return measured


def _round_trip(dist, buf, peer: int, first: bool) -> None:
    if first:
        dist.send(buf, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)
