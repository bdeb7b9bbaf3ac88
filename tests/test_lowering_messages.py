"""Whole-buffer messages at small sizes: one step each, dependencies per message, and the latency that follows.

At 1 KB a plan costs its alphas. A message of several chunks lowered chunk by chunk pays the link's alpha once per
two chunks (the runtime keeps two messages in flight on a connection); lowered whole (dependencies per message,
merged), it pays it once. The figures below are what the cost model allows and no schedule can beat.
"""

from __future__ import annotations

from collections import Counter

import pytest

from backends.msccl.fit import fit_lowering, has_multi_chunk_messages, in_flight_channels, whole_message_fit
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.simulate import simulate_program
from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.model.topology import load_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.synthesis.baselines import build_baseline
from synth.synthesis.baselines.all_pairs import DIRECT_EXCHANGE
from synth.synthesis.baselines.shortest import SHORTEST_PATH, ShortestPathRoutes

KB = 1024


def _runs(steps):
    """Non-nop steps in runs of one type (one message each here), with the nops in front of each step."""
    runs, nops = [], 0
    for st in steps:
        if st.type == "nop":
            nops += 1
            continue
        if runs and runs[-1][-1][0].type == st.type:
            runs[-1].append((st, nops))
        else:
            runs.append([(st, nops)])
        nops = 0
    return runs


def test_a_message_waits_once_for_each_message_before_it_and_only_at_its_first_chunk():
    # dgx-h100 direct exchange: every rank adds each peer's whole buffer (8 chunks) into its own, one message per peer
    topo = load_topology("dgx-h100")
    schedule = build_baseline(DIRECT_EXCHANGE, "allreduce", topo)
    program = lower_to_msccl(schedule, topo, per_message=True)
    for gpu in program.gpus:
        for tb in gpu.tbs:
            for run in _runs(tb.steps):
                assert len(run) == 8                                     # one message: the buffer's 8 chunks
                assert all(st.depid == -1 and nops == 0 for st, nops in run[1:])
                first, nops = run[0]
                # one wait per threadblock waited for (a nop each but the last, which the step itself carries)
                assert nops + (first.depid >= 0) <= len(gpu.tbs) - 1
    # merged, each threadblock moves its one message in one step of the whole buffer
    merged = whole_message_fit(schedule, topo, "executor", fuse=True)
    assert merged is not None and merged.lowering.per_message
    for gpu in merged.program.gpus:
        for tb in gpu.tbs:
            moves = [st for st in tb.steps if st.type != "nop"]
            assert [st.cnt for st in moves] == [8]


def test_a_whole_message_pays_its_alpha_once():
    # dgx-h100 x2: every GPU pair is linked (each GPU its own 50 GB/s NIC), so the exchange is one hop of 2.0 us.
    # No plan is faster: a rank's buffer must reach each of the 8 GPUs of the other node directly (relaying through
    # NVLink adds 0.6 us), 8 KB through its NIC; in turns, no receiver's NIC queues them, so the last arrives then.
    topo = load_topology("dgx-h100", 2)
    schedule = build_baseline(DIRECT_EXCHANGE, "allreduce", topo)
    assert schedule.notes["exchange_groups"] == [[list(range(16))]]
    assert has_multi_chunk_messages(schedule)
    nic_GBps = min(link.capacity_GBps for link in topo.links if topo.node_of(link.src) != topo.node_of(link.dst))
    optimum = 2.0 + 8 * KB / (nic_GBps * BYTES_PER_US_PER_GBPS)
    whole = whole_message_fit(schedule, topo, "executor", fuse=True)
    assert simulate_program(whole.program, topo, KB).time_us == pytest.approx(optimum)
    assert lower_bound("allreduce", topo, KB).latency_us >= 0.9 * optimum    # within 10% of the alpha-diameter
    # chunk by chunk (the fit search keeps the smallest cnt that fits: 16 chunks on 4 channels), a connection holds
    # two messages in flight, so its 4 chunks per channel pay the 2.0 us alpha twice in a row
    per_chunk = fit_lowering(schedule, topo, "executor", fuse=True)
    assert per_chunk.lowering.max_cnt == 1 and not per_chunk.lowering.per_message
    assert simulate_program(per_chunk.program, topo, KB).time_us > 2 * 2.0


