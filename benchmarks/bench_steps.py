"""Time the step formulation on the DGX-1 instances of issue 2 and print a table (JSON in results/steps.json).

Reference on this machine class: SCCL's SMT solver 0.3 s for (2,3,2) and 15.3 s for (3,7,6); target here:
(3,7,6) under 1 s, and infeasibility of (3,6,6) proven on the full (non-symmetric) model.

    python benchmarks/bench_steps.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _common import print_table, timed, write_json  # noqa: E402

from synth.model.collectives import make_collective  # noqa: E402
from synth.formulations.steps import encode_steps  # noqa: E402
from synth.errors import InfeasibleError  # noqa: E402
from synth.solver.highs import SolverOptions, solve_model  # noqa: E402
from synth.synthesis.steps import synthesize_steps  # noqa: E402
from synth.model.topology import load_topology  # noqa: E402
from support.instances import DGX1_FEASIBLE, DGX1_INFEASIBLE  # noqa: E402

INSTANCES = sorted(DGX1_FEASIBLE + DGX1_INFEASIBLE, key=lambda i: (i.collective, i.steps, -i.rounds))


def run_model(topo, coll, S, R, C, symmetric):
    enc = encode_steps(topo, make_collective(coll, topo.num_ranks, C), S, R, use_symmetry=symmetric)
    return solve_model(enc.model, SolverOptions(time_limit_s=120)), enc.model.num_cols


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    topo = load_topology("dgx1")
    rows = []
    for coll, S, R, C in INSTANCES:
        def end_to_end():
            try:
                return synthesize_steps(topo, coll, S, R, C).status
            except InfeasibleError:
                return "infeasible"
        seconds, status = timed(end_to_end, args.repeat)
        row = {"collective": coll, "S,R,C": f"({S},{R},{C})", "status": status, "synth_s": round(seconds, 3)}
        if coll == "allgather":
            for label, sym in (("sym", True), ("full", False)):
                t, (res, ncols) = timed(lambda: run_model(topo, coll, S, R, C, sym), args.repeat)
                row[f"{label}_model_s"] = round(t, 3)
                row[f"{label}_status"] = res.status
                row[f"{label}_cols"] = ncols
        rows.append(row)
    print_table(rows, ["collective", "S,R,C", "status", "synth_s", "sym_model_s", "sym_status", "sym_cols",
                       "full_model_s", "full_status", "full_cols"])
    print(f"\nwrote {write_json('steps', rows)}")


if __name__ == "__main__":
    main()
