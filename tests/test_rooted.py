"""Rooted collectives across nodes (synth.synthesis.rooted): trees that reach every rank once, programs that run
correctly in the executor and simulate near the bound, chosen through the normal candidate path."""

from collections import Counter

import pytest

from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.model.topology import compose_nodes, load_topology, topology_from_dict
from synth.schedule.replay import verify
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.solve import solve
from synth.synthesis.rooted import (RootedRoutes, _square, applies, chunk_options, compose, latin_steps,
                                     latin_threadblocks, latin_trees)
from synth.synthesis.select import hierarchy_applies, hierarchy_candidates

GIB = 1 << 30


def nvswitch_node(gpus: int) -> dict:
    """One node of ``gpus`` GPUs on an NVSwitch (450 GB/s per GPU), a 50 GB/s NIC per GPU: a small DGX H100."""
    return {"format": "synth-topology/1", "name": f"nvswitch-{gpus}", "ranks": gpus, "gpus_per_node": gpus,
            "switches": [{"name": "nvswitch", "alpha_us": 0.6,
                          "ports": [{"ranks": [r], "bw_GBps": 450.0} for r in range(gpus)]}],
            "nics": [{"ranks": [r], "bw_GBps": 50.0, "alpha_us": 2.0} for r in range(gpus)]}


@pytest.fixture(scope="module")
def two_small_nodes():
    return compose_nodes(topology_from_dict(nvswitch_node(4)), 2)


@pytest.mark.parametrize("name,nodes,root", [("dgx-h100", 2, 0), ("dgx-h100", 2, 11), ("dgx2", 2, 5),
                                             ("ndv2", 2, 3), ("dgx-h100", 3, 9)])
def test_every_chunk_tree_reaches_every_rank_once_and_the_root_hands_out_each_chunk_once(name, nodes, root):
    topo = load_topology(name, nodes=nodes)
    routes = RootedRoutes(topo, root)
    g = topo.gpus_per_node
    root_node = range(root - root % g, root - root % g + g)
    star = routes.nodes.kind == "star"
    for chunk in range(2 * len(routes.rails) * g):
        tree = routes.tree(chunk)
        reached = [v for _, v in tree]
        assert sorted(reached) == sorted(set(range(topo.num_ranks)) - {root})
        have = {root}
        for u, v in tree:      # parents first
            assert u in have and topo.link(u, v) is not None
            have.add(v)
        if star:   # through its switch port the root sends every chunk once
            assert sum(1 for u, v in tree if u == root and v in root_node) == 1


