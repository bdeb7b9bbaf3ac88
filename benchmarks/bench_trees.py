"""Tree packing (issue 11) at 1 GB (1e9 bytes, nccl-tests' per-rank buffer) on the single-node machines: optimal
rate vs the bandwidth bound, chunks per rank, integer vs fractional load, replayed and simulated time (MSCCL
executor lowering, the runtime's FIFO depth) as % of the limit, synthesis wall time. Writes results/trees.json.

    python benchmarks/bench_trees.py                   # 7 collectives x 5 machines
    python benchmarks/bench_trees.py --only dgx1       # one machine
    python benchmarks/bench_trees.py --only dgx1 --chunks 64   # fixed chunks per rank (fits the executor)
    python benchmarks/bench_trees.py --rate-all        # LP rate = bound, every collective on every built-in
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

from backends.msccl.limits import runtime_limits  # noqa: E402
from backends.msccl.lowering import lower_to_msccl  # noqa: E402
from backends.msccl.simulate import simulate_program  # noqa: E402
from synth.bounds.physical import bandwidth_bound_us, lower_bound  # noqa: E402
from synth.errors import SynthError  # noqa: E402
from synth.formulations.trees import packing_rate_us  # noqa: E402
from synth.model.topology import builtin_names, load_topology  # noqa: E402
from synth.solver.highs import SolverOptions  # noqa: E402
from synth.synthesis.trees import COLLECTIVES, synthesize_trees  # noqa: E402

GB = 1e9
MACHINES = ("dgx1", "dgx2", "dgx-a100", "dgx-h100", "ndv4")
LP_OPTIONS = SolverOptions(time_limit_s=600)   # the 32-rank Allgather LPs take 30-60 s


def run(machine: str, name: str, chunks: int | None = None) -> dict:
    topo = load_topology(machine)
    row = {"topology": machine, "collective": name}
    t0 = time.perf_counter()
    try:
        result = synthesize_trees(topo, name, GB, chunks=chunks)
    except SynthError as exc:
        return dict(row, status=f"error: {exc}")
    synth_s = time.perf_counter() - t0
    bound = lower_bound(name, topo, GB)
    row.update(chunks=result.chunks_per_rank, trees=result.num_trees, status=result.status,
               rate_vs_bound=round(result.fractional_us / bound.bandwidth_us, 6),
               int_vs_frac_pct=round(100 * result.fractional_us / result.integer_us, 2),
               replay_pct=round(100 * bound.limit_us / result.replay_us, 2), synth_s=round(synth_s, 2))
    max_conn = max(_connection_counts(result.schedule).values())
    row["max_msgs_per_connection"] = max_conn
    for fuse, channels in ((True, 1), (False, -(-max_conn // 64))):
        label = "fused" if fuse else f"plain{channels}"
        try:
            program = lower_to_msccl(result.schedule, topology=topo, fuse=fuse, channels=channels)
        except SynthError as exc:
            row[label] = f"error: {exc}"
            continue
        problems = [f.message for f in runtime_limits(program) if f.severity == "error" and "executor" in f.runtimes]
        longest = max(len(tb.steps) for g in program.gpus for tb in g.tbs)
        tbs = max(len(g.tbs) for g in program.gpus)
        row[f"{label}_limits"] = "ok" if not problems else f"{len(problems)} broken: {problems[0]}"
        row[f"{label}_shape"] = f"{program.nchannels}ch {tbs}tb/gpu {longest}steps/tb"
        try:
            sim = simulate_program(program, topo, GB)
            row[f"{label}_sim_pct"] = round(100 * bound.limit_us / sim.time_us, 2)
        except SynthError as exc:
            row[f"{label}_sim_pct"] = f"error: {exc}"
    return row


def _connection_counts(schedule) -> dict:
    counts: dict = {}
    for t in schedule.transfers:
        counts[(t.src, t.dst)] = counts.get((t.src, t.dst), 0) + 1
    return counts


def rate_all() -> list[dict]:
    rows = []
    for machine in builtin_names():
        topo = load_topology(machine)
        for name in COLLECTIVES:
            t0 = time.perf_counter()
            ratio = packing_rate_us(topo, name, GB, options=LP_OPTIONS) / bandwidth_bound_us(name, topo, GB)[0]
            rows.append({"topology": machine, "collective": name, "rate_vs_bound": round(ratio, 9),
                         "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=MACHINES)
    parser.add_argument("--rate-all", action="store_true")
    parser.add_argument("--chunks", type=int, help="chunks per rank instead of the size-based choice")
    args = parser.parse_args()
    if args.rate_all:
        rows = rate_all()
        print_table(rows, ["topology", "collective", "rate_vs_bound", "seconds"])
        print(write_json("trees-rate", rows))
        return
    rows = [run(m, c, args.chunks) for m in ((args.only,) if args.only else MACHINES) for c in COLLECTIVES]
    print_table(rows, ["topology", "collective", "chunks", "trees", "rate_vs_bound", "int_vs_frac_pct", "replay_pct",
                       "max_msgs_per_connection", "fused_shape", "fused_limits", "fused_sim_pct",
                       "synth_s", "status"])
    for r in rows:
        plain = [k for k in r if k.startswith("plain") and k.endswith("_shape")]
        for k in plain:
            label = k[:-6]
            print(f"{r['topology']} {r['collective']}: {label} {r[k]}, limits {r[label + '_limits']}, "
                  f"simulated {r.get(label + '_sim_pct')}% of the limit")
    suffix = (f"-{args.only}" if args.only else "") + (f"-c{args.chunks}" if args.chunks else "")
    print(write_json(f"trees{suffix}", rows))


if __name__ == "__main__":
    main()
