"""The step floor (backends/msccl/step_floor.py): never above what a lowering holds, and a schedule over the XML
reader's limit refused before any lowering."""

from __future__ import annotations

import pytest

import backends.msccl.fit as fit
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.merge import merge_contiguous
from backends.msccl.step_floor import element_floor_reason, rank_floors
from backends.msccl.writer import emit_verified_xml
from synth.errors import BackendError
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.ir import Schedule, Transfer
from synth.synthesis import hierarchy
from synth.synthesis.baselines import build_baseline


def _schedules():
    two = load_topology("dgx-h100", nodes=2)
    for name in ("allgather", "reducescatter", "allreduce"):
        for plan in hierarchy.hierarchy_plans(two, name, 1 << 30)[:1]:
            yield f"2 x dgx-h100 {name} {plan.label(name)}", hierarchy.compose(two, name, plan, 1 << 30), two
    dgx1 = load_topology("dgx1")
    yield "dgx1 ring allreduce", build_baseline("ring", "allreduce", dgx1, 4), dgx1


@pytest.mark.parametrize("label, schedule, topology", list(_schedules()), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_no_lowering_has_fewer_steps_or_threadblocks_than_the_floor(label, schedule, topology):
    floors = rank_floors(schedule)
    tightest = 0.0
    for fuse in (True, False):
        program = lower_to_msccl(schedule, topology, 1 << 20, fuse=fuse)
        for merged in (program, merge_contiguous(program)):
            for gpu in merged.gpus:
                ops = sum(step.type != "nop" for tb in gpu.tbs for step in tb.steps)
                assert floors[gpu.id].steps <= ops, (label, fuse, gpu.id)
                assert floors[gpu.id].threadblocks <= len(gpu.tbs), (label, fuse, gpu.id)
                tightest = max(tightest, floors[gpu.id].steps / ops)
    if "/c1" in label:       # one piece per rank: little merges, and the floor is close (a zero floor passes above)
        assert tightest > 0.8


def _split_broadcast(chunks: int) -> Schedule:
    """Broadcast from 0 on 4 ranks: 0 sends every chunk to 1, which sends the even ones to 2 and the odd ones to 3
    (neither run is contiguous, so no message merges), and 2 and 3 swap theirs."""
    transfers = [Transfer(c, 0, 1, 0) for c in range(chunks)]
    transfers += [Transfer(c, 1, 2 + c % 2, 1) for c in range(chunks)]
    transfers += [Transfer(c, 2 + c % 2, 3 - c % 2, 2) for c in range(chunks)]
    return Schedule(make_collective("broadcast", 4, chunks, 0), "fully-connected-4", tuple(transfers), 3)


def test_the_relay_needs_a_step_per_sent_chunk_less_its_merged_receives():
    relay = rank_floors(_split_broadcast(4096))[1]
    # receives: 4096 contiguous chunks from rank 0 in messages of at most 71 (58); sends: 4096 single chunks; each
    # received message may carry one send on
    assert (relay.received, relay.sent, relay.forwards, relay.steps, relay.threadblocks) == (58, 4096, 58, 4096, 2)


def test_a_schedule_over_the_xml_readers_elements_is_refused_before_any_lowering(monkeypatch):
    def no_lowering(*args, **kwargs):
        raise AssertionError("a lowering was tried")

    monkeypatch.setattr("backends.msccl.writer.fit_lowering", no_lowering)
    monkeypatch.setattr(fit, "fit_lowering", no_lowering)
    with pytest.raises(BackendError) as caught:
        emit_verified_xml(_split_broadcast(4096), load_topology("fully-connected-4"), "executor", 1 << 30)
    assert str(caught.value) == (
        "refusing to write MSCCL XML for the executor runtime: rank 1 loads at least 4103 XML elements whatever "
        "the lowering (the <algo>, 4 <gpu>, at least 2 <tb> and 4096 <step>: 58 messages received and 4096 sent, "
        "at most 58 of them forwarded by fused steps); the runtimes' XML reader holds at most 4095")


def test_a_schedule_within_the_elements_is_not_refused():
    assert element_floor_reason(_split_broadcast(4000), "executor") is None
