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

With ``--repeat N`` every case runs N times (one after another, the cases in turn): ``cpu_s`` and ``wall_s`` are the
medians, ``cpu_min_s`` the least CPU time, the figure least disturbed by other work. The JSON's meta records the
load average before and after (``os.getloadavg``), to say how busy the machine was.

Usage::

    python benchmarks/bench_single_node_speed.py                          # 8 collectives x 5 topologies
    python benchmarks/bench_single_node_speed.py --topologies dgx1 --collectives allgather broadcast
    python benchmarks/bench_single_node_speed.py --topologies dgx1 --repeat 3        # medians of 3 runs per case

Writes ``benchmarks/results/single_node_speed.json`` (``--out NAME`` for another name, or ``--out PATH.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def repeated(collective: str, topology: str, size: str, repeat: int) -> dict:
    """:func:`measure` ``repeat`` times: the last run's row with the median CPU and wall seconds, and the least
    CPU seconds as ``cpu_min_s``."""
    runs = [measure(collective, topology, size) for _ in range(repeat)]
    row = dict(runs[-1])
    if "error" in row or repeat == 1:
        return row
    cpu = [r["cpu_s"] for r in runs]
    row.update(cpu_s=round(statistics.median(cpu), 2), cpu_min_s=min(cpu),
               wall_s=round(statistics.median(r["wall_s"] for r in runs), 2))
    row["within_target"] = row["cpu_s"] <= TARGET_CPU_S
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", nargs="*", default=TOPOLOGIES)
    parser.add_argument("--collectives", nargs="*", default=COLLECTIVES)
    parser.add_argument("--size", default="1GB")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; medians are reported")
    parser.add_argument("--out", default="single_node_speed")
    args = parser.parse_args()
    rows = []
    load_before = os.getloadavg()
    for topology in args.topologies:
        for collective in args.collectives:
            row = repeated(collective, topology, args.size, max(1, args.repeat))
            rows.append(row)
            print(f"{topology:>9} {collective:>13}: {row['cpu_s']} s CPU, {row['wall_s']} s wall, "
                  f"{row.get('pct_limit', row.get('error'))}% of limit", file=sys.stderr, flush=True)
            path = write_json(args.out, rows, load_average_before=load_before, load_average_after=os.getloadavg(),
                              repeat=args.repeat)
    columns = ["topology", "collective", "size", "cpu_s"] + (["cpu_min_s"] if args.repeat > 1 else []) + [
        "wall_s", "pct_limit", "method", "within_target"]
    print_table(rows, columns)
    within = sum(1 for r in rows if r.get("within_target"))
    print(f"{within} of {len(rows)} within {TARGET_CPU_S:g} s of CPU; load average {load_before[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
