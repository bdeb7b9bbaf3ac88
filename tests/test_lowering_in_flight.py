"""Where alphas dominate, a connection's messages must not queue behind the runtime's FIFO (two messages in flight per
connection and channel with the Simple protocol): the in-flight spread gives each connection the channels its
messages fill, within the GPUs' SMs; and a fused lowering far over the SMs stops as soon as its chains are placed."""

from collections import Counter

import pytest

from backends.msccl.interpret import RUNTIME_FIFO_DEPTH
from backends.msccl.lowering import OVER_BUDGET_MARGIN, OverBudget, lower_to_msccl
from backends.msccl.simulate import simulate_program
from synth.model.topology import load_topology
from synth.schedule.replay import replay_time
from synth.synthesis.baselines import build_baseline

KB = 1 << 10


@pytest.fixture(scope="module")
def relayed_alltoall():
    """TE-CCL's two NDv2 nodes: an Alltoall along shortest paths relays each node's 64 blocks for the other over
    its one inter-node link (alpha 1.3 us)."""
    topology = load_topology("ndv2-2node-tecc")
    return build_baseline("shortest-path", "alltoall", topology, 1), topology


def _messages_per_channel(program) -> Counter:
    """Send steps per (gpu, peer, channel): the messages of a connection on one channel."""
    return Counter((gpu.id, tb.send, tb.chan) for gpu in program.gpus for tb in gpu.tbs if tb.send >= 0
                   for step in tb.steps if step.type == "s")


def test_in_flight_channels_keep_every_message_past_the_fifo_within_the_sms(relayed_alltoall):
    schedule, topology = relayed_alltoall
    fifo = RUNTIME_FIFO_DEPTH["Simple"]
    by_chunk = lower_to_msccl(schedule, topology=topology, fuse=False, channels=32)
    in_flight = lower_to_msccl(schedule, topology=topology, fuse=False, channels=32, in_flight=True)
    relayed = lambda program: [k for (gpu, peer, _), k in _messages_per_channel(program).items()  # noqa: E731
                               if (gpu, peer) in ((1, 8), (9, 0))]
    # round robin by chunk (src * 16 + dst) put the 64 blocks relayed each way on 16 channels, four behind each FIFO
    assert sorted(set(relayed(by_chunk))) == [4] and len(relayed(by_chunk)) == 32
    # in flight: the relayed blocks go two per channel on all 32, the NVLinks take what the SMs leave
    assert sorted(set(relayed(in_flight))) == [fifo] and len(relayed(in_flight)) == 64
    assert max(len(gpu.tbs) for gpu in in_flight.gpus) <= topology.sms_per_gpu
    planned_us = replay_time(schedule, topology, KB).time_us
    assert simulate_program(by_chunk, topology, KB).time_us > 1.1 * planned_us
    assert simulate_program(in_flight, topology, KB).time_us <= planned_us


def test_in_flight_gives_channels_first_where_the_queue_costs_most(relayed_alltoall):
    # on 12 SMs per GPU no connection can have all its messages in flight: the inter-node links (alpha 1.3 us)
    # take channels first, and no GPU goes over its SMs
    from dataclasses import replace

    schedule, topology = relayed_alltoall
    few = replace(topology, sms_per_gpu=12)
    program = lower_to_msccl(schedule, topology=few, fuse=False, channels=32, in_flight=True)
    assert max(len(gpu.tbs) for gpu in program.gpus) <= 12
    channels = Counter((gpu.id, tb.send) for gpu in program.gpus for tb in gpu.tbs if tb.send >= 0)
    nvlinks = max(k for (gpu, peer), k in channels.items() if (gpu, peer) not in ((1, 8), (9, 0)))
    assert min(channels[(1, 8)], channels[(9, 0)]) >= nvlinks > 1


def test_a_fused_lowering_far_over_the_sms_stops_once_its_chains_are_placed(relayed_alltoall):
    schedule, topology = relayed_alltoall
    whole = lower_to_msccl(schedule, topology=topology, fuse=True, channels=8)
    most = max(len(g.tbs) for g in whole.gpus)
    # within the margin the lowering runs to its end: the same program, or the count it ends with
    assert lower_to_msccl(schedule, topology=topology, fuse=True, channels=8, tb_budget=most) == whole
    stopped = lower_to_msccl(schedule, topology=topology, fuse=True, channels=8, tb_budget=most - 1)
    assert isinstance(stopped, OverBudget) and stopped.threadblocks >= most
    far = lower_to_msccl(schedule, topology=topology, fuse=True, channels=8,
                         tb_budget=int(most / OVER_BUDGET_MARGIN / 2))
    assert isinstance(far, OverBudget) and far.threadblocks > OVER_BUDGET_MARGIN * int(most / OVER_BUDGET_MARGIN / 2)


def test_the_writer_still_makes_the_in_flight_variants_after_a_plain_lowering_that_settles_nothing_else():
    # TE-CCL's two DGX-2 nodes: a shortest-path Allgather sends each node's 16 blocks over every one of its 8
    # network links (alpha 2.6 us), 16 messages per connection. The plain lowering on one channel left only merged
    # and whole-message variants to come, none of them for this schedule, so the writer stopped there and wrote
    # the fused lowering, 2.6 us behind its plan (two messages in flight per channel); on the channels that hold
    # them all in flight the file runs as planned.
    from backends.msccl.writer import emit_verified_xml

    topology = load_topology("dgx2-2node-tecc")
    schedule = build_baseline("shortest-path", "allgather", topology, 1)
    planned_us = replay_time(schedule, topology, KB).time_us
    emitted = emit_verified_xml(schedule, topology, "executor", KB, plan_us=planned_us)
    assert not emitted.fused and emitted.channels >= 8
    assert emitted.simulated_us == pytest.approx(planned_us, rel=1e-6)


def test_in_flight_channels_stop_where_a_threadblock_could_no_longer_be_waited_for():
    # ring-8 states no SMs; a bidirectional-ring Alltoall in 4 chunks per block wanted 129 threadblocks in flight,
    # and a dependency on threadblock 128 does not fit depid's signed byte
    from backends.msccl.limits import MAX_DEPID, runtime_limits

    topology = load_topology("ring-8")
    schedule = build_baseline("bidir-ring", "alltoall", topology, 4)
    program = lower_to_msccl(schedule, topology=topology, fuse=False, channels=32, in_flight=True)
    assert max(len(gpu.tbs) for gpu in program.gpus) <= MAX_DEPID + 1
    assert not [f for f in runtime_limits(program) if f.severity == "error"]
    assert simulate_program(program, topology, KB).time_us == pytest.approx(replay_time(schedule, topology, KB).time_us)
