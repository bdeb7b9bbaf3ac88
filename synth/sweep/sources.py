"""Candidate algorithms for the per-size choice (:mod:`synth.sweep.sizes`), from every source that is installed.

- the step frontier's points (:mod:`synth.sweep.frontier`), always;
- the fastest NCCL-style baseline at each size (:mod:`synth.synthesis.baselines`), when that module exists;
- an alpha-beta schedule synthesized at each size (:mod:`synth.synthesis.alphabeta`), when that module exists.

Each source that is missing (ImportError) contributes nothing and is named in :attr:`Candidates.missing`; a
source that fails for one size (a :class:`~synth.errors.SynthError`, e.g. no baseline applies) is recorded in
:attr:`Candidates.failures` and the others go on. Alpha-beta solves run through the same executor as the sweep.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
from dataclasses import dataclass
from typing import Callable, Iterable

from synth.errors import SynthError
from synth.sweep.frontier import SweepPoint
from synth.sweep.sizes import ALPHA_BETA, BASELINE, STEPS, Algorithm
from synth.solver.highs import SolverOptions
from synth.model.topology import Topology
from synth.units import format_size


@dataclass(frozen=True)
class Candidates:
    """Algorithms found, sources that are not installed, and (source, size, message) failures."""

    algorithms: tuple[Algorithm, ...]
    missing: tuple[str, ...]
    failures: tuple[tuple[str, int, str], ...]


def _optional(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def step_algorithms(frontier: Iterable[SweepPoint]) -> list[Algorithm]:
    """One algorithm per frontier point with a schedule."""
    out = []
    for p in frontier:
        if p.schedule is not None:
            out.append(Algorithm(f"steps-{p.steps}-{p.rounds}-{p.chunks}", STEPS,
                                 f"steps ({p.steps},{p.rounds},{p.chunks})", p.schedule))
    return out


def baseline_algorithms(collective: str, topology: Topology, sizes: Iterable[int], root: int | None,
                        failures: list) -> list[Algorithm] | None:
    """The fastest baseline at each size, deduplicated; None when :mod:`synth.synthesis.baselines` is not installed."""
    baselines = _optional("synth.synthesis.baselines")
    if baselines is None:
        return None
    out: dict = {}
    for size in sizes:
        try:
            best = baselines.best_baseline(collective, topology, size, root)
            name, schedule = best.name, best.schedule
        except SynthError as exc:
            failures.append((BASELINE, size, str(exc)))
            continue
        if schedule in out:
            continue
        chunks = schedule.collective.chunks_per_rank
        key = f"baseline-{name}-c{chunks}"
        if any(a.key == key for a in out.values()):
            key += f"-{format_size(size)}"       # same baseline, order tuned for another size
        out[schedule] = Algorithm(key, BASELINE, f"baseline {name} (c{chunks})", schedule, size)
    return list(out.values())


def solve_alpha_beta(topology: Topology, collective: str, size_bytes: int, method: str, sketch: str | None,
                     root: int | None, options: SolverOptions):
    """One alpha-beta synthesis (top level, so process pools and Dask can pickle it)."""
    from synth.synthesis.alphabeta import synthesize_alpha_beta

    return synthesize_alpha_beta(topology, collective, size_bytes, method, sketch, None, root, options)


def alpha_beta_algorithms(collective: str, topology: Topology, sizes: Iterable[int], root: int | None,
                          method: str, sketch: str | None, options: SolverOptions, failures: list,
                          executor: cf.Executor | None = None,
                          on_done: Callable[[int], None] | None = None) -> list[Algorithm] | None:
    """An alpha-beta schedule synthesized at each size; None when :mod:`synth.synthesis.alphabeta` is not installed."""
    if _optional("synth.synthesis.alphabeta") is None:
        return None
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
            failures.append((ALPHA_BETA, size, error))
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


def collect_candidates(frontier: Iterable[SweepPoint], collective: str, topology: Topology, sizes: Iterable[int],
                       root: int | None = None, use_baselines: bool = True, use_alpha_beta: bool = True,
                       method: str = "auto", sketch: str | None = None, options: SolverOptions = SolverOptions(),
                       executor: cf.Executor | None = None,
                       on_done: Callable[[int], None] | None = None) -> Candidates:
    """Every candidate algorithm for the per-size choice."""
    sizes = list(sizes)
    failures: list = []
    missing = []
    algorithms = step_algorithms(frontier)
    if use_baselines:
        found = baseline_algorithms(collective, topology, sizes, root, failures)
        if found is None:
            missing.append("synth.synthesis.baselines")
        else:
            algorithms += found
    if use_alpha_beta:
        found = alpha_beta_algorithms(collective, topology, sizes, root, method, sketch, options, failures,
                                      executor, on_done)
        if found is None:
            missing.append("synth.synthesis.alphabeta")
        else:
            algorithms += found
    return Candidates(tuple(algorithms), tuple(missing), tuple(failures))
