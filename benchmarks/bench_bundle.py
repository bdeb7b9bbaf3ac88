"""Bundle quality: what `synth pareto` bundles at each size, against the limit and the runtime's own baselines.

For each topology x collective this runs the library entry point of `synth pareto` (:func:`synth.sweep.run.run_sweep`)
over a size grid, once with `synth solve`'s plans in the pool (the default) and, with ``--compare``, once without
(``--no-solve``: the step frontier, an alpha-beta schedule per size, the baselines). Per size it reports:

- ``chosen``: the winning algorithm; ``sim_us``: its written file's simulated time (the figure the bundle reports);
- ``pct_limit``: limit / simulated time (``synth.bounds.physical``);
- ``base_us``/``ratio``: the fastest baseline the runtime runs at that size, and ours against it;
- ``old_pct``/``old_chosen``: the same without the solves (``--compare``);
- ``wall_s``: the whole sweep's wall time (on the size grid's first row of each sweep).

Usage::

    python benchmarks/bench_bundle.py                                  # dgx1, every collective, 1KB:1GB
    python benchmarks/bench_bundle.py --topologies dgx1 ring-8 --collectives allgather broadcast --compare
    python benchmarks/bench_bundle.py --sizes 1MB:1GB --size-factor 2

Writes ``benchmarks/results/bundle.json`` (``--out NAME`` for another name); the JSON is rewritten after every sweep.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

from synth.model.collectives import COLLECTIVES  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from synth.solver.highs import SolverOptions  # noqa: E402
from synth.sweep.frontier import plan_sweep  # noqa: E402
from synth.sweep.run import SweepRequest, run_sweep  # noqa: E402
from synth.sweep.sizes import parse_size_range, size_grid  # noqa: E402
from synth.units import format_size  # noqa: E402


class _Quiet:
    """The sweep's events, dropped (the benchmark prints a line per sweep)."""

    def start(self, instance) -> None:
        pass

    def point(self, point) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def sweep(topology, collective: str, grid: tuple[int, ...], use_solve: bool, time_limit_s: float,
          max_chunks: int) -> tuple[dict, float]:
    """Per size, (chosen label, simulated us, limit us, best runnable baseline us); and the wall time (s)."""
    options = SolverOptions(time_limit_s=time_limit_s)
    spec = plan_sweep(topology, collective, None, max_chunks, None, options, True)
    t0 = time.perf_counter()
    outcome = run_sweep(SweepRequest(topology, spec, grid, options, workers=1, use_solve=use_solve), _Quiet())
    wall = time.perf_counter() - t0
    labels = {a.key: a.label for a in outcome.pool.algorithms}
    out = {}
    for c in outcome.plan.choices:
        chosen = c.timing(c.chosen) if c.chosen else None
        base = c.timing(c.best_baseline) if c.best_baseline else None
        out[c.size_bytes] = (labels.get(c.chosen, "-"), chosen.time_us if chosen else None, c.limit_us,
                             base.time_us if base else None, labels.get(c.best_baseline, "-"))
    return out, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", nargs="*", default=["dgx1"], help="names, NAME:K for K nodes")
    parser.add_argument("--collectives", nargs="*", default=list(COLLECTIVES))
    parser.add_argument("--sizes", default="1KB:1GB")
    parser.add_argument("--size-factor", type=int, default=4)
    parser.add_argument("--compare", action="store_true", help="also sweep without synth solve's plans")
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver limit per instance, seconds")
    parser.add_argument("--max-chunks", type=int, default=8, help="the step frontier's chunk cap")
    parser.add_argument("--out", default="bundle")
    args = parser.parse_args()
    grid = size_grid(*parse_size_range(args.sizes), args.size_factor)
    rows = []
    for spec in args.topologies:
        name, _, nodes = spec.partition(":")
        topology = load_topology(name, int(nodes or 1))
        for collective in args.collectives:
            new, wall = sweep(topology, collective, grid, True, args.time_limit, args.max_chunks)
            old, old_wall = (sweep(topology, collective, grid, False, args.time_limit, args.max_chunks)
                             if args.compare else ({}, None))
            for k, size in enumerate(grid):
                chosen, sim, limit, base, base_label = new[size]
                row = {"topology": topology.name, "collective": collective, "size": format_size(size),
                       "chosen": chosen[:30], "sim_us": None if sim is None else round(sim, 3),
                       "pct_limit": None if sim is None or limit is None else round(100 * limit / sim, 2),
                       "baseline": base_label[:26], "base_us": None if base is None else round(base, 3),
                       "ratio": None if base is None or sim is None else round(base / sim, 3)}
                if args.compare:
                    o_chosen, o_sim, _, _, _ = old[size]
                    row.update(old_chosen=o_chosen[:26],
                               old_pct=None if o_sim is None or limit is None else round(100 * limit / o_sim, 2))
                row.update(wall_s=round(wall, 1) if k == 0 else None,
                           old_wall_s=round(old_wall, 1) if k == 0 and old_wall is not None else None)
                rows.append(row)
            print(f"{topology.name:>18} {collective:>13}: {wall:.1f} s"
                  + (f" ({old_wall:.1f} s without the solves)" if old_wall is not None else ""),
                  file=sys.stderr, flush=True)
            path = write_json(args.out, rows)
    columns = ["topology", "collective", "size", "chosen", "sim_us", "pct_limit", "baseline", "base_us", "ratio"]
    columns += ["old_chosen", "old_pct"] if args.compare else []
    print_table(rows, columns + ["wall_s", "old_wall_s"] if args.compare else columns + ["wall_s"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
