"""Shared instance factories: small problems with known answers, used by every formulation and backend test."""

from pathlib import Path

import pytest

from synth.model.topology import load_topology

SHARED_XML = Path(__file__).resolve().parents[2] / "shared" / "data" / "msccl-xml"

# (collective, steps, rounds, chunks): DGX-1 instances with known feasibility (SCCL's Allgather frontier).
DGX1_FEASIBLE = [("allgather", 2, 3, 2), ("allgather", 3, 7, 6), ("reducescatter", 2, 3, 2),
                 ("reducescatter", 3, 7, 6)]
DGX1_INFEASIBLE = [("allgather", 3, 6, 6), ("reducescatter", 3, 6, 6)]
# one instance per collective on DGX-1, each solvable in well under a second
DGX1_EVERY_COLLECTIVE = [("allgather", 2, 3, 2), ("reducescatter", 2, 3, 2), ("allreduce", 4, 6, 2),
                         ("alltoall", 2, 4, 1), ("broadcast", 2, 4, 2), ("reduce", 2, 4, 2), ("gather", 2, 4, 1),
                         ("scatter", 2, 4, 1)]


@pytest.fixture(scope="session")
def dgx1():
    return load_topology("dgx1")


@pytest.fixture(scope="session")
def ring4():
    return load_topology("ring-4")
