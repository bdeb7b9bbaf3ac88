"""Is the limit sound, and what do the crossing and drain bounds add? Every applicable baseline, replayed, against
the limit (on machines of several nodes by default, where the crossing bound counts; any machine with
``--machines``).

For each machine x collective x size, every baseline the collective has there (1, 2 and 8 chunks per rank) is
replayed in the cost model. ``violations`` counts replays faster than the limit (beyond 1e-7): any would make the
crossing or the drain bound unsound. ``tightest`` is the least replayed time / limit over them. ``old_limit_us`` is
the limit without either (the larger of the bandwidth and direct bounds), ``limit_us`` the one with both.

Usage::

    python benchmarks/bench_crossing.py                  # about 5 minutes on 2 busy cores
    python benchmarks/bench_crossing.py --machines ndv2:2 dgx2:2 --sizes 1KB 64KB
    python benchmarks/bench_crossing.py --machines dgx1 dgx-h100 ring-8 --out drain   # the drain bound, one node

Writes ``benchmarks/results/crossing.json`` (``--out NAME`` or ``--out PATH.json`` for another).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

from synth.bounds.physical import lower_bound  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from synth.schedule.replay import verify  # noqa: E402
from synth.synthesis.baselines import baseline_status, build_baseline  # noqa: E402
from synth.units import format_size, parse_size  # noqa: E402

MACHINES = ["ndv2:2", "dgx-h100:2", "dgx2:2", "dgx-a100:2", "ndv4:2", "ndv2:4", "dgx-h100:4:rail",
            "ndv2-2node-tecc", "dgx2-2node-tecc", "ndv2-4node-tecc"]
COLLECTIVES = ["allreduce", "broadcast", "reduce", "allgather", "reducescatter", "gather", "scatter", "alltoall"]
SIZES = ["1KB", "64KB", "1MB", "64MB"]
CHUNKS = (1, 2, 8)


def load_machine(spec: str):
    """``NAME``, ``NAME:NODES`` or ``NAME:NODES:FABRIC``."""
    name, *rest = spec.split(":")
    nodes = int(rest[0]) if rest else 1
    return load_topology(name, nodes, rest[1] if len(rest) > 1 else "switch")


def measure(topology, collective: str, size: int) -> dict:
    bound = lower_bound(collective, topology, size, root=0)
    old_limit = max(bound.bandwidth_us, bound.direct_us)
    replays, violations, tightest = 0, 0, float("inf")
    for name, reason in baseline_status(collective, topology).items():
        if reason is not None:
            continue
        for chunks in CHUNKS:
            time_us = verify(build_baseline(name, collective, topology, chunks_per_rank=chunks), topology,
                             size).time_us
            replays += 1
            violations += time_us < bound.limit_us * (1 - 1e-7)
            tightest = min(tightest, time_us / bound.limit_us)
    return {"machine": topology.name, "collective": collective, "size": format_size(size),
            "old_limit_us": round(old_limit, 3), "limit_us": round(bound.limit_us, 3),
            "raised_pct": round(100 * (bound.limit_us / old_limit - 1), 2), "replays": replays,
            "violations": violations, "tightest": round(tightest, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", nargs="*", default=MACHINES, help="NAME, NAME:NODES or NAME:NODES:FABRIC")
    parser.add_argument("--collectives", nargs="*", default=COLLECTIVES)
    parser.add_argument("--sizes", nargs="*", default=SIZES)
    parser.add_argument("--out", default="crossing")
    args = parser.parse_args()
    rows = []
    for spec in args.machines:
        topology = load_machine(spec)
        for collective in args.collectives:
            for size in args.sizes:
                rows.append(measure(topology, collective, parse_size(size)))
                r = rows[-1]
                print(f"{r['machine']:>16} {collective:>13} {r['size']:>5}: limit {r['old_limit_us']} -> "
                      f"{r['limit_us']} us, {r['replays']} replays, {r['violations']} below", flush=True)
    print_table(rows, ["machine", "collective", "size", "old_limit_us", "limit_us", "raised_pct", "replays",
                       "violations", "tightest"])
    print(f"{sum(r['replays'] for r in rows)} replays, {sum(r['violations'] for r in rows)} below the bound")
    print(f"wrote {write_json(args.out, rows)}")


if __name__ == "__main__":
    main()
