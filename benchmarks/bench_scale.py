"""Cluster scale: `synth solve` from 2 to 32 (64, 128) nodes of today's GPU machines, as a user runs it.

Each case runs ``synth solve COLL --topology T --nodes K [--fabric rail] --size S --time-limit L --json -o f.xml``
as its own process (so a crash, a hang or a refusal is one row, never the end of the benchmark), then
``synth check f.xml --target executor --topology T`` on the file it wrote. Columns:

- ``gpus``; ``wall_s``: the solve's wall time; ``cpu_s``: its CPU time (user + system: the figure that does not
  depend on how many others share the cores); ``peak_MB``: the solve process' peak RSS (``os.wait4``);
- ``method``: the candidate written (``hierarchy/...``, ``baseline/...``);
- ``pct_limit``: physical limit / simulated time of the written XML (``synth solve --json``);
- ``baseline``/``ratio``: the best runnable baseline (simulated) and its time over ours (>= 1: never slower);
- ``xml_KB``: the file's size; ``check_s``: ``synth check``'s wall time (``check`` its verdict);
- ``status``: the solve's status (``time-limit`` when the limit cut the search) or the refusal / error line.

Usage::

    python benchmarks/bench_scale.py --quick                       # dgx-h100 x2, x4 (rail), AG/RS/AR/A2A at 1 MB
    python benchmarks/bench_scale.py                               # the issue's grid (hours on 2 cores)
    python benchmarks/bench_scale.py --nodes 2,4,8 --collectives allgather --sizes 1GB --time-limit 300
    python benchmarks/bench_scale.py --machines ndv2:8,16 dgx-a100:16
    python benchmarks/bench_scale.py --nodes 64,128 --sizes 1GB --time-limit 900 --machines   # 512, 1024 GPUs

At 128 nodes a case holds about a million transfers per phase: give it the issue's 15 minutes (``--time-limit
900``); under the default 300 s the writer keeps the first variant that fits (status ``time-limit``).

Writes ``benchmarks/results/scale.json`` (``--out NAME``), and ``scale.png`` (wall time against GPUs) when
matplotlib is installed (the ``plot`` extra). Timings depend on the machine's load: say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, results_path, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = ["allgather", "reducescatter", "allreduce", "alltoall"]
SIZES = ["1MB", "1GB"]
H100_NODES = [2, 4, 8, 16, 32]
# (topology, fabric, node counts) besides dgx-h100; the rail fabric where every GPU has its own NIC
OTHER_MACHINES = [("ndv2", "switch", [8, 16]), ("dgx-a100", "rail", [16])]
# A case may run past its --time-limit by this much (writing the file, interpreter start) before it is killed.
KILL_MARGIN_S = 120.0
COLUMNS = ["topology", "fabric", "gpus", "collective", "size", "wall_s", "cpu_s", "peak_MB", "pct_limit", "method",
           "baseline", "ratio", "xml_KB", "check_s", "check", "status"]


@dataclass(frozen=True)
class Case:
    topology: str
    fabric: str
    nodes: int
    collective: str
    size: str


@dataclass(frozen=True)
class Finished:
    """One child process: exit code (None: killed at the hard limit), wall and CPU seconds, peak RSS (MB),
    output."""

    returncode: int | None
    wall_s: float
    cpu_s: float
    peak_MB: float
    stdout: str
    stderr: str


def run_child(args: list[str], hard_limit_s: float) -> Finished:
    """Run ``python -m synth ARGS`` and measure it; killed (process group) after ``hard_limit_s``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "synth", *args], stdout=out, stderr=err, env=env,
                                 cwd=ROOT, start_new_session=True)
        killed = threading.Event()

        def kill():
            killed.set()
            os.killpg(child.pid, signal.SIGKILL)

        timer = threading.Timer(hard_limit_s, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(child.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)      # reaped by wait4: tell Popen
        out.seek(0)
        err.seek(0)
        return Finished(None if killed.is_set() else child.returncode, wall, usage.ru_utime + usage.ru_stime,
                        usage.ru_maxrss / 1024,
                        out.read(), err.read())


def _error_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors or lines or ["(no output)"])[-1][:160]


