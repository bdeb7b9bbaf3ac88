"""Time the exact step frontier of every collective on DGX-1, with 1 and 2 worker processes (issue 5).

Targets on this machine class: Allgather and ReduceScatter under 3 s each (frontier exactly {(2,3,2), (3,7,6)};
SCCL's Z3 search took 27.9 s quiet, 115 s loaded), Alltoall and Gather under 5 s, Broadcast (chunk cap 16) and
Allreduce under 30 s. ``search_s`` is the search alone (median of --repeat runs); with workers > 1 the pool is
started and warmed first, and its start-up is reported apart (``pool_start_s``). JSON in results/pareto.json.

    python benchmarks/bench_pareto.py [--repeat 1] [--workers 1 2] [--collectives allgather broadcast]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

from synth.sweep.frontier import explore_frontier, plan_sweep  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from synth.sweep.workers import local_pool  # noqa: E402

# (collective, max chunks, target seconds)
CASES = [("allgather", 8, 3.0), ("reducescatter", 8, 3.0), ("alltoall", 8, 5.0), ("gather", 8, 5.0),
         ("scatter", 8, 5.0), ("reduce", 8, 30.0), ("allreduce", 8, 30.0), ("broadcast", 16, 30.0)]


def run_case(topo, name, max_chunks, workers, repeat):
    spec = plan_sweep(topo, name, max_chunks=max_chunks)
    times, frontier, start = [], None, 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        with local_pool(workers) as (executor, slots):
            if executor is not None:
                executor.submit(abs, 0).result()      # forkserver and workers up before timing the search
            start = time.perf_counter() - t0
            t1 = time.perf_counter()
            frontier = explore_frontier(topo, spec, executor, slots)
            times.append(time.perf_counter() - t1)
    times.sort()
    return frontier, times[len(times) // 2], start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--collectives", nargs="+", default=[c for c, _, _ in CASES])
    args = ap.parse_args()
    topo = load_topology("dgx1")
    rows = []
    for name, max_chunks, target in CASES:
        if name not in args.collectives:
            continue
        for workers in args.workers:
            frontier, seconds, start = run_case(topo, name, max_chunks, workers, args.repeat)
            solved = sum(1 for p in frontier.points if p.how != "implied")
            rows.append({"collective": name, "max_chunks": max_chunks, "workers": workers,
                         "frontier": " ".join(str(p.instance) for p in frontier.frontier),
                         "complete": frontier.complete, "stop": frontier.stop_reason,
                         "instances": len(frontier.points), "solved": solved, "search_s": round(seconds, 3),
                         "pool_start_s": round(start, 3), "target_s": target, "ok": seconds < target})
            print(f"{name:14s} workers={workers}  {seconds:7.2f} s  {rows[-1]['frontier']}", flush=True)
    print()
    print_table(rows, ["collective", "max_chunks", "workers", "frontier", "complete", "stop", "instances", "solved",
                       "search_s", "pool_start_s", "target_s", "ok"])
    print(f"\nwrote {write_json('pareto', rows)}")


if __name__ == "__main__":
    main()
