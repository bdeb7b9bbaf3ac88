"""The step floor (backends/msccl/step_floor.py): never above what a lowering holds, and a schedule over the XML
reader's limit refused before any lowering."""

from __future__ import annotations

import numpy as np
import pytest

import backends.msccl.fit as fit
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.merge import merge_contiguous
from backends.msccl.step_floor import _unique_rows, element_floor_reason, rank_floors
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
    plan = hierarchy.hierarchy_plans(two, "alltoall", 1 << 20)[0]
    yield f"2 x dgx-h100 alltoall {plan.label('alltoall')}", hierarchy.compose(two, "alltoall", plan, 1 << 20), two
    dgx1 = load_topology("dgx1")
    yield "dgx1 ring allreduce", build_baseline("ring", "allreduce", dgx1, 4), dgx1
    eight = load_topology("fully-connected-8")
    yield "fully-connected-8 all-pairs alltoall", build_baseline("all-pairs", "alltoall", eight, 1), eight


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
    if "/c1" in label and "alltoall" not in label:   # one piece per rank: little merges, and the floor is close (a
        # zero floor passes above); the PXN Alltoall relays through scratch, where the floor assumes more merging
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


def test_peers_that_forward_nothing_take_a_threadblock_each_way():
    """An all-pairs Alltoall forwards nothing: no fused chain can pair a receive peer with a send peer, so every
    lowering gives a rank a threadblock per peer and direction, and a GPU of fewer SMs is refused up front (128
    x dgx-h100: 254 threadblocks for 132 SMs, found after 30 s of fitting three baselines)."""
    from dataclasses import replace

    eight = load_topology("fully-connected-8")
    schedule = build_baseline("all-pairs", "alltoall", eight, 1)
    assert {f.threadblocks for f in rank_floors(schedule)} == {14}
    plain = lower_to_msccl(schedule, eight, 1 << 20, fuse=False)
    assert min(len(gpu.tbs) for gpu in plain.gpus) >= 14     # and one copying its own block
    reason = fit.hopeless(schedule, replace(eight, sms_per_gpu=12))
    assert reason is not None and "14" in reason and "12" in reason


def test_the_distinct_rows_are_numpys_in_numpys_order():
    """The connections' slots are deduplicated by one lexsort: the same rows in the same order as ``np.unique``
    along axis 0 (repeats, negative values, and no rows at all)."""
    rows = np.random.default_rng(3).integers(-2, 3, size=(500, 6))
    assert np.array_equal(_unique_rows(rows), np.unique(rows, axis=0))
    assert _unique_rows(rows[:0]).shape == (0, 6)
