"""Plan quality: what `synth solve` writes, simulated as the runtime would run it, against the limit and the baselines.

For each collective x topology x size (nccl-tests' per-rank buffer; 1 GB = 2^30 bytes as `--size 1GB` reads it)
this runs the library entry point of `synth solve` (:func:`synth.synthesis.solve.solve`) and reports:

- ``sim_us``: the written file's simulated time (runtime FIFO depth, switch-port sharing), the figure `solve`
  prints; ``plan_us``: the schedule's own replay; ``plan_vs_sim_pct``: how far the plan's claim is off;
- ``pct_limit``: limit / simulated time (``synth.bounds.physical``: bandwidth, or at small sizes the direct
  bound, which counts the bytes that cannot be relayed in time); ``pct_alpha``: the alpha diameter / simulated
  time (the issue's 1 KB yardstick, which ignores those bytes);
- ``baseline``/``base_us``/``ratio``: the best runnable baseline's simulated time and ours against it (>= 1.00 means
  never slower than what the runtime would do anyway);
- ``method``: the winning candidate; ``wall_s``: synthesis wall time on this machine; ``cpu_s``: this process's
  CPU time for it (on a shared machine the fairer figure: other work stretches the wall time, not this).

Usage::

    python benchmarks/bench_quality.py                       # the issue's full grid (hours on 2 cores)
    python benchmarks/bench_quality.py --topologies dgx1 dgx-h100 --sizes 1MB 1GB --collectives allgather
    python benchmarks/bench_quality.py --quick               # single-node topologies at 1 GB
    python benchmarks/bench_quality.py --two-node            # the two-node targets at 1 GB (TE-CCL models too)
    python benchmarks/bench_quality.py --latency             # 1 KB: the alpha-diameter and direct bounds
    python benchmarks/bench_quality.py --sketched            # each built-in sketch on the topology it is for

``binding`` says which bound is the limit: ``bandwidth``; ``latency`` (the direct bound, at least the alpha
diameter); or ``crossing`` (several nodes: what must leave a node through its NIC ports, summed and fanned out as
time allows). The JSON is rewritten after every row, so a long run stopped early keeps what it measured.

Writes ``benchmarks/results/quality.json`` (``--out NAME`` for another name, or ``--out PATH.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

from synth.bounds.physical import lower_bound  # noqa: E402
from synth.errors import SynthError  # noqa: E402
from synth.model.collectives import COLLECTIVES  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from synth.solver.highs import SolverOptions  # noqa: E402
from synth.synthesis.request import SynthesisRequest  # noqa: E402
from synth.synthesis.solve import solve  # noqa: E402
from synth.units import format_size, parse_size  # noqa: E402

TOPOLOGIES = [("dgx1", 1), ("dgx2", 1), ("dgx-a100", 1), ("dgx-h100", 1), ("ndv4", 1), ("ring-8", 1),
              ("fully-connected-8", 1), ("ndv2", 2), ("dgx2", 2), ("dgx-h100", 2)]
SIZES = ["1KB", "64KB", "1MB", "64MB", "1GB"]
SINGLE_NODE = ["dgx1", "dgx2", "dgx-a100", "dgx-h100", "ndv4"]
TWO_NODE = [("ndv2", 2), ("dgx2", 2), ("dgx-h100", 2), ("ndv2-2node-tecc", 1), ("dgx2-2node-tecc", 1)]
# Each built-in sketch (sketches/) on the topology its description names: the "also with a sketch" rows.
SKETCHED = [("dgx-a100", 2, "dgx-a100-rail"), ("dgx-h100", 2, "dgx-h100-rail"), ("dgx2", 2, "dgx2-nic-rail"),
            ("ndv2", 2, "ndv2-nic-relay"), ("ndv2-2node-tecc", 1, "ndv2-tecc-relay"),
            ("dgx2-2node-tecc", 1, "dgx2-tecc-relay")]


def measure(topology: str, nodes: int, collective: str, size: str, time_limit_s: float,
            sketch: str | None = None) -> dict:
    topo = load_topology(topology, nodes)
    size_bytes = parse_size(size)
    row = {"topology": topo.name, "gpus": topo.num_ranks, "collective": collective, "size": size}
    if sketch:
        row["sketch"] = sketch
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        solution = solve(SynthesisRequest(topo, collective, size_bytes, sketch=sketch,
                                          options=SolverOptions(time_limit_s=time_limit_s)))
    except SynthError as exc:
        row.update(error=str(exc)[:120], wall_s=round(time.perf_counter() - t0, 2),
                   cpu_s=round(time.process_time() - c0, 2))
        return row
    except Exception as exc:   # a bug: kept as a row (with its type) so one case does not lose the whole grid
        row.update(error=f"BUG {type(exc).__name__}: {exc}"[:120], wall_s=round(time.perf_counter() - t0, 2))
        return row
    report = solution.report()
    sim, plan = report["predicted_time_us"], report["plan_time_us"]
    row.update(method=report["method"][:28], sim_us=round(sim, 3), plan_us=round(plan, 3),
               plan_vs_sim_pct=round(100 * (sim - plan) / sim, 2), pct_limit=round(report["percent_of_limit"], 2),
               binding=report["limit_binding"],
               pct_alpha=round(100 * lower_bound(collective, topo, size_bytes).latency_us / sim, 2),
               baseline=(report["baseline"] or "-")[:24],
               base_us=None if report["baseline_us"] is None else round(report["baseline_us"], 3),
               ratio=None if report["speedup_vs_baseline"] is None else round(report["speedup_vs_baseline"], 3),
               wall_s=round(time.perf_counter() - t0, 2), cpu_s=round(time.process_time() - c0, 2))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", nargs="*", help="names, NAME:K for K nodes (default: the issue's ten)")
    parser.add_argument("--collectives", nargs="*", default=list(COLLECTIVES))
    parser.add_argument("--sizes", nargs="*", default=SIZES)
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="single-node topologies at 1 GB only")
    preset.add_argument("--two-node", action="store_true", help="the two-node topologies (and *-tecc) at 1 GB")
    preset.add_argument("--latency", action="store_true", help="1 KB (the alpha-diameter target)")
    preset.add_argument("--sketched", action="store_true",
                        help="each built-in sketch on its topology (1 KB, 1 MB, 64 MB, 1 GB unless --sizes)")
    parser.add_argument("--time-limit", type=float, default=30.0, help="solver limit per MILP, seconds")
    parser.add_argument("--out", default="quality")
    args = parser.parse_args()
    if args.topologies:
        topologies = [(t.split(":")[0], int(t.split(":")[1]), None) if ":" in t else (t, 1, None)
                      for t in args.topologies]
    elif args.sketched:
        topologies = SKETCHED
    elif args.two_node:
        topologies = [(t, k, None) for t, k in TWO_NODE]
    else:
        topologies = [(t, k, None) for t, k in ([(t, 1) for t in SINGLE_NODE] if args.quick else TOPOLOGIES)]
    sizes = ["1GB"] if args.quick or args.two_node else ["1KB"] if args.latency else args.sizes
    if args.sketched and args.sizes == SIZES:
        sizes = ["1KB", "1MB", "64MB", "1GB"]
    rows = []
    for topology, nodes, sketch in topologies:
        for collective in args.collectives:
            for size in sizes:
                row = measure(topology, nodes, collective, size, args.time_limit, sketch)
                rows.append(row)
                print(f"{row['topology']:>18} {sketch or '':>15} {collective:>13} "
                      f"{format_size(parse_size(size)):>6}: "
                      f"{row.get('pct_limit', row.get('error'))}% of limit, x{row.get('ratio')} vs baseline, "
                      f"{row['wall_s']} s ({row['cpu_s']} s CPU)", file=sys.stderr, flush=True)
                path = write_json(args.out, rows)
    print_table(rows, ["topology", "gpus", *(["sketch"] if args.sketched else []), "collective", "size", "method",
                       "sim_us", "plan_us", "plan_vs_sim_pct", "pct_limit", "pct_alpha", "binding", "baseline",
                       "base_us", "ratio", "wall_s", "cpu_s"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
