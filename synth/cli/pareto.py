"""``synth pareto``: the (steps, rounds, chunks) frontier, the best algorithm per size, and an MSCCL bundle.

Thin: the search is :mod:`synth.sweep.frontier`, candidates :mod:`synth.sweep.sources`, the per-size choice and the bundle
:mod:`synth.sweep.sizes` / :mod:`synth.sweep.bundle`, workers :mod:`synth.sweep.workers`. Progress goes to stderr, tables (or
``--json``) to stdout. ``frontier.json`` is rewritten atomically after every instance, so Ctrl-C keeps what was
found.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from synth.model.collectives import COLLECTIVES, normalize_name
from synth.units import format_size
from synth.cli._common import (MAX_CHUNKS, MAX_STEPS, MAX_TIME_LIMIT_S, FiniteFloat, check_output_dir, check_root,
                               check_workers, is_tty, nodes_option, solver_options_for, workers_options)
from synth.synthesis.method import Method
from synth.model.topology import MAX_RANKS

_SIZES_HELP = ("Size range LOW:HIGH (nccl-tests' sizes, e.g. 1KB:1GB) for the per-size choice and the bundle; "
               "'none' stops after the step frontier.")


# A sweep solves many instances: a shorter per-instance limit than `synth solve`.
_solver_options = solver_options_for(
    10.0, "Solver limit per instance in seconds; an instance that hits it is 'no-solution' and the frontier is then "
          "not proven.", "Solver threads per instance (default: HiGHS' choice).")


class _Progress:
    """One status line on stderr: current instance, incumbent, elapsed time (a line per event off a TTY)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.tty = is_tty()
        self.t0 = time.perf_counter()
        self.count = 0
        self.best = None

    def _show(self, text: str, final: bool = False) -> None:
        if not self.enabled:
            return
        line = f"[{time.perf_counter() - self.t0:7.1f}s] {text}"
        if self.tty:
            click.echo(f"\r\x1b[K{line}", err=True, nl=final)
        elif final:
            click.echo(line, err=True)

    @property
    def incumbent(self) -> str:
        """The feasible point with the smallest rounds per chunk so far."""
        return "none" if self.best is None else f"{self.best.instance} R/C={self.best.ratio}"

    def start(self, inst) -> None:
        self._show(f"solving {inst}  | incumbent {self.incumbent} | {self.count} instances")

    def point(self, point) -> None:
        self.count += 1
        if point.feasible and (self.best is None or point.ratio < self.best.ratio):
            self.best = point
        self._show(f"{point.instance} {point.status} ({point.how}, {point.wall_seconds:.2f} s)  | incumbent "
                   f"{self.incumbent} | {self.count} instances", final=not self.tty)

    def note(self, text: str) -> None:
        self._show(text, final=True)

    def done(self) -> None:
        if self.enabled and self.tty:
            click.echo("", err=True)


def _frontier_table(frontier) -> None:
    spec = frontier.spec
    state = "complete" if frontier.complete else "NOT proven complete"
    click.echo(f"Step frontier of {spec.collective} ({state}: {frontier.stop_reason}; {len(frontier.points)} "
               f"instances in {frontier.seconds:.2f} s; R/C lower bound {spec.rounds_per_chunk_lower:.4g})")
    click.echo(f"  {'steps':>5} {'rounds':>6} {'chunks':>6} {'R/C':>8}  status")
    for p in frontier.frontier:
        click.echo(f"  {p.steps:>5} {p.rounds:>6} {p.chunks:>6} {str(p.ratio):>8}  {p.solver_status}")


