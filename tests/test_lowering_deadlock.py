"""Lowerings of verified schedules never deadlock (a deadlock there is a lowering bug, not the schedule's).

Reproducer: ReduceScatter on two DGX-H100 nodes on rails, composed hierarchically in 2 pieces, fused and merged
to ``cnt <= 2``. Merging a step that another threadblock waits for (``hasdep``) with a next step that waits for a
later step elsewhere delayed the flag until that later wait: gpu 0's port-ordered sends then waited on each
other in a cycle of ``hasdep`` waits.
"""

import pytest

from backends.msccl.fit import Lowering, lower_fitted
from backends.msccl.lowering import render_msccl_xml
from backends.msccl.verdict import check_text
from synth.model.topology import load_topology
from synth.synthesis.hierarchy import HierarchyPlan, RailShape, compose


@pytest.fixture(scope="module")
def reducescatter_two_nodes():
    topology = load_topology("dgx-h100", 2, fabric="rail")
    return topology, compose(topology, "reducescatter", HierarchyPlan(RailShape.DIRECT, 2), 1 << 30)


@pytest.mark.parametrize("lowering", [Lowering(True, 1, 2), Lowering(True, 2, 2), Lowering(False, 2, 2),
                                      Lowering(True, 2, 2, strict_merge=True)],
                         ids=["fused-1ch", "fused-2ch", "plain-2ch", "fused-2ch-strict"])
def test_merged_lowering_of_a_hierarchical_reducescatter_passes_the_verdict(reducescatter_two_nodes, lowering):
    topology, schedule = reducescatter_two_nodes
    program = lower_fitted(schedule, topology, "executor", lowering)
    report = check_text(render_msccl_xml(program), "<merged>", "executor")
    assert [str(f) for f in report.errors()] == []


def test_fused_relays_of_a_ring_rail_allgather_pass_the_verdict():
    """Allgather on four nodes, rails as a ring, 4 pieces, fused on one channel: a fused ``rcs`` relay also
    waited for the previous send on its NIC port in another threadblock, and with one message of FIFO the relays
    of two rails waited on each other in a cycle. Port order is now kept only by plain sends."""
    topology = load_topology("dgx-h100", 4, fabric="rail")
    schedule = compose(topology, "allgather", HierarchyPlan(RailShape.RING, 4), 1 << 30)
    program = lower_fitted(schedule, topology, "executor", Lowering(True, 1, 1))
    report = check_text(render_msccl_xml(program), "<fused>", "executor")
    assert [str(f) for f in report.errors()] == []
