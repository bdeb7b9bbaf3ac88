"""The step formulation: known feasible and infeasible DGX-1 instances, every collective, symmetry."""

import pytest

from conftest import DGX1_EVERY_COLLECTIVE, DGX1_FEASIBLE, DGX1_INFEASIBLE
from synth.model.collectives import make_collective
from synth.formulations.steps import encode_steps, min_steps
from synth.model.symmetry import symmetry_for_collective
from synth.errors import InfeasibleError
from synth.schedule.replay import check_links, replay_data, verify
from synth.synthesis.steps import smallest_steps, steps_multiple, synthesize_steps
from synth.model.topology import load_topology


@pytest.mark.parametrize("coll,S,R,C", DGX1_FEASIBLE)
def test_known_feasible_dgx1_instances_are_found_and_verify(dgx1, coll, S, R, C):
    result = synthesize_steps(dgx1, coll, S, R, C)
    sched = result.schedule
    assert result.status == "optimal"
    assert sched.steps == S and sched.rounds <= R
    assert check_links(sched, dgx1) == [] and replay_data(sched) == []


@pytest.mark.parametrize("coll,S,R,C", DGX1_INFEASIBLE)
def test_known_infeasible_instances_are_proven_infeasible(dgx1, coll, S, R, C):
    with pytest.raises(InfeasibleError, match="proven on the full model"):
        synthesize_steps(dgx1, coll, S, R, C)


@pytest.mark.parametrize("coll,S,R,C", DGX1_EVERY_COLLECTIVE)
def test_every_collective_solves_and_replays(dgx1, coll, S, R, C):
    sched = synthesize_steps(dgx1, coll, S, R, C).schedule
    report = verify(sched, dgx1, 1 << 20)
    assert report.time_us > 0 and report.algbw_GBps > 0


def test_reducescatter_is_the_reversal_of_allgather(dgx1):
    sched = synthesize_steps(dgx1, "reducescatter", 2, 3, 2).schedule
    assert all(t.op == "reduce" for t in sched.transfers)
    assert len(sched.transfers) == 8 * 2 * 7  # each of 16 chunks reduced along a 7-edge tree


def test_ring_allgather_optimum_is_n_minus_1_steps():
    ring = load_topology("ring-6")
    coll = make_collective("allgather", 6)
    assert min_steps(ring, coll) == 3
    with pytest.raises(InfeasibleError):
        synthesize_steps(ring, "allgather", 2, 5)
    sched = synthesize_steps(ring, "allgather", 3, 3).schedule
    assert replay_data(sched) == []


def test_dgx1_symmetry_shrinks_the_model_four_fold(dgx1):
    coll = make_collective("allgather", 8, 6)
    assert symmetry_for_collective(dgx1, coll).order == 4
    full = encode_steps(dgx1, coll, 3, 7, use_symmetry=False).model
    sym = encode_steps(dgx1, coll, 3, 7, use_symmetry=True).model
    assert full.num_cols - 3 == 4 * (sym.num_cols - 3)


def test_broadcast_has_no_free_symmetry(dgx1):
    assert symmetry_for_collective(dgx1, make_collective("broadcast", 8, 1, root=0)).order == 1


def test_multinode_allgather_through_shared_nic_verifies():
    topo = load_topology("ndv2", nodes=2)
    sched = synthesize_steps(topo, "allgather", 3, 14, 1).schedule
    assert replay_data(sched) == [] and check_links(sched, topo) == []


def test_step_bounds_follow_the_reductions(dgx1):
    """A reversal's hop bound is its dual's on the reversed links; a concatenation splits steps evenly."""
    assert smallest_steps(dgx1, "reducescatter") == smallest_steps(dgx1, "allgather") == 2
    assert smallest_steps(dgx1, "allreduce") == 4
    assert smallest_steps(dgx1, "reduce", root=3) == smallest_steps(dgx1, "broadcast", root=3)
    assert [steps_multiple(c) for c in ("allreduce", "all_reduce", "allgather", "reduce")] == [2, 2, 1, 1]


def test_allreduce_is_reducescatter_then_allgather_with_half_the_steps(dgx1):
    ar = synthesize_steps(dgx1, "allreduce", 4, 6, 1).schedule
    rs = synthesize_steps(dgx1, "reducescatter", 2, 3, 1).schedule
    assert ar.rounds_per_step[:2] == rs.rounds_per_step and ar.rounds == sum(ar.rounds_per_step)
    assert {t.op for t in ar.transfers if t.step < 2} == {"reduce"}
    assert {t.op for t in ar.transfers if t.step >= 2} == {"copy"}
    assert replay_data(ar) == []
