"""Candidate algorithms for the per-size choice (:mod:`synth.sweep.sizes`), from every source.

- the step frontier's points (:mod:`synth.sweep.frontier`);
- the fastest NCCL-style baseline at each size (:mod:`synth.synthesis.baselines`);
- an alpha-beta schedule synthesized at each size (:mod:`synth.synthesis.alphabeta`);
- for an Allreduce or Alltoall where alphas bind, every rank's whole input gathered, then summed or picked from
  (:mod:`synth.synthesis.gathered`).

A source that fails for one size (a :class:`~synth.errors.SynthError`, e.g. no baseline applies) is recorded in
:attr:`AlgorithmPool.failures` and the others go on. Alpha-beta solves run through the same executor as the sweep.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Callable, Iterable

from synth.errors import SynthError
from synth.model.topology import Topology
from synth.solver.highs import SolverOptions
from synth.sweep.frontier import SweepPoint
from synth.sweep.sizes import ALPHA_BETA, BASELINE, GATHERED, STEPS, Algorithm, AlgorithmKind
from synth.synthesis.alphabeta import synthesize_alpha_beta
from synth.synthesis.baselines import best_baseline
from synth.synthesis.gathered import gathered_schedules
from synth.units import format_size


@dataclass(frozen=True)
class SourceFailure:
    """A source that produced nothing at one size, and why."""

    source: AlgorithmKind
    size_bytes: int
    message: str

    def to_dict(self) -> dict:
        return {"source": self.source.value, "size_bytes": self.size_bytes, "message": self.message}


@dataclass(frozen=True)
class AlgorithmPool:
    """The algorithms found for the per-size choice, and the failures of their sources."""

    algorithms: tuple[Algorithm, ...]
    failures: tuple[SourceFailure, ...]


def step_algorithms(frontier: Iterable[SweepPoint]) -> list[Algorithm]:
    """One algorithm per frontier point with a schedule."""
    out = []
    for p in frontier:
        if p.schedule is not None:
            out.append(Algorithm(f"steps-{p.steps}-{p.rounds}-{p.chunks}", STEPS,
                                 f"steps ({p.steps},{p.rounds},{p.chunks})", p.schedule))
    return out


def baseline_algorithms(collective: str, topology: Topology, sizes: Iterable[int], root: int | None,
                        failures: list[SourceFailure]) -> list[Algorithm]:
    """The fastest baseline at each size, deduplicated."""
    out: dict = {}
    for size in sizes:
        try:
            best = best_baseline(collective, topology, size, root)
        except SynthError as exc:
            failures.append(SourceFailure(BASELINE, size, str(exc)))
            continue
        name, schedule = best.name, best.schedule
        if schedule in out:
            continue
        chunks = schedule.collective.chunks_per_rank
        key = f"baseline-{name}-c{chunks}"
        if any(a.key == key for a in out.values()):
            key += f"-{format_size(size)}"       # same baseline, order tuned for another size
        out[schedule] = Algorithm(key, BASELINE, f"baseline {name} (c{chunks})", schedule, size)
    return list(out.values())


def gathered_algorithms(collective: str, topology: Topology, sizes: Iterable[int]) -> list[Algorithm]:
    """The gathered Allreduce or Alltoall over every Allgather baseline, at each size where it is offered (the
    latency bound binds), deduplicated: the fastest replay is not always the fastest file, and the per-size choice
    times them in replay order, so the slower ones cost only their replay."""
    out: dict = {}
    for size in sizes:
        for found in gathered_schedules(topology, collective, size):
            if found.schedule in out:
                continue
            key = f"gathered-{found.baseline.replace('/', '-')}"
            if any(a.key == key for a in out.values()):
                key += f"-{format_size(size)}"       # same baseline, order tuned for another size
            out[found.schedule] = Algorithm(key, GATHERED, f"gathered over {found.baseline}", found.schedule, size)
    return list(out.values())


def solve_alpha_beta(topology: Topology, collective: str, size_bytes: int, method: str, sketch: str | None,
                     root: int | None, options: SolverOptions):
    """One alpha-beta synthesis (top level, so process pools and Dask can pickle it)."""
    return synthesize_alpha_beta(topology, collective, size_bytes, method, sketch, None, root, options)


def alpha_beta_algorithms(collective: str, topology: Topology, sizes: Iterable[int], root: int | None,
                          method: str, sketch: str | None, options: SolverOptions, failures: list[SourceFailure],
                          executor: cf.Executor | None = None,
                          on_done: Callable[[int], None] | None = None) -> list[Algorithm]:
    """An alpha-beta schedule synthesized at each size."""
    sizes = list(sizes)
    args = [(topology, collective, size, method, sketch, root, options) for size in sizes]
    if executor is None:
        outcomes = []
        for a in args:
            outcomes.append(_capture(lambda a=a: solve_alpha_beta(*a)))
            if on_done:
                on_done(a[2])
    else:
        futures = {executor.submit(solve_alpha_beta, *a): a[2] for a in args}
        done: dict = {}
        for future in cf.as_completed(futures):
            done[futures[future]] = _capture(future.result)
            if on_done:
                on_done(futures[future])
        outcomes = [done[s] for s in sizes]
    out = []
    for size, (result, error) in zip(sizes, outcomes):
        if error is not None:
            failures.append(SourceFailure(ALPHA_BETA, size, error))
            continue
        if any(a.schedule == result.schedule for a in out):
            continue
        out.append(Algorithm(f"alphabeta-{format_size(size)}", ALPHA_BETA,
                             f"alpha-beta @{format_size(size)} (c{result.chunks})", result.schedule, size))
    return out


def _capture(fn):
    try:
        return fn(), None
    except SynthError as exc:
        return None, str(exc)


def collect_algorithms(frontier: Iterable[SweepPoint], collective: str, topology: Topology, sizes: Iterable[int],
                       root: int | None = None, use_baselines: bool = True, use_alpha_beta: bool = True,
                       method: str = "auto", sketch: str | None = None, options: SolverOptions = SolverOptions(),
                       executor: cf.Executor | None = None,
                       on_done: Callable[[int], None] | None = None) -> AlgorithmPool:
    """Every candidate algorithm for the per-size choice."""
    sizes = list(sizes)
    failures: list[SourceFailure] = []
    algorithms = step_algorithms(frontier)
    if use_baselines:
        algorithms += baseline_algorithms(collective, topology, sizes, root, failures)
    algorithms += gathered_algorithms(collective, topology, sizes)
    if use_alpha_beta:
        algorithms += alpha_beta_algorithms(collective, topology, sizes, root, method, sketch, options, failures,
                                            executor, on_done)
    return AlgorithmPool(tuple(algorithms), tuple(failures))
