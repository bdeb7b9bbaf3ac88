"""Is the writer's unmerged floor sound and tight? Every unmerged variant the writer may make, simulated, against it.

For each topology x collective, the first verified candidates of ``synth solve`` (at 1 MB) are lowered every
unmerged way the writer may lower them (fused and plain, each channel spread, in link order) and simulated at
1 KB, 1 MB and 1 GB. ``worst`` is the largest floor / simulated time over all of them: above 1 (beyond rounding)
the floor would be unsound and the writer could skip a faster file. ``tight`` counts the schedules whose fastest
unmerged variant simulates at the floor (within 1e-9), where the writer stops after it.

Usage::

    python benchmarks/bench_floor.py                                    # about 20 minutes on 2 busy cores
    python benchmarks/bench_floor.py --topologies ring-4 dgx1 --collectives broadcast reduce

Writes ``benchmarks/results/floor.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import print_table, write_json  # noqa: E402

from backends.msccl.floor import unmerged_floor_us  # noqa: E402
from backends.msccl.simulate import simulate_program  # noqa: E402
from synth.errors import SynthError  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from synth.synthesis.request import SynthesisRequest  # noqa: E402
from synth.synthesis.select import verified_candidates  # noqa: E402

from support.variants import unmerged_variants  # noqa: E402

TOPOLOGIES = ["ring-4", "fully-connected-8", "dgx1", "dgx-a100", "dgx2", "dgx-h100"]
COLLECTIVES = ["allgather", "broadcast", "gather", "scatter", "alltoall", "reduce", "reducescatter", "allreduce"]
SIZES = (1 << 10, 1 << 20, 1 << 30)
MAX_TRANSFERS = 3000       # larger schedules take minutes per variant here
CANDIDATES = 4


def measure_case(topology_name: str, collective: str) -> dict:
    topology = load_topology(topology_name)
    row = {"topology": topology_name, "collective": collective, "schedules": 0, "variants": 0, "worst": 0.0,
           "tight": 0}
    try:
        candidates = verified_candidates(SynthesisRequest(topology, collective, 1 << 20))[:CANDIDATES]
    except SynthError as exc:
        row["error"] = str(exc)[:80]
        return row
    for candidate in candidates:
        schedule = candidate.result.schedule
        if len(schedule.transfers) > MAX_TRANSFERS:
            continue
        variants = unmerged_variants(schedule, topology)
        for size in SIZES:
            floor = unmerged_floor_us(schedule, topology, size)
            times = [simulate_program(v.program, topology, size).time_us for v in variants]
            if not times:
                continue
            row["schedules"] += 1
            row["variants"] += len(times)
            row["worst"] = max(row["worst"], max(floor / t for t in times))
            row["tight"] += min(times) <= floor * (1 + 1e-9)
    row["worst"] = round(row["worst"], 12)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", nargs="*", default=TOPOLOGIES)
    parser.add_argument("--collectives", nargs="*", default=COLLECTIVES)
    args = parser.parse_args()
    rows = []
    for topology in args.topologies:
        for collective in args.collectives:
            rows.append(measure_case(topology, collective))
            print(rows[-1], file=sys.stderr, flush=True)
            path = write_json("floor", rows)
    print_table(rows, ["topology", "collective", "schedules", "variants", "worst", "tight", "error"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