def _size_table(plan, algorithms) -> None:
    labels = {a.key: a.label for a in algorithms}
    click.echo("\nBest algorithm per size (simulated time of its written file; limit from synth.bounds.physical)")
    click.echo(f"  {'size':>7}  {'chosen':34} {'time_us':>12} {'algbw':>8}  {'best baseline':30} {'time_us':>12} "
               f"{'speedup':>7} {'%limit':>6}")
    for c in plan.choices:
        t = c.timing(c.chosen) if c.chosen else None
        b = c.timing(c.best_baseline) if c.best_baseline else None
        chosen = labels.get(c.chosen, "NCCL (nothing runs)") if c.chosen else "NCCL (nothing runs)"
        speed = f"{b.time_us / t.time_us:7.2f}" if t and b else f"{'':7}"
        base = labels.get(c.best_baseline, "none runs here")[:30]
        pct = f"{100 * c.limit_us / t.time_us:6.1f}" if t and c.limit_us else f"{'':6}"
        click.echo(f"  {format_size(c.size_bytes):>7}  {chosen[:34]:34} {t.time_us if t else float('nan'):12.3f} "
                   f"{t.algbw_GBps if t else float('nan'):8.3f}  {base:30} "
                   f"{b.time_us if b else float('nan'):12.3f} {speed} {pct}")
    click.echo("  (best baseline: the fastest the MSCCL runtime runs at that size, whose element count is a "
               "multiple of its nchunksperloop)")
    click.echo("\nBundle (inclusive byte ranges)")
    for f in plan.files:
        click.echo(f"  msccl/{f.file_name}  {f.min_bytes}..{f.max_bytes}  {labels.get(f.key, f.key)}")
    for key, reason in plan.excluded:
        click.echo(f"  excluded {key}: {reason}")


@click.command("pareto")
@click.argument("collective", type=click.Choice(COLLECTIVES + ("reduce_scatter",), case_sensitive=False),
                metavar="COLLECTIVE")
@click.option("--topology", "-t", required=True, help="Built-in topology name (see `synth topo list`) or JSON file.")
@nodes_option("Compose this many copies of a single-node topology through their NICs.")
@click.option("--sketch", default=None, help="Sketch (name or JSON file) for the alpha-beta formulation.")
@click.option("--root", type=click.IntRange(0, MAX_RANKS - 1), default=None,
              help="Root rank for rooted collectives (default 0).")
@click.option("--max-steps", type=click.IntRange(1, MAX_STEPS), default=None,
              help="Largest step count searched (default: the hop lower bound + 4).")
@click.option("--max-chunks", type=click.IntRange(1, MAX_CHUNKS), default=8, show_default=True,
              help="Largest chunks per rank C searched; the frontier is exact within this cap.")
@click.option("--budget", type=FiniteFloat(0.0, MAX_TIME_LIMIT_S), default=None,
              help="Stop the step sweep after this many seconds (the frontier is then not proven).")
@click.option("--no-symmetry", is_flag=True, help="Solve the full models only (slower; for cross-checking).")
@click.option("--sizes", default="1KB:1GB", show_default=True, help=_SIZES_HELP)
@click.option("--size-factor", type=click.Choice(["2", "4"]), default="4", show_default=True,
              help="Sizes evaluated: LOW times powers of this factor.")
@click.option("--baselines/--no-baselines", default=True, show_default=True,
              help="Include NCCL-style baselines (synth.synthesis.baselines) as candidates.")
@click.option("--alpha-beta/--no-alpha-beta", default=True, show_default=True,
              help="Include an alpha-beta schedule synthesized at each size (synth.synthesis.alphabeta) as candidates.")
@click.option("--solve/--no-solve", "use_solve", default=True, show_default=True,
              help="Include the plan `synth solve` writes at each size (tree packing, compositions, alpha-beta, "
                   "the runtime's own baselines: its fastest simulated file) as candidates; its search also gives "
                   "the alpha-beta schedules.")
@click.option("--method", type=click.Choice([Method.AUTO.value, Method.ROUTED.value, Method.TIMEXP.value]),
              default="auto", show_default=True,
              help="Alpha-beta formulation (with --solve, routed or timexp limits its search to that one).")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Directory for frontier.json, frontier.png/.svg, README.txt and the msccl/ bundle.")
@workers_options("the solves", "Local worker processes (default: one per CPU; 1 solves in this process).")
@click.option("--target", type=click.Choice(["executor", "legacy"]), default="executor", show_default=True,
              help="MSCCL runtime of the bundle: the executor in NCCL >= 2.23, or the legacy MSCCL fork.")
