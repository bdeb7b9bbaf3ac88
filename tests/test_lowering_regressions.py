"""Lowering regressions found on composed clusters."""

from backends.msccl.fit import Lowering, lower_fitted
from backends.msccl.lowering import render_msccl_xml
from backends.msccl.verdict import check_text
from synth.model.topology import load_topology
from synth.synthesis.hierarchy import HierarchyPlan, RailShape, compose


def test_fused_chains_that_find_no_channel_are_unfused_not_a_crash():
    # 4 x dgx-h100 on rails, one piece per rank, fused chains over 16 channels: some chains find no channel left
    # (a KeyError in threadblock assignment before); they must be unfused and the program still verify.
    topology = load_topology("dgx-h100", 4, fabric="rail")
    schedule = compose(topology, "allgather", HierarchyPlan(RailShape.DIRECT, 1), 1 << 30)
    program = lower_fitted(schedule, topology, "executor", Lowering(True, 16, 1))
    report = check_text(render_msccl_xml(program), "<regression>", "executor")
    assert report.errors() == []
