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
    """A Broadcast pipelined in 2000 pieces down the chain 0 -> 1 -> 2 -> 3 of ring-4: 2000 messages per
    connection need all 32 channels (63 steps; 31 channels hold 1984), and a relay's 4000 steps, 64 threadblocks,
    4 gpus and the algo are 4069 of the 4095 XML elements a rank's load holds (2048 pieces would be 4165)."""
    from synth.model.collectives import make_collective
    from synth.schedule.ir import Schedule, Transfer

    chain = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(2000) for r in range(3))
    return Schedule(make_collective("broadcast", 4, 2000, 0), "ring-4", chain, 2002), load_topology("ring-4")


def test_the_fit_takes_every_channel_before_merging_steps(long_chain):
    # from 31 channels (67 steps) the search went to 32 channels with cnt <= 2, never trying 32 unmerged
    from backends.msccl.fit import Lowering, fit_lowering

    schedule, ring4 = long_chain
    fit = fit_lowering(schedule, ring4, "executor", fuse=False)
    assert fit.fits and fit.lowering == Lowering(False, 32, 1, balanced=True)


def test_a_merged_fused_lowering_does_not_win_ties_over_an_unmerged_one(long_chain):
    # fused chains leave channel 0 to plain steps, so 2000 pieces need cnt <= 2 there; plain fits unmerged
    from backends.msccl.writer import emit_verified_xml

    schedule, ring4 = long_chain
    emitted = emit_verified_xml(schedule, ring4, "executor", GB)
    assert (emitted.lowering.fuse, emitted.lowering.max_cnt) == (False, 1)


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
