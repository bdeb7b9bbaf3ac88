"""The shared instance tables (support.instances) hold what they claim, through formulation, replay and MSCCL."""

import pytest

from backends.msccl.interpret import execute_program
from backends.msccl.lowering import lower_to_msccl
from synth.errors import InfeasibleError
from synth.schedule.replay import replay_data, verify
from synth.synthesis.steps import synthesize_steps
from support.instances import RING4_ALLGATHER_FEASIBLE, RING4_ALLGATHER_INFEASIBLE, RING4_ALLGATHER_OPTIMUM

ALPHA_US, BW_BYTES_PER_US = 0.7, 25.0 * 1e3   # ring-4 links
SIZE_BYTES = 4_000_000


@pytest.mark.parametrize("instance", RING4_ALLGATHER_FEASIBLE, ids=lambda i: i.label)
def test_ring4_allgather_instances_take_the_alpha_beta_time_and_lower_to_valid_msccl(ring4, instance):
    schedule = synthesize_steps(ring4, instance.collective, instance.steps, instance.rounds, instance.chunks).schedule
    assert schedule.steps == instance.steps and replay_data(schedule) == []
    # S alphas and R rounds of one chunk (a quarter of the output, split C ways) each
    chunk_bytes = SIZE_BYTES / 4 / instance.chunks
    expected_us = instance.steps * ALPHA_US + instance.rounds * chunk_bytes / BW_BYTES_PER_US
    assert verify(schedule, ring4, SIZE_BYTES).time_us == pytest.approx(expected_us)
    result = execute_program(lower_to_msccl(schedule, ring4))
    assert result.ok, [str(f) for f in result.errors()[:3]]


def test_ring4_allgather_optimum_needs_the_diameter_and_two_rounds(ring4):
    assert (RING4_ALLGATHER_OPTIMUM.steps, RING4_ALLGATHER_OPTIMUM.rounds) == (2, 2)
    with pytest.raises(InfeasibleError, match="needs at least 2 steps"):
        synthesize_steps(ring4, "allgather", 1, 2, 1)


def test_ring4_allgather_below_three_halves_rounds_per_chunk_is_infeasible(ring4):
    inst = RING4_ALLGATHER_INFEASIBLE
    with pytest.raises(InfeasibleError, match=r"proven on the full model"):
        synthesize_steps(ring4, inst.collective, inst.steps, inst.rounds, inst.chunks)
