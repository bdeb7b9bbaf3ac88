"""``synth pareto`` as a library call: the step frontier, the per-size choice and the MSCCL bundle.

:func:`run_sweep` explores the (steps, rounds, chunks) frontier (:mod:`synth.sweep.frontier`) on the chosen
executor (:mod:`synth.sweep.workers`), collects every candidate algorithm per size (:mod:`synth.sweep.sources`),
chooses per size and tiles the range (:mod:`synth.sweep.bundle`), and writes ``frontier.json`` (rewritten after
every instance, so Ctrl-C keeps the points found), the bundle and its README into the output directory.
Progress reaches the caller through :class:`SweepEvents`; the library never prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from synth.bounds.physical import lower_bound
from synth.errors import NoSolutionError, SynthError
from synth.model.topology import Topology
from synth.solver.highs import SolverOptions
from synth.sweep.bundle import BundlePlan, frontier_document, plan_bundle, readme_text, write_bundle, write_document
from synth.sweep.frontier import Frontier, FrontierSearch, SweepPoint, SweepSpec, pareto_filter
from synth.sweep.sources import AlgorithmPool, collect_algorithms
from synth.sweep.workers import open_executor
from synth.units import format_size


class SweepEvents(Protocol):
    """What a sweep reports while it runs (the CLI shows it as a status line)."""

    def start(self, instance) -> None: ...

    def point(self, point: SweepPoint) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class SweepRequest:
    """A sweep: the frontier's spec, the sizes of the per-size choice (None: frontier only), which sources
    compete (``use_solve``: what ``synth solve`` writes at each size), the bundle's runtime and protocol, where to
    solve (``workers`` / Dask ``scheduler``), and the output directory (None: nothing written)."""

    topology: Topology
    spec: SweepSpec
    sizes: tuple[int, ...] | None
    options: SolverOptions
    use_baselines: bool = True
    use_alpha_beta: bool = True
    method: str = "auto"
    sketch: str | None = None
    target: str = "executor"
    proto: str = "Simple"
    budget_s: float | None = None
    workers: int | None = None
    scheduler: str | None = None
    out_dir: Path | None = None
    use_solve: bool = True


@dataclass(frozen=True)
class SweepOutcome:
    """The frontier, the candidate pool and bundle plan (with sizes), ``frontier.json``'s content, and the
    files written (frontier.json first, then the bundle)."""

    frontier: Frontier
    pool: AlgorithmPool | None
    plan: BundlePlan | None
    document: dict
    written: tuple[Path, ...]


def run_sweep(request: SweepRequest, events: SweepEvents) -> SweepOutcome:
    """Run the whole sweep; raises NoSolutionError when nothing at all was found."""
    topo, spec, grid, out_dir = request.topology, request.spec, request.sizes, request.out_dir
    t0 = time.perf_counter()

    def snapshot(points, search) -> Frontier:
        return Frontier(spec, tuple(points), pareto_filter(points), search.stop_reason, time.perf_counter() - t0)

    pool = plan = None
    with open_executor(request.workers, request.scheduler) as (executor, slots):
        search = FrontierSearch(topo, spec, request.budget_s)
        points: list[SweepPoint] = []
        for point in search.points(executor, slots, on_start=events.start):
            points.append(point)
            events.point(point)
            if out_dir:
                write_document(out_dir, frontier_document(snapshot(points, search), topo, "sweeping"))
        frontier = snapshot(points, search)
        if grid:
            if out_dir:
                write_document(out_dir, frontier_document(frontier, topo, "sizes"))
            events.note(f"frontier {' '.join(str(p.instance) for p in frontier.frontier) or 'empty'}; "
                        f"collecting candidates for {len(grid)} sizes")
            pool = collect_algorithms(frontier.frontier, spec.collective, topo, grid, spec.root,
                                      request.use_baselines, request.use_alpha_beta, request.method, request.sketch,
                                      request.options, executor,
                                      on_done=lambda size: events.note(f"alpha-beta at {format_size(size)} done"),
                                      use_solve=request.use_solve, target=request.target, note=events.note)
    if grid:
        if not pool.algorithms:
            raise NoSolutionError("no candidate algorithm at all (no frontier point, no baseline, no alpha-beta "
                                  "schedule); raise --max-steps or --time-limit")
        plan = plan_bundle(pool.algorithms, topo, list(grid), grid[0], grid[-1], request.target, request.proto,
                           _limit_us(spec.collective, topo, spec.root))
    document = frontier_document(frontier, topo, "done", plan, pool.algorithms if pool else (),
                                 pool.failures if pool else (), {"total_seconds": time.perf_counter() - t0})
    written: list[Path] = []
    if out_dir:
        write_document(out_dir, document)
        written.append(out_dir / "frontier.json")
        if plan is not None:
            readme = readme_text(plan, pool.algorithms, spec.collective, topo, request.target)
            written += [Path(p) for p in write_bundle(out_dir, plan, readme)]
    if not frontier.frontier and not grid:
        raise NoSolutionError(f"no feasible step schedule up to {spec.max_steps} steps; raise --max-steps or "
                              "--time-limit")
    return SweepOutcome(frontier, pool, plan, document, tuple(written))


def _limit_us(collective: str, topology: Topology, root: int | None):
    """The physical limit per size (us), or None where no bound can be computed (it only decorates tables)."""
    def limit(size: int) -> float | None:
        try:
            return lower_bound(collective, topology, size, root=root).limit_us
        except SynthError:
            return None
    return limit
