"""Benchmark: mutated input files through the CLI, counting clean errors, successes, tracebacks and hangs.

Every input surface (topology and TACCL profiles, sketches and TACCL sketches, schedule JSON through
``simulate`` and ``export``, NCCL topology dumps, MSCCL XML, nccl-tests text; see ``tests/support/fuzzing.py``)
gets COUNT / surfaces seeded mutations of files the project writes itself, and two more surfaces get hostile
command lines: option values (NaN, huge counts, malformed sizes and addresses) and output paths (missing
directories, FIFOs, devices, directories, overlong names). Each case runs in-process through click's CliRunner
with a per-case wall-clock limit. A failed output-path case that leaves a file or replaces the FIFO, the file or
the directory it pointed at counts as ``left``. Target: 0 tracebacks, 0 hangs, 0 left. Run from the repository
root::

    python benchmarks/bench_fuzz.py [COUNT] [SEED] [LIMIT_S]

Prints a table per surface (and the first traceback of each surface) and writes
``benchmarks/results/fuzz.json``.
"""

from __future__ import annotations

import os
import random
import stat
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _common import print_table, write_json  # noqa: E402
from support.fuzzing import (INPUT_NAMES, SURFACES, argv_for, mutate, option_case, path_case,  # noqa: E402
                             reset_scratch, run_case, scratch_files)

KINDS = ("ok", "error", "traceback", "hang", "left")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    limit_s = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    rng = random.Random(seed)
    names = list(SURFACES) + ["cli-options", "output-paths"]
    per_surface = -(-count // len(names))
    rows, failures = [], []
    start_dir = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = scratch_files(folder)
        os.chdir(folder)            # output-path cases name entries relative to the scratch folder
        try:
            for name in names:
                rows.append(_surface(name, per_surface, rng, folder, files, limit_s, failures))
        finally:
            os.chdir(start_dir)
    rows.append({"surface": "total", "runs": sum(r["runs"] for r in rows),
                 **{kind: sum(r[kind] for r in rows) for kind in KINDS},
                 "seconds": round(sum(r["seconds"] for r in rows), 2),
                 "slowest_s": max(r["slowest_s"] for r in rows)})
    print_table(rows, ["surface", "runs", *KINDS, "seconds", "slowest_s"])
    shown = set()
    for failure in failures:
        if failure["surface"] not in shown:
            shown.add(failure["surface"])
            print(f"\nfirst {failure['kind']} on {failure['surface']} (case {failure['case']}): {failure['argv']}\n"
                  f"{failure['detail']}")
    print(f"wrote {write_json('fuzz', rows + [{'failures': failures[:50]}])}")


def _surface(name, runs, rng, folder, files, limit_s, failures) -> dict:
    """Run one surface's cases; a failed output-path case that leaves or replaces an entry counts as 'left'."""
    counts, slowest, t0 = Counter(), 0.0, time.perf_counter()
    for k in range(runs):
        text = None
        if name in SURFACES:
            surface = SURFACES[name]
            path = folder / f"case{surface.suffix}"
            path.write_bytes(mutate(rng.choice(surface.seeds()), rng, surface.structured))
            text = path.read_bytes()[:3000].decode("utf-8", "replace")
            argv = argv_for(surface, path)
        elif name == "cli-options":
            argv = option_case(rng, files)
        else:
            reset_scratch(folder)
            argv = path_case(rng, files)
        start = time.perf_counter()
        outcome = run_case(argv, limit_s)
        slowest = max(slowest, time.perf_counter() - start)
        kind = outcome.kind
        if name == "output-paths" and kind == "error" and _left_behind(folder):
            kind = "left"
        counts[kind] += 1
        if kind not in ("ok", "error"):
            failures.append({"surface": name, "case": k, "kind": kind, "argv": [a[:100] for a in argv],
                             "detail": outcome.detail, "input": text})
    print(f"{name}: {dict(counts)}", file=sys.stderr, flush=True)
    return {"surface": name, "runs": runs, **{kind: counts[kind] for kind in KINDS},
            "seconds": round(time.perf_counter() - t0, 2), "slowest_s": round(slowest, 3)}


def _left_behind(folder: Path) -> bool:
    """True when the scratch folder holds more than reset_scratch made, or the FIFO, file or dir were replaced."""
    extra = {name for name in os.listdir(folder) if name not in ("dir", "file", "fifo", *INPUT_NAMES)
             and not name.startswith("case.")}
    return (extra != set()
            or not stat.S_ISFIFO(os.lstat(folder / "fifo").st_mode) or (folder / "file").read_text() != "kept"
            or not (folder / "dir").is_dir() or any((folder / "dir").iterdir()))


if __name__ == "__main__":
    main()
