"""Candidate algorithms for the per-size choice (:mod:`synth.sweep.sizes`), from every source.

- the step frontier's points (:mod:`synth.sweep.frontier`);
- the fastest NCCL-style baseline at each size, and the fastest the runtime runs there
  (:mod:`synth.synthesis.baselines`);
- the plan ``synth solve`` writes at each size (:mod:`synth.synthesis.solve`: tree packing, the compositions, the
  alpha-beta formulations), with that search's alpha-beta schedule;
- or, without those solves, an alpha-beta schedule synthesized at each size (:mod:`synth.synthesis.alphabeta`);
- for an Allreduce or Alltoall where alphas bind, every rank's whole input gathered, then summed or picked from
  (:mod:`synth.synthesis.gathered`).

A source that fails for one size (a :class:`~synth.errors.SynthError`, e.g. no baseline applies) is recorded in
:attr:`AlgorithmPool.failures` and the others go on. Alpha-beta solves run through the same executor as the sweep.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from backends.msccl.ir import safe_name
from synth.errors import SynthError
from synth.model.sketch import load_sketch
from synth.model.topology import Topology
from synth.solver.highs import SolverOptions, Status
from synth.sweep.frontier import SweepPoint
from synth.sweep.sizes import ALPHA_BETA, BASELINE, GATHERED, SOLVED, STEPS, Algorithm, AlgorithmKind
from synth.synthesis.alphabeta import synthesize_alpha_beta
from synth.synthesis.baselines import BaselineTable, evaluate_baselines
from synth.synthesis.gathered import gathered_schedules
from synth.synthesis.sketched import sketch_violation
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
    """The fastest baseline at each size and the fastest one the runtime runs at power-of-two sizes (the two
    differ where, say, six rings make nchunksperloop 96); :func:`collect_algorithms` deduplicates."""
    out: list[Algorithm] = []
    for size in sizes:
        try:
            out += _size_baselines(evaluate_baselines(collective, topology, size, root), size)
        except SynthError as exc:
            failures.append(SourceFailure(BASELINE, size, str(exc)))
    return out


def _size_baselines(table: BaselineTable, size: int, also=()) -> list[Algorithm]:
    """The fastest run of one size's baseline table, when the runtime would not run that one the fastest it would,
    and the runs whose schedules are in ``also``; raises SynthError when no baseline applies."""
    runs = [table.best()]
    if not runs[0].runnable:
        try:
            runs.append(table.best(runnable_only=True))
        except SynthError:
            pass
    runs += [r for r in table.runs if any(r.schedule is schedule for schedule in also)]
    return [Algorithm(f"baseline-{run.name}-c{run.schedule.collective.chunks_per_rank}", BASELINE,
                      f"baseline {run.name} (c{run.schedule.collective.chunks_per_rank})", run.schedule, size)
            for run in runs]


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


def solved_algorithms(collective: str, topology: Topology, sizes: Iterable[int], root: int | None, method: str,
                      sketch: str | None, target: str, options: SolverOptions, failures: list[SourceFailure],
                      use_alpha_beta: bool = True, use_baselines: bool = True,
                      note: Callable[[str], None] = lambda text: None) -> tuple[list[Algorithm], list[int]]:
    """At each size, what ``synth solve`` weighs (:func:`synth.synthesis.solve.solve`: tree packing, the
    compositions, the alpha-beta formulations, the runtime's own baselines, each written and simulated): the plan
    it writes, its alpha-beta schedule (``use_alpha_beta``) and, from the baseline table it built, the baselines
    :func:`baseline_algorithms` takes (``use_baselines``), for :func:`collect_algorithms` to deduplicate; and the
    sizes whose search made no alpha-beta schedule (at the limit already, or flat searches left out at scale).
    Without this the bundle missed what ``synth solve`` writes at the same size (dgx1 Allgather 1 GB: 93.3% of the
    limit, where the tree packing reaches 99.5%). ``note`` hears each size's search phases."""
    from synth.synthesis.request import SynthesisRequest
    from synth.synthesis.solve import solve

    out: list[Algorithm] = []
    baselines: list[Algorithm] = []
    without_alpha_beta = []
    for size in sizes:
        label = format_size(size)
        request = SynthesisRequest(topology, collective, size, root, method, sketch, options=options,
                                   include_baselines=use_baselines, target=target)
        try:
            solution = solve(request, progress=lambda text: note(f"{label}: {text.strip()}")
                             if not text.startswith("    ") else None)
        except SynthError as exc:
            failures.append(SourceFailure(SOLVED, size, str(exc)))
            solution = None
        if use_baselines:     # from the table the solve built, with the one whose file it found fastest
            written = () if solution is None or solution.baseline is None else (
                solution.baseline.candidate.result.schedule,)
            try:
                baselines += _size_baselines(request.baselines, size, written)
            except SynthError as exc:
                failures.append(SourceFailure(BASELINE, size, str(exc)))
        if solution is None:
            continue
        chosen = solution.chosen.candidate
        alpha_beta = next((c for c in solution.candidates if c.label.startswith("alpha-beta")), None)
        if alpha_beta is None:
            without_alpha_beta.append(size)
        if use_alpha_beta and alpha_beta is not None:
            out.append(Algorithm(f"alphabeta-{label}", ALPHA_BETA,
                                 f"alpha-beta @{label} (c{alpha_beta.result.chunks})", alpha_beta.result.schedule,
                                 size))
        if chosen.result.status != Status.BASELINE:     # (an alpha-beta choice stays that kind: the first is kept)
            out.append(Algorithm(f"solved-{safe_name(chosen.label)}-{label}", SOLVED, f"{chosen.label} @{label}",
                                 chosen.result.schedule, size))
    return out + baselines, without_alpha_beta


def _capture(fn):
    try:
        return fn(), None
    except SynthError as exc:
        return None, str(exc)


def collect_algorithms(frontier: Iterable[SweepPoint], collective: str, topology: Topology, sizes: Iterable[int],
                       root: int | None = None, use_baselines: bool = True, use_alpha_beta: bool = True,
                       method: str = "auto", sketch: str | None = None, options: SolverOptions = SolverOptions(),
                       executor: cf.Executor | None = None,
                       on_done: Callable[[int], None] | None = None, use_solve: bool = False,
                       target: str = "executor", note: Callable[[str], None] = lambda text: None) -> AlgorithmPool:
    """Every candidate algorithm for the per-size choice; ``use_solve``: also what ``synth solve`` writes at each
    size (:func:`solved_algorithms`), whose search gives the alpha-beta schedule (not solved twice) except where
    it skipped it; there it is synthesized on its own, as without the solves: one made for a large size can win
    at a smaller one (dgx1 ReduceScatter 1 MB: the schedule made for 256 MB, 93.4% of the limit, where the tree
    packing skips the alpha-beta search)."""
    sizes = list(sizes)
    failures: list[SourceFailure] = []
    algorithms = step_algorithms(frontier)
    if use_baselines and not use_solve:     # (the solves take them from the tables they build)
        algorithms += baseline_algorithms(collective, topology, sizes, root, failures)
    algorithms += gathered_algorithms(collective, topology, sizes)
    alpha_beta_sizes = sizes
    if use_solve:
        solved, alpha_beta_sizes = solved_algorithms(collective, topology, sizes, root, method, sketch, target,
                                                     options, failures, use_alpha_beta, use_baselines, note)
        algorithms += solved
    if use_alpha_beta and alpha_beta_sizes:
        algorithms += alpha_beta_algorithms(collective, topology, alpha_beta_sizes, root, method, sketch, options,
                                            failures, executor, on_done)
    if sketch is not None:
        algorithms = _keeping_to_sketch(algorithms, sketch, topology, note)
    return AlgorithmPool(_deduplicated(algorithms), tuple(failures))


def _keeping_to_sketch(algorithms: list[Algorithm], sketch: str, topology: Topology,
                       note: Callable[[str], None]) -> list[Algorithm]:
    """Under a sketch, the step frontier's and the gathered schedules (made without it) compete only where they
    keep to it, as every candidate of ``synth solve`` does (:mod:`synth.synthesis.sketched`); the baselines stay,
    the runtime's own choice to fall back to."""
    rules = load_sketch(sketch, topology)
    kept = [a for a in algorithms if a.kind not in (STEPS, GATHERED)
            or sketch_violation(rules, topology, a.schedule) is None]
    if len(kept) < len(algorithms):
        note(f"{len(algorithms) - len(kept)} step or gathered algorithm(s) left out: they do not keep to the "
             f"sketch {rules.name}")
    return kept


def _deduplicated(algorithms: list[Algorithm]) -> tuple[Algorithm, ...]:
    """The first algorithm of each schedule (sources overlap: the same baseline is the fastest at several sizes),
    with unique keys (a second one made for another size is named after it)."""
    seen: set = set()
    keys: set = set()
    out = []
    for alg in algorithms:
        if alg.schedule in seen:
            continue
        seen.add(alg.schedule)
        if alg.key in keys:
            alg = replace(alg, key=f"{alg.key}-{format_size(alg.tuned_bytes or 0)}")
        keys.add(alg.key)
        out.append(alg)
    return tuple(out)
