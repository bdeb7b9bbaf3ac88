"""Hierarchical synthesis on multi-node machines: ``synth solve`` as a user runs it, one process per case.

For each case: wall time of the whole command, the simulated time of the written XML, % of the limit, the chosen
candidate, the best runnable baseline that could be written and the speedup over it (``--json`` report).
Writes results/hierarchy.json.

    python benchmarks/bench_hierarchy.py                       # dgx-h100 x2, x4, x8; AG/RS/AR/A2A; 1 GB and 1 MB
    python benchmarks/bench_hierarchy.py --nodes 16 32 --sizes 1GB --method hierarchy
    python benchmarks/bench_hierarchy.py --topology ndv2 --nodes 8 --collectives allgather --sizes 1MB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["topology", "nodes", "gpus", "collective", "size", "method", "wall_s", "simulated_us", "pct_limit",
           "chosen", "baseline", "baseline_us", "speedup", "xml_kB", "error"]


def run(topology: str, nodes: int, collective: str, size: str, method: str) -> dict:
    row = {"topology": topology, "nodes": nodes, "collective": collective, "size": size, "method": method}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "plan.xml"
        cmd = [sys.executable, "-m", "synth", "solve", collective, "--topology", topology, "--nodes", str(nodes),
               "--size", size, "--method", method, "--json", "-o", str(xml)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        if done.returncode:
            row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
            return row
        report = json.loads(done.stdout)
        row.update(gpus=report["ranks"], simulated_us=round(report["predicted_time_us"], 1),
                   pct_limit=round(report["percent_of_limit"], 1), chosen=report["method"],
                   baseline=report["baseline"], xml_kB=round(xml.stat().st_size / 1024))
        if report["baseline_us"]:
            row.update(baseline_us=round(report["baseline_us"], 1),
                       speedup=round(report["baseline_us"] / report["predicted_time_us"], 3))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--collectives", nargs="+", default=["allgather", "reducescatter", "allreduce", "alltoall"])
    parser.add_argument("--sizes", nargs="+", default=["1GB", "1MB"])
    parser.add_argument("--method", default="auto", choices=["auto", "hierarchy"])
    parser.add_argument("--name", default="hierarchy", help="results/NAME.json")
    args = parser.parse_args()
    rows = []
    for nodes in args.nodes:
        for collective in args.collectives:
            for size in args.sizes:
                rows.append(run(args.topology, nodes, collective, size, args.method))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print_table(rows, COLUMNS)
    print(f"wrote {write_json(args.name, rows)}")


if __name__ == "__main__":
    main()
