"""Broadcast and Reduce as chains round each node's ring (synth.synthesis.rooted.chain_paths): every rank takes each
chunk once (Reduce: sends one partial sum of each chunk and takes at most one), the programs run correctly and as
planned, and chains are offered only where some GPUs carry no rail and the pipeline is long."""

from collections import Counter

import numpy as np
import pytest

from backends.msccl.fit import Lowering, lower_fitted
from backends.msccl.simulate import simulate_program
from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.model.collectives import make_collective
from synth.model.topology import compose_nodes, load_topology, topology_from_dict
from synth.schedule.ir import REDUCE, Schedule, Transfer
from synth.schedule.list_scheduler import list_schedule
from synth.schedule.replay import verify
from synth.synthesis.rooted import (_rail_last, chain_chunk_options, chain_paths, compose,
                                    synthesize_rooted)

GIB = 1 << 30


def half_railed_node(gpus: int) -> dict:
    """``gpus`` GPUs on an NVSwitch (125 GB/s each), a 12.5 GB/s NIC per two GPUs: a small DGX-2."""
    return {"format": "synth-topology/1", "name": f"half-railed-{gpus}", "ranks": gpus, "gpus_per_node": gpus,
            "switches": [{"name": "nvswitch", "alpha_us": 0.35,
                          "ports": [{"ranks": [r], "bw_GBps": 125.0} for r in range(gpus)]}],
            "nics": [{"ranks": [r, r + 1], "bw_GBps": 12.5, "alpha_us": 2.6} for r in range(0, gpus, 2)]}


@pytest.fixture(scope="module")
def two_small_dgx2():
    return compose_nodes(topology_from_dict(half_railed_node(4)), 2)


@pytest.mark.parametrize("name,root", [("dgx2", 0), ("dgx2", 5), ("dgx2", 19), ("dgx2-2node-tecc", 0),
                                       ("dgx2-2node-tecc", 7)])
def test_every_rank_sends_each_chunk_once_and_takes_at_most_one_partial_sum_through_its_switch(name, root):
    topo = load_topology(name, nodes=2) if name == "dgx2" else load_topology(name)
    paths = chain_paths(topo, "reduce", 16, root)
    for path in paths:
        senders = Counter(u for u, _ in path)
        receivers = Counter(v for _, v in path)
        switched = Counter(v for u, v in path if topo.node_of(u) == topo.node_of(v))
        assert all(topo.link(u, v) is not None for u, v in path)
        assert sorted(senders) == sorted(set(range(topo.num_ranks)) - {root}) and set(senders.values()) == {1}
        assert root not in senders and max(switched.values()) == 1
        assert max(receivers.values()) <= 2    # the rail's entry: its node's ring and the rail meet there
        parent = dict(path)
        for rank in senders:                   # each partial sum reaches the root, no cycle
            seen = {rank}
            while rank != root:
                rank = parent[rank]
                assert rank not in seen
                seen.add(rank)
    crossing = Counter(u for path in paths for u, v in path if topo.node_of(u) != topo.node_of(v))
    assert set(crossing.values()) == {2}       # 16 chunks over 8 rails


@pytest.mark.parametrize("name,root", [("dgx2", 0), ("dgx2", 19), ("dgx2-2node-tecc", 7)])
def test_broadcast_chains_reach_every_rank_once_from_the_root(name, root):
    topo = load_topology(name, nodes=2) if name == "dgx2" else load_topology(name)
    paths = chain_paths(topo, "broadcast", 16, root)
    for path in paths:
        have = {root}
        for u, v in path:                      # parents first
            assert u in have and v not in have and topo.link(u, v) is not None
            have.add(v)
        assert have == set(range(topo.num_ranks))
        # each rank passes the chunk on through its switch port at most once (a rail's sender also on its NIC)
        ports = Counter(topo.link(u, v).sender_port for u, v in path)
        assert set(ports.values()) == {1}
        crossing = [h for h, (u, v) in enumerate(path) if topo.node_of(u) != topo.node_of(v)]
        assert len(crossing) == 1 and crossing[0] <= 1    # across at once: the rails wait for one hop at most
    crossing = Counter(u for path in paths for u, v in path if topo.node_of(u) != topo.node_of(v))
    assert set(crossing.values()) == {2}


@pytest.mark.parametrize("name,root", [("dgx2", 0), ("dgx2", 19), ("dgx2-2node-tecc", 7)])
def test_fused_broadcast_chains_go_round_one_ring_so_the_root_sends_to_one_peer(name, root):
    """The root's sends through its switch port all go to one peer, so none waits for the one before it (a ``nop``
    each, which 2048 chunks cannot afford); every rank still takes each chunk once, and passes it on through its
    switch port once."""
    topo = load_topology(name, nodes=2) if name == "dgx2" else load_topology(name)
    paths = chain_paths(topo, "broadcast", 16, root, fused=True)
    for path in paths:
        have = {root}
        for u, v in path:
            assert u in have and v not in have and topo.link(u, v) is not None
            have.add(v)
        assert have == set(range(topo.num_ranks))
        assert set(Counter(topo.link(u, v).sender_port for u, v in path).values()) == {1}
    root_peers = {v for path in paths for u, v in path if u == root and topo.node_of(v) == topo.node_of(root)}
    assert len(root_peers) == 1