def measure(case: Case, time_limit_s: float, check: bool = True) -> dict:
    topo_name = f"{case.topology}x{case.nodes}"
    row = {"topology": topo_name, "fabric": case.fabric, "collective": case.collective, "size": case.size}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "plan.xml"
        args = ["solve", case.collective, "--topology", case.topology, "--nodes", str(case.nodes), "--size",
                case.size, "--time-limit", f"{time_limit_s:g}", "--json", "-o", str(xml)]
        if case.fabric != "switch":
            args += ["--fabric", case.fabric]
        done = run_child(args, time_limit_s + KILL_MARGIN_S)
        row.update(wall_s=round(done.wall_s, 1), cpu_s=round(done.cpu_s, 1), peak_MB=round(done.peak_MB))
        if done.returncode is None:
            row["status"] = f"killed after {done.wall_s:.0f} s (limit {time_limit_s:g} s + {KILL_MARGIN_S:g} s)"
            return row
        if done.returncode != 0:
            row["status"] = f"exit {done.returncode}: {_error_line(done.stderr)}"
            return row
        report = json.loads(done.stdout)
        row.update(gpus=report["ranks"], pct_limit=round(report["percent_of_limit"], 1),
                   baseline=report["baseline"] or "-",
                   ratio=None if report["speedup_vs_baseline"] is None else round(report["speedup_vs_baseline"], 3),
                   xml_KB=round(xml.stat().st_size / 1024, 1), status=report["status"], method=report["method"],
                   sim_us=round(report["predicted_time_us"], 3), limit_us=round(report["limit_us"], 3))
        if check:
            checked = run_child(["check", str(xml), "--target", "executor", "--topology", case.topology],
                                time_limit_s + KILL_MARGIN_S)
            row.update(check_s=round(checked.wall_s, 1),
                       check="ok" if checked.returncode == 0 else f"exit {checked.returncode}: "
                                                                  f"{_error_line(checked.stdout + checked.stderr)}")
    return row


def cases(args) -> list[Case]:
    out = []
    machines = [("dgx-h100", args.fabric, args.nodes)] + ([] if args.quick or args.machines is not None else
                                                            [(t, f, n) for t, f, n in OTHER_MACHINES])
    for spec in args.machines or ():
        name, _, counts = spec.partition(":")
        fabric = next((f for t, f, _ in OTHER_MACHINES if t == name), args.fabric)
        machines.append((name, fabric, [int(k) for k in counts.split(",")] if counts else [2]))
    for topology, fabric, nodes in machines:
        for k in nodes:
            for size in args.sizes:
                for collective in args.collectives:
                    out.append(Case(topology, fabric, k, collective, size))
    return out


def plot(rows: list[dict], stem: Path) -> list[Path]:
    """Wall time against GPUs, one line per (machine, collective, size); needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("gpus"):
            series.setdefault(f"{r['topology'].rsplit('x', 1)[0]} {r['collective']} {r['size']}", []).append(
                (r["gpus"], r["wall_s"]))
    for label, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("synth solve wall time (s)")
    ax.set_title("synth solve at cluster scale")
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    for path in paths:
        fig.savefig(path)
    return paths


def _ints(text: str) -> list[int]:
    return [int(k) for k in text.split(",") if k]


def _names(text: str) -> list[str]:
    return [k for k in text.split(",") if k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=_ints, default=H100_NODES, help="dgx-h100 node counts, e.g. 2,4,8")
    parser.add_argument("--fabric", default="rail", choices=["rail", "switch"], help="dgx-h100's fabric")
    parser.add_argument("--machines", nargs="*", default=None,
                        help="other machines as NAME:K1,K2 (default: ndv2:8,16 and dgx-a100:16; none with --quick)")
    parser.add_argument("--collectives", type=_names, default=COLLECTIVES, help="comma-separated")
    parser.add_argument("--sizes", type=_names, default=SIZES, help="comma-separated, e.g. 1MB,1GB")
    parser.add_argument("--quick", action="store_true", help="dgx-h100 x2, x4 at 1 MB only")
    parser.add_argument("--time-limit", type=float, default=300.0, help="synth solve --time-limit per case (s)")
    parser.add_argument("--no-check", action="store_true", help="skip synth check on the written files")
    parser.add_argument("--out", default="scale", help="name of the JSON (and plot) in benchmarks/results")
    parser.add_argument("--replot", action="store_true", help="only redraw the plot of an existing --out JSON")
    args = parser.parse_args()
    if args.replot:
        rows = json.loads(results_path(args.out).read_text())["rows"]
        print("wrote " + ", ".join(str(p) for p in plot(rows, results_path(args.out).with_suffix(""))))
        return
    if args.quick:
        args.nodes = [k for k in args.nodes if k <= 4]
        args.sizes = ["1MB"] if args.sizes == SIZES else args.sizes
    rows = []
    for case in cases(args):
        row = measure(case, args.time_limit, not args.no_check)
        rows.append(row)
        print(f"{row['topology']:>14} {case.fabric:>6} {case.collective:>13} {case.size:>4}: {row.get('status')}, "
              f"{row.get('pct_limit')}% of limit, x{row.get('ratio')} vs baseline, {row['wall_s']} s",
              file=sys.stderr, flush=True)
        write_json(args.out, rows)                    # rewritten after every case: an interrupted run keeps them
    print_table(rows, COLUMNS)
    print(f"wrote {write_json(args.out, rows)}")
    try:
        paths = plot(rows, results_path(args.out).with_suffix(""))
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'synth-collectives[plot]')")
    else:
        print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
