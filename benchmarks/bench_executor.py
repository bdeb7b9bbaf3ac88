"""Benchmark: parse, check (interpreter: data, deadlock, races) and simulate large ring programs.

Target (issue 3): checking and timing a 64-rank algorithm with a few thousand steps in under 2 s on a
2-core laptop-class machine. Run from the repository root::

    python benchmarks/bench_executor.py

Prints a table and writes ``benchmarks/results/executor.json``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from backends.msccl.interpret import execute_program  # noqa: E402
from backends.msccl.ir import MscclProgram  # noqa: E402
from backends.msccl.parse import parse_msccl_xml  # noqa: E402
from backends.msccl.simulate import simulate_program  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from support.programs import render, ring_allgather, ring_allreduce  # noqa: E402

TARGET_S = 2.0


def measure(label: str, program: MscclProgram, topology: str, size_bytes: int) -> dict:
    steps = sum(len(tb.steps) for g in program.gpus for tb in g.tbs)
    text = render(program)
    t0 = time.perf_counter()
    (parsed,) = parse_msccl_xml(text, "<bench>")
    t1 = time.perf_counter()
    result = execute_program(parsed)
    t2 = time.perf_counter()
    report = simulate_program(parsed, load_topology(topology), size_bytes)
    t3 = time.perf_counter()
    return {"case": label, "ranks": program.ngpus, "steps": steps, "xml_bytes": len(text),
            "parse_s": t1 - t0, "check_s": t2 - t1, "simulate_s": t3 - t2,
            "check_and_simulate_s": t3 - t1, "valid": result.ok, "time_us": report.time_us,
            "busbw_GBps": report.busbw_GBps, "topology": topology, "size_bytes": size_bytes,
            "meets_target": (t3 - t1) < TARGET_S}


def main() -> None:
    cases = [("ring allgather 64 ranks", ring_allgather(64, inplace=True), "ring-64", 64 << 20),
             ("ring allreduce 64 ranks", ring_allreduce(64), "ring-64", 64 << 20),
             ("ring allreduce 64 ranks x 4 channels", ring_allreduce(64, 4), "ring-64", 64 << 20)]
    rows = [measure(*case) for case in cases]
    header = f"{'case':38s} {'steps':>7s} {'parse s':>8s} {'check s':>8s} {'sim s':>7s} {'check+sim':>9s} valid"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['case']:38s} {r['steps']:7d} {r['parse_s']:8.3f} {r['check_s']:8.3f} {r['simulate_s']:7.3f} "
              f"{r['check_and_simulate_s']:9.3f} {r['valid']}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "executor", "target_s": TARGET_S, "python": platform.python_version(),
           "machine": platform.machine(), "rows": rows}
    (out / "executor.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'executor.json'}")


if __name__ == "__main__":
    main()
