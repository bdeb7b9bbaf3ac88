"""A rank with more peers than a channel holds (32 sending and 32 receiving threadblocks per GPU): the plain
lowering spreads whole connections over channels so that none holds more (issue 10: at 32 x dgx-h100 on rails
GPU 0 has 38 peers each way, and a split by the parity of src + dst put its 31 rail peers, all multiples of 8, and
3 NVSwitch peers on channel 0)."""

from collections import Counter

import pytest

from backends.msccl.fit import Lowering, fit_lowering, lower_fitted
from backends.msccl.limits import MAX_TBS_PER_CHANNEL_DIRECTION
from backends.msccl.lowering import render_msccl_xml
from backends.msccl.verdict import check_text
from backends.msccl.writer import emit_verified_xml
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.ir import Schedule, Transfer
from synth.schedule.replay import verify

RANKS = 68


@pytest.fixture(scope="module")
def relayed_gather():
    """Gather to rank 0 on ``fully-connected-68``: each odd rank hands its chunk to the even rank below it, and
    every even rank sends its own chunk and then the relayed one to the root. The root receives from 34 peers, 33
    of them even, as GPU 0 at 32 x dgx-h100 receives from its rail peers."""
    transfers = [Transfer(r, r, r - 1, step=0) for r in range(1, RANKS, 2)]
    for r in range(2, RANKS, 2):
        transfers += [Transfer(r, r, 0, step=0), Transfer(r + 1, r, 0, step=1)]
    topology = load_topology(f"fully-connected-{RANKS}")
    schedule = Schedule(make_collective("gather", RANKS, 1, 0), topology.name, tuple(transfers), 2)
    assert len({t.src for t in schedule.transfers if t.dst == 0}) == 34
    return topology, schedule


def most_per_channel_direction(program) -> int:
    """The most threadblocks of one GPU that send (or receive) on one channel."""
    counts = Counter((gpu.id, tb.chan, direction) for gpu in program.gpus for tb in gpu.tbs
                     for direction, peer in (("send", tb.send), ("recv", tb.recv)) if peer >= 0)
    return max(counts.values())


def test_the_schedule_is_a_gather(relayed_gather):
    topology, schedule = relayed_gather
    verify(schedule, topology, 1 << 20)


@pytest.mark.parametrize("channels", [1, 2])
def test_plain_lowering_keeps_every_channel_within_the_peers_limit(relayed_gather, channels):
    topology, schedule = relayed_gather
    program = lower_fitted(schedule, topology, "executor", Lowering(False, channels))
    assert most_per_channel_direction(program) <= MAX_TBS_PER_CHANNEL_DIRECTION
    assert [str(f) for f in check_text(render_msccl_xml(program), "<spread>", "executor").errors()] == []
    # whole connections move: the root still has one receiving threadblock per peer and channel a chunk uses
    root = program.gpus[0]
    assert len({(tb.recv, tb.chan) for tb in root.tbs}) == len(root.tbs)


def test_spreading_is_deterministic(relayed_gather):
    topology, schedule = relayed_gather
    first, second = (render_msccl_xml(lower_fitted(schedule, topology, "executor", Lowering(False, 1)))
                     for _ in range(2))
    assert first == second


def test_the_written_file_fits_and_passes_the_verdict(relayed_gather):
    topology, schedule = relayed_gather
    assert fit_lowering(schedule, topology, "executor", fuse=False).fits
    emitted = emit_verified_xml(schedule, topology, "executor", 1 << 20)
    assert most_per_channel_direction(emitted.program) <= MAX_TBS_PER_CHANNEL_DIRECTION
    assert [str(f) for f in check_text(emitted.text, "<written>", "executor").errors()] == []
