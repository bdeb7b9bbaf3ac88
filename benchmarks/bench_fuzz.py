"""Benchmark: mutated input files through the CLI, counting clean errors, successes, tracebacks and hangs.

Every input surface (topology and TACCL profiles, sketches and TACCL sketches, schedule JSON through
``simulate`` and ``export``, NCCL topology dumps, MSCCL XML, nccl-tests text; see ``tests/support/fuzzing.py``)
gets COUNT / surfaces seeded mutations of files the project writes itself; each runs in-process through click's
CliRunner with a per-case wall-clock limit. Target: 0 tracebacks, 0 hangs. Run from the repository root::

    python benchmarks/bench_fuzz.py [COUNT] [SEED] [LIMIT_S]

Prints a table per surface (and the first traceback of each surface) and writes
``benchmarks/results/fuzz.json``.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _common import print_table, write_json  # noqa: E402
from support.fuzzing import SURFACES, argv_for, mutate, run_case  # noqa: E402

KINDS = ("ok", "error", "traceback", "hang")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    limit_s = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    rng = random.Random(seed)
    per_surface = -(-count // len(SURFACES))
    rows, failures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for surface in SURFACES.values():
            seeds = surface.seeds()
            counts, slowest, t0 = Counter(), 0.0, time.perf_counter()
            for k in range(per_surface):
                path = Path(tmp) / f"{surface.name}-{k}{surface.suffix}"
                path.write_bytes(mutate(rng.choice(seeds), rng, surface.structured))
                start = time.perf_counter()
                outcome = run_case(argv_for(surface, path), limit_s)
                slowest = max(slowest, time.perf_counter() - start)
                counts[outcome.kind] += 1
                if outcome.kind in ("traceback", "hang"):
                    failures.append({"surface": surface.name, "case": k, "kind": outcome.kind,
                                     "detail": outcome.detail,
                                     "input": path.read_bytes()[:3000].decode("utf-8", "replace")})
                path.unlink()
            rows.append({"surface": surface.name, "runs": per_surface, **{kind: counts[kind] for kind in KINDS},
                         "seconds": round(time.perf_counter() - t0, 2), "slowest_s": round(slowest, 3)})
            print(f"{surface.name}: {dict(counts)}", file=sys.stderr, flush=True)
    rows.append({"surface": "total", "runs": sum(r["runs"] for r in rows),
                 **{kind: sum(r[kind] for r in rows) for kind in KINDS},
                 "seconds": round(sum(r["seconds"] for r in rows), 2),
                 "slowest_s": max(r["slowest_s"] for r in rows)})
    print_table(rows, ["surface", "runs", *KINDS, "seconds", "slowest_s"])
    shown = set()
    for failure in failures:
        if failure["surface"] not in shown:
            shown.add(failure["surface"])
            print(f"\nfirst {failure['kind']} on {failure['surface']} (case {failure['case']}):\n{failure['detail']}")
    print(f"wrote {write_json('fuzz', rows + [{'failures': failures[:50]}])}")


if __name__ == "__main__":
    main()
