"""How long ``synth solve COLL --topology T --size 1GB -o f.xml`` takes on the single-node machines (target: at most
5 s each), and what it writes (``percent_of_limit`` must not drop when the command gets faster).

Each case runs the real command as a fresh process (``python -m synth solve ... --json``) and reports:

- ``cpu_s``: the process's user + system CPU time (from ``wait4``'s resource usage). The machine this runs on is
  usually shared, so this is the fairer figure: other work stretches the wall time far more than the CPU time
  (though on 2 busy cores the same run's CPU time still varied by a quarter). With ``PYTHONDONTWRITEBYTECODE`` set,
  as on the project's build machine, every run also compiles the 16,500 lines of the project's modules it imports
  (about 0.3 s of it), which an installed or cached copy does not;
- ``wall_s``: its wall time;
- ``pct_limit`` and ``method``: the ``--json`` report's ``percent_of_limit`` and winning candidate.

Usage::

    python benchmarks/bench_single_node_speed.py                          # 8 collectives x 5 topologies
    python benchmarks/bench_single_node_speed.py --topologies dgx1 --collectives allgather broadcast

Writes ``benchmarks/results/single_node_speed.json`` (``--out NAME`` for another name).
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

from _common import print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ["dgx1", "dgx2", "dgx-a100", "dgx-h100", "ndv4"]
COLLECTIVES = ["allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter", "alltoall"]
TARGET_CPU_S = 5.0


def measure(collective: str, topology: str, size: str) -> dict:
    """One ``synth solve`` process: its CPU and wall seconds, and what its ``--json`` report says."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "synth", "solve", collective, "--topology", topology, "--size", size,
                "-o", str(Path(tmp) / "f.xml"), "--json"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        stdout, stderr = proc.stdout.read(), proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
    row = {"collective": collective, "topology": topology, "size": size,
           "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "wall_s": round(wall, 2)}
    if proc.returncode != 0:
        row["error"] = (stderr.decode().strip().splitlines() or ["?"])[-1][:100]
        return row
    report = json.loads(stdout)
    row.update(pct_limit=round(report["percent_of_limit"], 2), method=report["method"][:30],
               within_target=row["cpu_s"] <= TARGET_CPU_S)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", nargs="*", default=TOPOLOGIES)
    parser.add_argument("--collectives", nargs="*", default=COLLECTIVES)
    parser.add_argument("--size", default="1GB")
    parser.add_argument("--out", default="single_node_speed")
    args = parser.parse_args()
    rows = []
    for topology in args.topologies:
        for collective in args.collectives:
            row = measure(collective, topology, args.size)
            rows.append(row)
            print(f"{topology:>9} {collective:>13}: {row['cpu_s']} s CPU, {row['wall_s']} s wall, "
                  f"{row.get('pct_limit', row.get('error'))}% of limit", file=sys.stderr, flush=True)
            path = write_json(args.out, rows)
    print_table(rows, ["topology", "collective", "size", "cpu_s", "wall_s", "pct_limit", "method", "within_target"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
