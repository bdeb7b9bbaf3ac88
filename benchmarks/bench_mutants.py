"""Benchmark: share of seeded faults the interpreter rejects.

Takes valid programs (the hand-built one per collective, the ring, tree and all-pairs baselines lowered by our
backend, and every valid third-party file in ../shared/data when it is there), applies seeded
random mutations (drop or swap a step, change a peer, a used offset, a cnt, a depid, remove a hasdep) and
counts how many mutants ``execute_program`` rejects. Mutants that survive are usually equivalent (e.g. a
dependency that orders nothing, or one end of a pair receiving first while the other sends first). Run from
the repository root::

    python benchmarks/bench_mutants.py [COUNT] [SEED]

Prints the share per operator and writes ``benchmarks/results/mutants.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.mutants import mutant_sweep  # noqa: E402
from support.programs import BUILDERS, LOWERED, lowered_baseline  # noqa: E402
from support.shared import VALID_FILES, have_shared, load_shared  # noqa: E402


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    programs = [BUILDERS[c]() for c in sorted(BUILDERS)] + [lowered_baseline(LOWERED[k]) for k in sorted(LOWERED)]
    if have_shared():
        programs += [load_shared(name) for name in VALID_FILES]
    t0 = time.perf_counter()
    stats = mutant_sweep(programs, count, seed)
    elapsed = time.perf_counter() - t0
    print(f"{'operator':10s} {'mutants':>8s} {'caught':>7s} {'share':>6s}")
    for op, (total, hit) in sorted(stats["per_operator"].items()):
        print(f"{op:10s} {total:8d} {hit:7d} {hit / total:6.1%}")
    print(f"{'all':10s} {stats['mutants']:8d} {stats['caught']:7d} {stats['share']:6.1%}"
          f"   ({elapsed:.1f} s, seed {seed})")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "mutants", "seed": seed, "seconds": elapsed, "programs": len(programs),
           "third_party_files": have_shared(),
           "mutants": stats["mutants"], "caught": stats["caught"], "share": stats["share"],
           "per_operator": {op: {"mutants": t, "caught": h} for op, (t, h) in sorted(stats["per_operator"].items())}}
    (out / "mutants.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'mutants.json'}")


if __name__ == "__main__":
    main()
