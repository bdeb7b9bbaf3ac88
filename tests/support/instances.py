"""Instances with known answers, shared by the tests and the benchmarks.

Step instances are (collective, steps S, rounds R, chunks per rank C) as in SCCL; a named tuple so tests can
unpack them. The DGX-1 rows are SCCL's Allgather frontier (its paper, Table 3) and their time-reversals.
"""

from __future__ import annotations

from typing import NamedTuple


class StepsInstance(NamedTuple):
    collective: str
    steps: int
    rounds: int
    chunks: int

    @property
    def label(self) -> str:
        return f"{self.collective}({self.steps},{self.rounds},{self.chunks})"


# A bidirectional 4-ring (topology "ring-4"): Allgather needs the diameter, 2 steps, and each rank receives
# 3 chunks per chunk-per-rank over its 2 in-links, so R/C >= 3/2: (2,2,1) is optimal, (2,2,2) is infeasible
# (6 chunks over 2 in-links need 3 rounds).
RING4_ALLGATHER_OPTIMUM = StepsInstance("allgather", 2, 2, 1)
RING4_ALLGATHER_INFEASIBLE = StepsInstance("allgather", 2, 2, 2)
RING4_ALLGATHER_FEASIBLE = [RING4_ALLGATHER_OPTIMUM, StepsInstance("allgather", 2, 3, 2)]

# DGX-1 (topology "dgx1"), 8 ranks.
DGX1_FEASIBLE = [StepsInstance("allgather", 2, 3, 2), StepsInstance("allgather", 3, 7, 6),
                 StepsInstance("reducescatter", 2, 3, 2), StepsInstance("reducescatter", 3, 7, 6)]
DGX1_INFEASIBLE = [StepsInstance("allgather", 3, 6, 6), StepsInstance("reducescatter", 3, 6, 6)]
# one instance per collective, each solvable in well under a second
DGX1_EVERY_COLLECTIVE = [StepsInstance("allgather", 2, 3, 2), StepsInstance("reducescatter", 2, 3, 2),
                         StepsInstance("allreduce", 4, 6, 2), StepsInstance("alltoall", 2, 4, 1),
                         StepsInstance("broadcast", 2, 4, 2), StepsInstance("reduce", 2, 4, 2),
                         StepsInstance("gather", 2, 4, 1), StepsInstance("scatter", 2, 4, 1)]


# Allgather baselines the gathered Allreduce and Alltoall are built on in their tests (topology, baseline, chunks)
GATHERED_CASES = [("ring-4", "shortest-path", 1), ("ring-8", "shortest-path", 2), ("dgx1", "shortest-path", 1),
                  ("ring-8", "bidir-ring", 2), ("fully-connected-4", "ring", 4)]