def test_a_rails_partial_sum_is_received_last_where_it_joins_its_nodes(two_small_dgx2):
    """The fused lowering forwards from a chunk's last receive (in step order), so every entry must forward from its
    rail alike: a booking that numbered the node's partial sum later (each hop a step here) is renumbered."""
    topo = two_small_dgx2
    paths = chain_paths(topo, "reduce", 2, 0)
    transfers = tuple(Transfer(c, u, v, h, REDUCE) for c, path in enumerate(paths) for h, (u, v) in enumerate(path))
    schedule = Schedule(make_collective("reduce", topo.num_ranks, 2, 0), topo.name, transfers,
                        max(t.step for t in transfers) + 1)

    def rails_last(s: Schedule) -> bool:
        into: dict = {}
        for t in s.transfers:
            into.setdefault((t.dst, t.chunk), []).append(t)
        merges = [ts for ts in into.values() if len(ts) == 2]
        assert len(merges) == 2
        return all(topo.node_of(last.src) != topo.node_of(last.dst)
                   for last in (max(ts, key=lambda t: (t.step, t.src)) for ts in merges))

    assert not rails_last(schedule)
    renumbered = _rail_last(schedule, topo)
    assert rails_last(renumbered)
    assert verify(renumbered, topo, GIB).time_us == pytest.approx(verify(schedule, topo, GIB).time_us)


@pytest.mark.parametrize("design", ["chain", "chain/fused"])
def test_reduce_chains_run_correctly_and_as_planned(two_small_dgx2, design):
    topo = two_small_dgx2
    schedule = compose(topo, "reduce", 64, GIB, design=design)
    plan = verify(schedule, topo, GIB)         # every contribution summed into the root once
    # the verified writer executes the program (postcondition) and times it with the runtime's FIFO depth
    xml = emit_verified_xml(schedule, topo, "executor", GIB, plan_us=plan.time_us)
    assert abs(xml.simulated_us - plan.time_us) <= 0.03 * xml.simulated_us
    assert xml.simulated_us <= lower_bound("reduce", topo, GIB, root=0).limit_us / 0.95


@pytest.mark.parametrize("design", ["chain", "chain/fused"])
def test_broadcast_chains_run_correctly_and_as_planned(two_small_dgx2, design):
    # the plan times the relays as they come, as the runtime runs them
    topo = two_small_dgx2
    schedule = compose(topo, "broadcast", 64, GIB, design=design)
    plan = verify(schedule, topo, GIB)
    xml = emit_verified_xml(schedule, topo, "executor", GIB, plan_us=plan.time_us)
    assert abs(xml.simulated_us - plan.time_us) <= 0.03 * xml.simulated_us
    assert xml.simulated_us <= lower_bound("broadcast", topo, GIB, root=0).limit_us / 0.95


def test_chains_are_offered_where_some_gpus_carry_no_rail_and_the_pipeline_is_long():
    dgx2 = load_topology("dgx2", nodes=2)
    for collective in ("broadcast", "reduce"):
        # fused relays hold 2048 chunks (32 channels of 64 steps), where chunks are large against latency
        assert chain_chunk_options(dgx2, collective, GIB) == (1024, 2048)
        assert chain_chunk_options(dgx2, collective, 64 << 20) == (1024,)
        assert chain_chunk_options(dgx2, collective, 1 << 20) == ()                  # fill and drain would dominate
        assert chain_chunk_options(dgx2, collective, 1 << 20, chunks=8) == (8,)
        assert chain_chunk_options(load_topology("dgx-h100", nodes=2), collective, GIB) == ()   # a NIC per GPU
        assert chain_chunk_options(load_topology("ndv2", nodes=2), collective, GIB) == ()      # no NVSwitch
        assert chain_paths(load_topology("dgx2", nodes=3), collective, 4, 0) is None


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_candidates_are_chains_where_chains_are_offered(two_small_dgx2, collective):
    found = synthesize_rooted(two_small_dgx2, collective, 64 << 20)
    assert found and all(c.label.startswith("rooted/chain/") for c in found)
    assert all(c.schedule.collective.runs_at_power_of_two_sizes for c in found)
    user = synthesize_rooted(two_small_dgx2, collective, 64 << 20, chunks=8)
    chains = ["rooted/chain/c8", "rooted/chain/fused/c8"] if collective == "reduce" else ["rooted/chain/c8"]
    assert sorted(c.label for c in user) == sorted(["rooted/c8"] + chains)


# the list scheduler's timings of connections cut over channels (cut="position": the plain lowering of long
# connections; "fused": fused chains) let relays go as their data comes, and each plans what its file runs


def test_an_unknown_cut_is_refused(two_small_dgx2):
    topo = two_small_dgx2
    routes = [tuple(topo.link_index[e] for e in path) for path in chain_paths(topo, "broadcast", 4, 0)]
    with pytest.raises(ValueError, match="unknown cut 'lanes'; use chunk, position, fused"):
        list_schedule(topo, make_collective("broadcast", topo.num_ranks, 4, 0), routes, GIB, "t",
                      rank=np.zeros(sum(map(len, routes))), rule="sequence", cut="lanes")


@pytest.mark.parametrize("collective,design,lowering", [
    ("broadcast", "chain", Lowering(fuse=False, channels=4)),
    ("reduce", "chain/fused", Lowering(fuse=True, channels=4, in_link_order=True)),
])
def test_each_timing_plans_what_its_lowering_runs(two_small_dgx2, collective, design, lowering):
    topo = two_small_dgx2
    schedule = compose(topo, collective, 256, GIB, design=design)
    plan_us = verify(schedule, topo, GIB).time_us
    program = lower_fitted(schedule, topo, "executor", lowering)
    assert abs(simulate_program(program, topo, GIB).time_us - plan_us) <= 0.01 * plan_us