def test_pipelined_chunks_are_not_offered_whole():
    # a chain that sends one chunk per step has no message to send whole
    topo = load_topology("ring-4")
    schedule = build_baseline("ring", "allgather", topo, chunks_per_rank=2)
    assert not has_multi_chunk_messages(schedule)
    assert whole_message_fit(schedule, topo, "executor", fuse=True) is None


def test_shortest_paths_reach_the_nic_bound_on_two_ndv2_nodes():
    # ndv2 x2: every GPU reaches every GPU of the other node through the node's one NIC (12.5 GB/s, 1.3 us). An
    # Allgather of 1 KB faster than 2.0 us (NVLink 0.7 + 1.3) must send each of the 64 cross pairs' 64 B shards
    # directly: 4 KB through each NIC, so 1.3 us plus 4 KB / 12.5 GB/s is the best any plan can do.
    topo = load_topology("ndv2", 2)
    routes = ShortestPathRoutes(topo)
    bound = lower_bound("allgather", topo, KB)
    assert max(sum(topo.link(u, v).alpha_us for u, v in routes.path(s, d, 0))
               for s in range(16) for d in range(16) if s != d) == pytest.approx(bound.latency_us)
    schedule = build_baseline(SHORTEST_PATH, "allgather", topo)
    emitted = emit_verified_xml(schedule, topo, "executor", KB)
    assert emitted.simulated_us == pytest.approx(1.3 + 4 * KB / (12.5 * BYTES_PER_US_PER_GBPS))


def test_a_node_of_sixteen_exchanges_in_one_phase():
    # dgx2 x2: 32 GPUs are more than one group holds, so each DGX-2 node sums itself in one hop of 0.35 us (two
    # phases of 4 before, one alpha more), then the nodes swap sums
    schedule = build_baseline(DIRECT_EXCHANGE, "allreduce", load_topology("dgx2", 2))
    assert schedule.notes["exchange_groups"] == [[list(range(16))]]
    assert schedule.steps == 2


def test_a_crowded_high_alpha_connection_gets_a_channel_per_two_messages():
    # TE-CCL's two NDv2 nodes have one link each way between them (GPU 1 -> GPU 0 of the other node, 1.3 us): by
    # shortest paths the 64 blocks of an Alltoall that cross it are 64 messages on one connection, and the runtime
    # holds two per connection and channel, so on 8 channels each channel pays the 1.3 us four times in a row
    topo = load_topology("ndv2-2node-tecc")
    schedule = build_baseline(SHORTEST_PATH, "alltoall", topo)
    plain = fit_lowering(schedule, topo, "executor", fuse=False)
    assert in_flight_channels(schedule, topo, plain, fifo_depth=2) == 32
    assert in_flight_channels(schedule, topo, plain, fifo_depth=8) is None     # LL: 8 channels hold them already
    emitted = emit_verified_xml(schedule, topo, "executor", KB)
    assert emitted.channels == 32
    assert emitted.simulated_us < 4.1 + 1.3     # less than one more crossing of the link than the alpha-diameter


def test_equally_short_paths_share_the_links_between_nodes():
    # TE-CCL's two DGX-2 nodes: eight links each way (odd GPU 2k+1 to GPU 2k of the other node), every one on a
    # shortest path from some GPU to the other node; the 16 x 16 blocks an Alltoall sends each way average 32 per
    # link (an odd GPU's own 16 must take its own link), where one search tree put 88 on one link
    topo = load_topology("dgx2-2node-tecc")
    schedule = build_baseline(SHORTEST_PATH, "alltoall", topo)
    crossing = Counter((t.src, t.dst) for t in schedule.transfers if topo.node_of(t.src) != topo.node_of(t.dst))
    assert len(crossing) == 16 and sum(crossing.values()) == 2 * 256
    assert max(crossing.values()) <= 40
