"""How the plain lowering spreads a long connection over channels and which dependencies it writes: the program
must run in the schedule's order on every link (so it runs as planned) with as few threadblocks and steps as it
can (the executor's 64 steps per threadblock, one threadblock per SM)."""

from collections import Counter

import pytest

from backends.msccl.lowering import lower_to_msccl, render_msccl_xml
from backends.msccl.simulate import simulate_program
from backends.msccl.verdict import check_text
from synth.model.topology import load_topology
from synth.synthesis.trees import synthesize_trees

GB = 1 << 30


@pytest.fixture(scope="module")
def dgx1():
    return load_topology("dgx1")


def test_channels_take_a_connections_messages_in_turn(dgx1):
    # tree packing puts runs of one tree's chunks on a link; spread by chunk id, another channel's threadblock
    # overtook them and the file ran slower than planned; by position on the connection it runs as planned (64
    # chunks per rank: 150 messages on a double NVLink, more than a threadblock's 64 steps)
    schedule = synthesize_trees(dgx1, "allgather", GB, chunks=64).schedule
    planned = max(t.end_us for t in schedule.transfers)
    program = lower_to_msccl(schedule, topology=dgx1, fuse=False, channels=4)
    assert simulate_program(program, dgx1, GB).time_us == pytest.approx(planned, rel=1e-9)
    # a connection over one NVLink (half the messages of a double one) takes half the threadblocks
    send_tbs = Counter((g.id, tb.send) for g in program.gpus for tb in g.tbs if tb.send >= 0)
    assert (send_tbs[(0, 1)], send_tbs[(0, 2)]) == (4, 2)


def test_a_write_after_reads_waits_for_the_readers_only(dgx1):
    # Allreduce's second half overwrites each chunk its first half sent on: waiting for that send already orders
    # it after the reduction the send read, so no nop step carries a second dependency (332 nops before)
    schedule = synthesize_trees(dgx1, "allreduce", GB, chunks=16).schedule
    program = lower_to_msccl(schedule, topology=dgx1, fuse=False, channels=2)
    assert not any(step.type == "nop" for g in program.gpus for tb in g.tbs for step in tb.steps)
    assert check_text(render_msccl_xml(program), "<allreduce>", "executor").errors() == []


@pytest.fixture(scope="module")
def long_chain():
    """A Broadcast pipelined in 1024 pieces down the chain 0 -> 1 -> 2 -> 3 of ring-4: 1024 messages per
    connection, 16 channels of 64 steps exactly (2048 pieces, 32 channels, would put 4096 steps on a relay, more
    than the runtimes' XML reader holds)."""
    from synth.model.collectives import make_collective
    from synth.schedule.ir import Schedule, Transfer

    chain = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(1024) for r in range(3))
    return Schedule(make_collective("broadcast", 4, 1024, 0), "ring-4", chain, 1026), load_topology("ring-4")


def test_the_fit_takes_every_channel_before_merging_steps(long_chain):
    # with 2048 pieces, from 31 channels (67 steps) the search went to 32 channels with cnt <= 2, never trying 32
    # unmerged
    from backends.msccl.fit import Lowering, fit_lowering

    schedule, ring4 = long_chain
    fit = fit_lowering(schedule, ring4, "executor", fuse=False)
    assert fit.fits and fit.lowering == Lowering(False, 16, 1, balanced=True)


def test_a_merged_fused_lowering_does_not_win_ties_over_an_unmerged_one():
    # dgx2 Broadcast 1 GB: fused with cnt <= 2 simulated 0.7% slower than plain with cnt = 1 and was chosen; only
    # an unmerged fused lowering wins ties (within TIE), a merged one is ranked by its time as the plain ones are
    from backends.msccl.fit import Lowering
    from backends.msccl.writer import TIE, _sort_key

    plain, fused, merged_fused = Lowering(False, 4, 1), Lowering(True, 4, 1), Lowering(True, 4, 2)
    assert _sort_key(100.0, plain) < _sort_key(100.0 * (1 + TIE / 2), merged_fused)
    assert _sort_key(100.0 * (1 + TIE / 2), fused) < _sort_key(100.0, plain)


def test_balanced_channels_divide_a_connection_whose_chunks_share_a_stride():
    # on 64 x dgx-h100 on rails every chunk crossing a rail is a multiple of 8 apart: spread by chunk, 2, 4 and 8
    # channels all left a connection on one threadblock; balanced, its messages alternate
    from synth.model.collectives import make_collective
    from synth.schedule.ir import Schedule, Transfer

    strided = tuple(Transfer(c, 0, 1, step=k) for k, c in enumerate(range(0, 64, 8)))
    schedule = Schedule(make_collective("broadcast", 4, 64, 0), "ring-4", strided, len(strided))
    ring4 = load_topology("ring-4")

    def steps_per_send_tb(balance: bool) -> list[int]:
        program = lower_to_msccl(schedule, topology=ring4, fuse=False, channels=2, balance=balance)
        return sorted(len(tb.steps) for tb in program.gpus[0].tbs if tb.send == 1)

    assert steps_per_send_tb(False) == [8]
    assert steps_per_send_tb(True) == [4, 4]


def test_in_link_order_keeps_own_data_behind_the_partial_sums_it_was_planned_after(dgx1):
    # Reduce on 4 channels: a rank's own-data sends (ready at once) overtook, on another channel of the same
    # connection, the partial sums planned before them, and the file ran 8% slower than planned (4% on the
    # shallowest trees, which the packing takes since both are booked); waiting for the connection's previous
    # message (no nop: only sends that wait for nothing else) it runs as planned
    schedule = synthesize_trees(dgx1, "reduce", GB, chunks=128).schedule
    planned = max(t.end_us for t in schedule.transfers)
    loose = lower_to_msccl(schedule, topology=dgx1, fuse=False, channels=4, balance=True)
    ordered = lower_to_msccl(schedule, topology=dgx1, fuse=False, channels=4, balance=True, in_link_order=True)
    assert simulate_program(loose, dgx1, GB).time_us > 1.03 * planned
    assert simulate_program(ordered, dgx1, GB).time_us <= planned * (1 + 1e-3)
    steps = lambda program: sum(len(tb.steps) for g in program.gpus for tb in g.tbs)   # noqa: E731
    assert steps(ordered) == steps(loose)
    assert check_text(render_msccl_xml(ordered), "<reduce>", "executor").errors() == []


def test_a_lowering_over_the_sms_stops_with_the_threadblocks_it_would_have(long_chain):
    from backends.msccl.fit import fit_lowering
    from backends.msccl.lowering import OverBudget

    schedule, ring4 = long_chain
    whole = lower_to_msccl(schedule, topology=ring4, fuse=True, channels=4)
    most = max(len(g.tbs) for g in whole.gpus)
    stopped = lower_to_msccl(schedule, topology=ring4, fuse=True, channels=4, tb_budget=most - 1)
    assert isinstance(stopped, OverBudget) and stopped.threadblocks == most
    assert lower_to_msccl(schedule, topology=ring4, fuse=True, channels=4, tb_budget=most) == whole
    # the fit search words it as the verdict does
    from dataclasses import replace
    fit = fit_lowering(schedule, replace(ring4, sms_per_gpu=2), fuse=True, most_cnt=1)
    assert not fit.fits and fit.program is None
    assert fit.reason() == (f"error: tbs-per-gpu: gpu {fit.broken[0].gpu}: {fit.tbs_per_gpu} threadblocks; all must "
                            "be co-resident (one per SM) and the GPU has 2 SMs, so at most 2 (both runtimes)")
