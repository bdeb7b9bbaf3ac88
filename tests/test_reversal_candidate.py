"""A reduction's candidate from its dual's fastest baseline run backwards on the reversed machine
(:func:`synth.synthesis.select.reversal_candidate`): TE-CCL's two DGX-2 nodes have one-way rails, where the
hierarchical ReduceScatter is no mirror image of the hierarchical Allgather (68.8% against 98.4% of the limit)."""

import pytest

from synth.model.topology import load_topology, reverse_topology
from synth.schedule.replay import verify
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import reversal_candidate

GB = 1 << 30


@pytest.fixture(scope="module")
def tecc_reducescatter():
    return SynthesisRequest(load_topology("dgx2-2node-tecc"), "reducescatter", GB)


def test_the_reversal_takes_the_duals_time_and_beats_the_reductions_own_baselines(tecc_reducescatter):
    request = tecc_reducescatter
    candidate = reversal_candidate(request)
    assert candidate.label.startswith("reversal/hierarchical/")
    schedule = candidate.result.schedule
    assert schedule.collective.name == "reducescatter" and all(t.op == "reduce" for t in schedule.transfers)
    dual = request.baselines_for("allgather", reverse_topology(request.topology)).best(runnable_only=True)
    assert candidate.report.time_us == pytest.approx(dual.report.time_us, rel=1e-9)
    assert verify(schedule, request.topology, GB).time_us == pytest.approx(candidate.report.time_us)
    own = request.baselines.best(runnable_only=True)
    assert candidate.report.time_us < 0.75 * own.report.time_us


def test_collectives_without_a_dual_have_no_reversal():
    request = SynthesisRequest(load_topology("ring-4"), "allgather", GB)
    assert reversal_candidate(request) is None


def test_an_allreduce_is_that_reducescatter_then_the_allgather_baseline_itself():
    request = SynthesisRequest(load_topology("dgx2-2node-tecc"), "allreduce", GB)
    candidate = reversal_candidate(request)
    schedule = candidate.result.schedule
    assert schedule.collective.name == "allreduce"
    forward = request.baselines_for("allgather", request.topology).best(runnable_only=True)
    mirrored = request.baselines_for("allgather", reverse_topology(request.topology))
    mirror = next(r for r in mirrored.runs if (r.name, r.chunks_per_way) == (forward.name, forward.chunks_per_way))
    assert candidate.label == f"reversal/{forward.name}/c{forward.chunks_per_way}"
    # the reductions first (every reduce before every copy), then the Allgather's copies, in their two times
    ops = [t.op for t in schedule.ordered()]
    assert ops == sorted(ops, key=lambda op: op != "reduce")
    # (one latency may overlap at the seam)
    assert candidate.report.time_us == pytest.approx(mirror.report.time_us + forward.report.time_us, rel=1e-4)
    assert candidate.report.time_us < request.baselines.best(runnable_only=True).report.time_us
