"""Composed clusters at scale: ``synth topo show`` and ``synth bounds`` as a user runs them, one process per case.

For each (nodes, fabric): GPUs, links, the free symmetry group's order, and the wall time and peak memory (RSS,
read from the child) of `synth topo show` and of the Allgather 1 GB bound. Writes results/compose.json.

    python benchmarks/bench_compose.py                        # dgx-h100 x8, x32, x128; switch and rail
    python benchmarks/bench_compose.py --nodes 32 --fabrics rail --oversubscription 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["topology", "gpus", "links", "symmetry", "show_s", "show_MB", "bound_us", "bound_s", "bound_MB", "error"]

# The child runs the command in-process and reports its own peak RSS (ru_maxrss is in KB on Linux).
_CHILD = """
import json, resource, sys
from synth.cli import main
try:
    code = main(sys.argv[1:], standalone_mode=False) or 0   # click returns the exit code of ctx.exit
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"maxrss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "code": code}),
      file=sys.stderr)
"""


def _run(args: list[str]) -> tuple[float, dict, str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    lines = done.stderr.strip().splitlines() or ["{}"]
    return wall, json.loads(lines[-1]), done.stdout, "\n".join(lines[:-1])


def run(topology: str, nodes: int, fabric: str, oversubscription: float) -> dict:
    compose = ["--nodes", str(nodes), "--fabric", fabric, "--oversubscription", str(oversubscription)]
    wall, usage, out, err = _run(["topo", "show", topology, *compose])
    header = out.splitlines()[0] if out else ""
    row = {"topology": header.split(":")[0], "show_s": round(wall, 2), "show_MB": round(usage.get("maxrss_MB", 0))}
    if usage.get("code"):
        row["error"] = (err.splitlines() or ["?"])[-1][:160]
        return row
    row["gpus"] = int(header.split(": ")[1].split()[0])
    links = next(line for line in out.splitlines() if "links through switches" in line).split()
    row["links"] = int(links[0]) + int(links[3])
    row["symmetry"] = int(out.splitlines()[-1].split("symmetry: ")[1].split()[0])
    wall, usage, out, err = _run(["bounds", "allgather", "--topology", topology, *compose, "--size", "1GB", "--json"])
    row.update(bound_s=round(wall, 2), bound_MB=round(usage.get("maxrss_MB", 0)))
    if usage.get("code"):
        row["error"] = (err.splitlines() or ["?"])[-1][:160]
    else:
        row["bound_us"] = round(json.loads(out)["limit_us"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--fabrics", nargs="+", default=["switch", "rail"], choices=["switch", "rail"])
    parser.add_argument("--oversubscription", type=float, default=1.0, help="for the rail fabric")
    parser.add_argument("--name", default="compose", help="results/NAME.json")
    args = parser.parse_args()
    rows = []
    for nodes in args.nodes:
        for fabric in args.fabrics:
            rows.append(run(args.topology, nodes, fabric, args.oversubscription if fabric == "rail" else 1.0))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print_table(rows, COLUMNS)
    print(f"wrote {write_json(args.name, rows)}")


if __name__ == "__main__":
    main()
