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

from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock  # noqa: E402
from backends.msccl.interpret import execute_program  # noqa: E402
from backends.msccl.simulate import simulate_program  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402

TARGET_S = 2.0


def ring_allgather(n: int, channels: int = 1) -> MscclProgram:
    """In-place ring Allgather: per channel one tb per gpu: s, n-2 x rcs, r."""
    gpus = []
    for r in range(n):
        tbs = []
        for h in range(channels):
            def chunk(k):
                return ((r - k) % n) * channels + h
            steps = [Step(0, "s", "o", chunk(0), "o", chunk(0), 1)]
            steps += [Step(k, "rcs" if k < n - 1 else "r", "o", chunk(k), "o", chunk(k), 1) for k in range(1, n)]
            tbs.append(Threadblock(h, (r + 1) % n, (r - 1) % n, h, tuple(steps)))
        gpus.append(Gpu(r, 0, n * channels, 0, tuple(tbs)))
    return MscclProgram(f"ring_allgather_{n}", "Simple", channels, n * channels, n, "allgather", 1, None, None,
                        None, tuple(gpus))


def ring_allreduce(n: int, channels: int = 1) -> MscclProgram:
    """In-place ring Allreduce: s, rrs..., rrcs, rcs..., r (2n-1 steps per tb and channel)."""
    gpus = []
    for r in range(n):
        tbs = []
        for h in range(channels):
            def chunk(k):
                return ((r - k) % n) * channels + h
            types = ["s"] + ["rrs"] * (n - 2) + ["rrcs"] + ["rcs"] * (n - 2) + ["r"]
            chunks = [chunk(k) for k in range(n)] + [chunk(j) for j in range(n - 1)]
            steps = tuple(Step(k, ty, "i", c, "i", c, 1) for k, (ty, c) in enumerate(zip(types, chunks)))
            tbs.append(Threadblock(h, (r + 1) % n, (r - 1) % n, h, steps))
        gpus.append(Gpu(r, n * channels, 0, 0, tuple(tbs)))
    return MscclProgram(f"ring_allreduce_{n}", "Simple", channels, n * channels, n, "allreduce", 1, None, None,
                        None, tuple(gpus))


def render_xml(p: MscclProgram) -> str:
    """Minimal MSCCL XML writer for the benchmark (the real emitter lives in backends/)."""
    lines = [f'<algo name="{p.name}" proto="{p.proto}" nchannels="{p.nchannels}" nchunksperloop="{p.nchunksperloop}" '
             f'ngpus="{p.ngpus}" coll="{p.coll}" inplace="{p.inplace}" outofplace="0" minBytes="0" maxBytes="0">']
    for g in p.gpus:
        lines.append(f'  <gpu id="{g.id}" i_chunks="{g.i_chunks}" o_chunks="{g.o_chunks}" s_chunks="{g.s_chunks}">')
        for tb in g.tbs:
            lines.append(f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            for s in tb.steps:
                lines.append(f'      <step s="{s.s}" type="{s.type}" srcbuf="{s.srcbuf}" srcoff="{s.srcoff}" '
                             f'dstbuf="{s.dstbuf}" dstoff="{s.dstoff}" cnt="{s.cnt}" depid="{s.depid}" '
                             f'deps="{s.deps}" hasdep="{s.hasdep}"/>')
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def parse(text: str):
    try:
        from backends.msccl.parse import parse_msccl_xml
    except ImportError:
        return None
    return parse_msccl_xml(text, "<bench>")[0]


def measure(label: str, program: MscclProgram, topology: str, size_bytes: int) -> dict:
    steps = sum(len(tb.steps) for g in program.gpus for tb in g.tbs)
    text = render_xml(program)
    t0 = time.perf_counter()
    parsed = parse(text)
    t1 = time.perf_counter()
    result = execute_program(parsed or program)
    t2 = time.perf_counter()
    report = simulate_program(parsed or program, load_topology(topology), size_bytes)
    t3 = time.perf_counter()
    return {"case": label, "ranks": program.ngpus, "steps": steps, "xml_bytes": len(text),
            "parse_s": (t1 - t0) if parsed is not None else None, "check_s": t2 - t1, "simulate_s": t3 - t2,
            "check_and_simulate_s": t3 - t1, "valid": result.ok, "time_us": report.time_us,
            "busbw_GBps": report.busbw_GBps, "topology": topology, "size_bytes": size_bytes,
            "meets_target": (t3 - t1) < TARGET_S}


def main() -> None:
    cases = [("ring allgather 64 ranks", ring_allgather(64), "ring-64", 64 << 20),
             ("ring allreduce 64 ranks", ring_allreduce(64), "ring-64", 64 << 20),
             ("ring allreduce 64 ranks x 4 channels", ring_allreduce(64, 4), "ring-64", 64 << 20)]
    rows = [measure(*case) for case in cases]
    header = f"{'case':38s} {'steps':>7s} {'parse s':>8s} {'check s':>8s} {'sim s':>7s} {'check+sim':>9s} valid"
    print(header)
    print("-" * len(header))
    for r in rows:
        parse_s = f"{r['parse_s']:.3f}" if r["parse_s"] is not None else "n/a"
        print(f"{r['case']:38s} {r['steps']:7d} {parse_s:>8s} {r['check_s']:8.3f} {r['simulate_s']:7.3f} "
              f"{r['check_and_simulate_s']:9.3f} {r['valid']}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "executor", "target_s": TARGET_S, "python": platform.python_version(),
           "machine": platform.machine(), "rows": rows}
    (out / "executor.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'executor.json'}")


if __name__ == "__main__":
    main()
