"""The replay check: it proves postconditions exactly and refuses broken schedules with a reason."""

import dataclasses

import pytest

from synth.model.collectives import make_collective
from synth.errors import VerificationError
from synth.schedule.replay import check_links, replay_data, replay_time, verify
from synth.schedule.ir import REDUCE, Schedule, Transfer
from synth.synthesis.steps import synthesize_steps


def ring_allgather(n=4):
    tr = tuple(Transfer(r, (r + s) % n, (r + s + 1) % n, s) for r in range(n) for s in range(n - 1))
    return Schedule(make_collective("allgather", n), f"ring-{n}", tr, n - 1, n - 1, (1,) * (n - 1))


def test_ring_allgather_time_is_the_closed_form(ring4):
    size = 1 << 20
    report = verify(ring_allgather(), ring4, size)
    chunk_us = size / 4 / 25e3
    assert report.time_us == pytest.approx(3 * (chunk_us + 0.7))  # store-and-forward: every hop pays alpha
    assert report.algbw_GBps == pytest.approx(size / (report.time_us * 1e3))
    assert report.busbw_GBps == pytest.approx(report.algbw_GBps * 3 / 4)


def test_missing_transfer_is_named(ring4):
    sched = ring_allgather()
    broken = dataclasses.replace(sched, transfers=sched.transfers[1:])
    with pytest.raises(VerificationError, match="never receives chunk 0|sends chunk 0 .* before holding it"):
        verify(broken, ring4, 1024)


def test_sending_before_holding_is_caught():
    sched = ring_allgather()
    swapped = tuple(dataclasses.replace(t, step=0) for t in sched.transfers)
    assert any("before holding it" in p for p in replay_data(dataclasses.replace(sched, transfers=swapped)))


def test_double_reduction_is_caught(dgx1):
    sched = synthesize_steps(dgx1, "reducescatter", 2, 3, 2).schedule
    first = next(t for t in sched.transfers if t.step == 1)
    extra = Transfer(first.chunk, first.src, first.dst, 1, REDUCE)
    doubled = dataclasses.replace(sched, transfers=sched.transfers + (extra,))
    problems = replay_data(doubled)
    assert any("counted too often" in p for p in problems)


def test_link_capacity_per_step_is_checked(ring4):
    sched = ring_allgather()
    tight = dataclasses.replace(sched, transfers=sched.transfers + (Transfer(0, 0, 1, 1),), rounds_per_step=(1, 1, 1))
    assert any("carries 2 chunks in step 1, capacity 1" in p for p in check_links(tight, ring4))


def test_transfer_over_a_missing_link_is_caught(ring4):
    sched = ring_allgather()
    bad = dataclasses.replace(sched, transfers=sched.transfers + (Transfer(0, 0, 2, 0),))
    assert any("no such link" in p for p in check_links(bad, ring4))


def test_latency_overlaps_on_a_link_unless_alpha_occupies_it(ring4):
    # two chunks queued on link 0->1 in one step: the second waits only for the first's bandwidth use
    coll = make_collective("broadcast", 4, chunks_per_rank=2)
    sched = Schedule(coll, "ring-4", (Transfer(0, 0, 1, 0), Transfer(1, 0, 1, 0)), 1)
    size = 1 << 20
    beta = size / 2 / 25e3
    assert replay_time(sched, ring4, size).time_us == pytest.approx(2 * beta + 0.7)
    assert replay_time(sched, ring4, size, alpha_occupies=True).time_us == pytest.approx(2 * beta + 2 * 0.7)