def test_every_nic_carries_the_same_share(two_small_nodes):
    routes = RootedRoutes(two_small_nodes, 0)
    crossing = Counter(u for c in range(64) for u, v in routes.tree(c) if u // 4 != v // 4)
    assert crossing == {u: 16 for u in range(4)}


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_two_nvswitch_nodes_run_correctly_and_simulate_within_6_percent_of_the_bound(two_small_nodes, collective):
    schedule = compose(two_small_nodes, collective, 64, GIB)
    plan = verify(schedule, two_small_nodes, GIB)
    # the verified writer executes the program (postcondition) and times it with the runtime's FIFO depth
    xml = emit_verified_xml(schedule, two_small_nodes, "executor", GIB, plan_us=plan.time_us)
    limit = lower_bound(collective, two_small_nodes, GIB, root=0).limit_us
    assert xml.simulated_us <= limit / 0.94
    assert abs(xml.simulated_us - plan.time_us) <= 0.03 * xml.simulated_us


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_two_ndv2_nodes_through_one_nic_simulate_within_7_percent_of_the_bound(collective):
    topo = load_topology("ndv2", nodes=2)
    schedule = compose(topo, collective, 16, GIB)
    xml = emit_verified_xml(schedule, topo, "executor", GIB, plan_us=verify(schedule, topo, GIB).time_us)
    assert xml.simulated_us <= lower_bound(collective, topo, GIB, root=0).limit_us / 0.93


def test_rooted_composition_applies_to_rooted_collectives_on_several_nodes_only():
    assert applies(load_topology("dgx-h100", nodes=2), "bcast")
    assert applies(load_topology("dgx2-2node-tecc"), "reduce")
    assert applies(load_topology("dgx2-2node-tecc"), "gather")
    assert not applies(load_topology("ndv2", nodes=2), "scatter")      # paths need an NVSwitch node
    assert not applies(load_topology("dgx-h100"), "broadcast")
    assert not applies(load_topology("dgx-h100", nodes=2), "allgather")


def test_a_reduce_whose_reversed_nodes_have_no_rails_round_them_is_left_to_the_other_plans():
    # TE-CCL's NDv2 x4 joins node k to k + 1 only: the Broadcast composes, the Reduce (on the reversed links)
    # does not, and `synth solve reduce` writes another plan instead of stopping with "no link from node 0 to 1"
    topo = load_topology("ndv2-4node-tecc")
    assert applies(topo, "broadcast") and not applies(topo, "reduce")
    solution = solve(SynthesisRequest(topo, "reduce", 1 << 10))
    assert not solution.chosen.candidate.label.startswith("rooted")
    assert solution.chosen.simulated_us <= solution.comparison.limit_us / 0.95


@pytest.mark.parametrize("collective,chunks,rule", [("scatter", 8, "tail"), ("gather", 16, "work")])
def test_scatter_and_gather_use_the_roots_switch_port_and_nic_together_and_simulate_at_the_bound(
        collective, chunks, rule):
    # on 2 x dgx-h100 the bound is the root's egress (ingress for Gather): switch port and NIC together
    topo = load_topology("dgx-h100", nodes=2)
    schedule = compose(topo, collective, chunks, GIB, rule=rule)
    root_nic = {(0, v) for v in range(8, 16)} | {(v, 0) for v in range(8, 16)}
    assert any((t.src, t.dst) in root_nic for t in schedule.transfers)
    plan = verify(schedule, topo, GIB)
    xml = emit_verified_xml(schedule, topo, "executor", GIB, plan_us=plan.time_us)
    assert xml.simulated_us <= lower_bound(collective, topo, GIB, root=0).limit_us / 0.99


def test_gather_takes_links_that_exist_where_the_published_model_has_one_way_rails():
    topo = load_topology("dgx2-2node-tecc")     # odd GPUs reach the other node's even ones only
    schedule = compose(topo, "gather", 2, GIB, root=4)
    assert all(topo.link(t.src, t.dst) is not None for t in schedule.transfers)
    verify(schedule, topo, GIB)


def test_auto_takes_rooted_candidates_for_a_two_node_broadcast(two_small_nodes):
    request = SynthesisRequest(two_small_nodes, "broadcast", 64 << 20)
    assert hierarchy_applies(request)
    found = hierarchy_candidates(request)
    assert found and all(c.label.startswith("rooted/c") for c in found)
    assert all(c.result.schedule.collective.runs_at_power_of_two_sizes for c in found)


@pytest.mark.parametrize("m", [3, 7, 15])
def test_latin_steps_make_every_peer_receive_once_per_slot(m):
    steps = latin_steps(m)
    assert sorted(steps) == list(range(1, m)) and sorted((d - k) % m for k, d in enumerate(steps, 1)) == \
        list(range(1, m))
    assert latin_steps(8) is None


@pytest.mark.parametrize("name,root,far", [("dgx-h100", 0, True), ("dgx2", 0, True), ("dgx-h100", 11, False),
                                            ("dgx2", 5, False), ("dgx2-2node-tecc", 0, False)])
def test_latin_trees_reach_every_rank_once_and_no_port_is_asked_twice_in_a_slot(name, root, far):
    # ``far``: every NIC crosses without waiting, so the other node's square holds for every chunk too
    topo = load_topology(name, nodes=2) if name in ("dgx-h100", "dgx2") else load_topology(name)
    routes = RootedRoutes(topo, root)
    trees = latin_trees(topo, routes, 64, GIB / 64)
    assert trees is not None
    sends, receives = Counter(), Counter()
    for tree in trees:
        assert sorted(v for _, v in tree.edges) == sorted(set(range(topo.num_ranks)) - {root})
        have = {root}
        for (u, v), slot in zip(tree.edges, tree.rank):
            assert u in have and topo.link(u, v) is not None
            have.add(v)
            if topo.node_of(u) == topo.node_of(v) and (far or topo.node_of(u) == topo.node_of(root)):
                sends[(u, slot)] += 1       # switch ports: one chunk per slot each way
                receives[(v, slot)] += 1
    assert max(sends.values()) == 1 and max(receives.values()) == 1
    crossing = Counter(u for t in trees for u, v in t.edges if topo.node_of(u) != topo.node_of(v))
    assert set(crossing.values()) == {64 // len(routes.rails)}


def test_square_is_a_list_edge_colouring():
    phases = (0, 2, 3, 4, 5, 6, 7, 8)
    square = _square(8, 10, phases, 2, (1,))
    for j, targets in enumerate(square):
        assert sorted(targets) == [b for b in range(8) if b != j]
    for x in range(10):
        at = [b for j, targets in enumerate(square) for i, b in enumerate(targets) if (phases[j] + 2 + i) % 10 == x]
        at += [j for j in range(8) if (phases[j] + 1) % 10 == x]       # each receives its own at slot 1
        assert len(at) == len(set(at))


@pytest.mark.parametrize("name,chunks,percent", [("dgx-h100", 64, 83.0), ("dgx2", 32, 65.0)])
def test_two_node_broadcast_runs_as_planned(name, chunks, percent):
    # with 1024 chunks 2 x dgx-h100 Broadcast 1 GB simulates at 98.4% of the limit (benchmarks); here the same
    # composition, small enough to be quick: the plan is what the simulator runs, within 3%
    topo = load_topology(name, nodes=2)
    schedule = compose(topo, "broadcast", chunks, GIB)
    plan = verify(schedule, topo, GIB)
    xml = emit_verified_xml(schedule, topo, "executor", GIB, plan_us=plan.time_us)
    assert xml.simulated_us <= lower_bound("broadcast", topo, GIB, root=0).limit_us / (percent / 100)
    assert abs(xml.simulated_us - plan.time_us) <= 0.03 * xml.simulated_us


def test_a_large_two_node_reduce_takes_the_reversal_that_books_best_and_runs_as_planned():
    # at 4 GB a chunk slot holds the far node's Latin square, which speeds the Broadcast, but its reversal was
    # booked 23% behind the bound (256 chunks: 14097 us) and the file ran 18% faster than that plan (1024 chunks);
    # the trees' reversal is booked at 95.4% of the limit and its file runs as planned
    topo = load_topology("dgx-h100", nodes=2)
    size = 4 * GIB
    schedule = compose(topo, "reduce", 256, size)
    plan = verify(schedule, topo, size)
    xml = emit_verified_xml(schedule, topo, "executor", size, plan_us=plan.time_us)
    assert plan.time_us <= lower_bound("reduce", topo, size, root=0).limit_us / 0.95
    assert abs(xml.simulated_us - plan.time_us) <= 0.03 * xml.simulated_us


def test_latin_squares_are_not_offered_with_more_chunks_than_the_gpus_threadblocks_hold():
    # 2 x dgx2 (80 SMs): a Latin square of 1024 chunks needs 90 threadblocks by the estimate (its file was refused
    # with 229); 2 x dgx-h100 (132 SMs) holds 1024
    assert latin_threadblocks(15, 1024, "executor") > 80 >= latin_threadblocks(15, 512, "executor")
    assert max(chunk_options(load_topology("dgx2", nodes=3), "broadcast", GIB)) == 512
    assert max(chunk_options(load_topology("dgx-h100", nodes=2), "broadcast", GIB)) == 1024


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100"])
def test_small_broadcasts_spread_a_chunk_per_rail_message_slot(name):
    """At 64 KB a chunk per rail per FIFO slot (8 rails x 2 = 16 chunks) never waits on a FIFO, however small,
    and spread over up to 8 channels a connection 4 times that: its file simulates faster than with one chunk
    (2 x dgx-h100: 4.93 us with one chunk, 3.49 us with 16, 3.40 with 64), above 90% of the limit."""
    topo = load_topology(name, nodes=2)
    size = 64 << 10
    assert max(chunk_options(topo, "broadcast", size)) == max(chunk_options(topo, "reduce", size)) == 64
    times = {}
    for chunks in (1, 16):
        schedule = compose(topo, "broadcast", chunks, size)
        plan = verify(schedule, topo, size)
        times[chunks] = emit_verified_xml(schedule, topo, "executor", size, plan_us=plan.time_us).simulated_us
    assert times[16] < 0.8 * times[1]
    assert times[16] <= lower_bound("broadcast", topo, size, root=0).limit_us / 0.9


def test_a_1mb_broadcast_on_more_channels_runs_as_planned():
    """2 x dgx-h100 Broadcast 1 MB with 64 chunks, timed on up to 8 channels a connection: planned within 3% of
    its file, which runs at least 15% faster than 16 chunks (8.01 us)."""
    topo = load_topology("dgx-h100", nodes=2)
    size = 1 << 20
    simulated = {}
    for chunks in (16, 64):
        schedule = compose(topo, "broadcast", chunks, size)
        plan = verify(schedule, topo, size)
        simulated[chunks] = emit_verified_xml(schedule, topo, "executor", size, plan_us=plan.time_us).simulated_us
        if chunks == 64:
            assert abs(simulated[64] - plan.time_us) <= 0.03 * simulated[64]
    assert simulated[64] < 0.85 * simulated[16]