@click.option("--proto", type=click.Choice(["Simple", "LL", "LL128"]), default="Simple", show_default=True,
              help="NCCL protocol written into the XML.")
@click.option("--json", "as_json", is_flag=True, help="Print frontier.json's content on stdout instead of tables.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@_solver_options
def pareto(collective, topology, nodes, fabric, oversubscription, sketch, root, max_steps, max_chunks, budget,
           no_symmetry, sizes, size_factor,
           baselines, alpha_beta, use_solve, method, output, workers, scheduler, target, proto, as_json, quiet,
           time_limit, mip_gap, threads, seed):
    """Explore the latency/bandwidth frontier of COLLECTIVE and bundle the best algorithm per size range.

    \b
    Examples:
      synth pareto allgather --topology dgx1 --sizes none
      synth pareto broadcast --topology dgx1 --max-chunks 16 --sizes none
      synth pareto allgather --topology ndv2 --nodes 2 --sizes 1KB:1GB -o out/
      synth pareto alltoall --topology dgx1 --scheduler tcp://10.0.0.5:8786 -o out/
    """
    from synth.sweep.sizes import parse_size_range, size_grid

    check_workers(workers, scheduler)
    name = normalize_name(collective)
    check_root(name, root)
    grid = None
    if sizes.strip().lower() != "none":
        low, high = parse_size_range(sizes)
        grid = tuple(size_grid(low, high, int(size_factor)))

    # the sweep's modules load the solver stack (a second or more): imported once the cheap checks passed
    from synth.model.topology import load_topology
    from synth.solver.highs import SolverOptions
    from synth.sweep.bundle import BUNDLE_DIR
    from synth.sweep.frontier import plan_sweep
    from synth.sweep.run import SweepRequest, run_sweep

    if output is not None:
        check_output_dir("-o", output, ("frontier.json", "README.txt", "frontier.png", "frontier.svg"), (BUNDLE_DIR,))
    topo = load_topology(topology, nodes, fabric, oversubscription)
    options = SolverOptions(time_limit_s=time_limit, mip_gap=mip_gap, threads=threads, seed=seed)
    spec = plan_sweep(topo, name, max_steps, max_chunks, root, options, not no_symmetry)
    out_dir = Path(output) if output else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)      # only once every input and option has been checked
    progress = _Progress(not quiet)
    progress.note(f"synth pareto: {name} on {topo.name} ({topo.num_ranks} ranks); steps {spec.min_steps}.."
                  f"{spec.max_steps}, chunks <= {spec.max_chunks}, R/C >= {spec.rounds_per_chunk_lower:.4g}")
    request = SweepRequest(topo, spec, grid, options, baselines, alpha_beta, method, sketch, target, proto, budget,
                           workers, scheduler, out_dir, use_solve)
    try:
        outcome = run_sweep(request, progress)
    finally:
        progress.done()
    if out_dir and outcome.plan is not None:
        progress.note(f"wrote {out_dir / 'frontier.json'} and {len(outcome.written) - 2} XML file(s) in "
                      f"{out_dir / 'msccl'} (README.txt says how to run them)")
        _plot(out_dir, outcome.plan, outcome.pool.algorithms, name, topo, progress)
    if as_json:
        click.echo(json.dumps(outcome.document, indent=1))
        return
    _frontier_table(outcome.frontier)
    if outcome.plan is not None:
        _size_table(outcome.plan, outcome.pool.algorithms)


def _plot(out_dir, plan, algorithms, name, topo, progress) -> None:
    from synth.sweep import plot

    if not plot.available():
        progress.note("no plot: matplotlib is not installed (pip install 'synth-collectives[plot]')")
        return
    paths = plot.plot_size_frontier(plan.choices, algorithms, out_dir / "frontier",
                                    f"{name} on {topo.name} ({topo.num_ranks} ranks)")
    progress.note("wrote " + ", ".join(str(p) for p in paths))
