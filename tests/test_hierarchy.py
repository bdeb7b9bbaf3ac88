"""Hierarchical synthesis: compositions verify, cross nodes only on rails, fit the runtime, and are wired into solve."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from backends.msccl.lowering import lower_to_msccl
from backends.msccl.simulate import simulate_program
from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.model.topology import load_topology
from synth.schedule.replay import verify
from synth.synthesis.hierarchy import (COLLECTIVES, AlltoallOrder, HierarchyPlan, RailShape, compose, cross_pieces,
                                       hierarchy_plans, node_trees, piece_options, synthesize_hierarchy)
from synth.synthesis.method import Method
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import hierarchy_applies, verified_candidates

H100X2 = load_topology("dgx-h100", nodes=2)
H100X4 = load_topology("dgx-h100", nodes=4)
GB = 1 << 30


def _crossing(schedule, topology):
    return [t for t in schedule.transfers if topology.node_of(t.src) != topology.node_of(t.dst)]


@pytest.mark.parametrize("collective, shape", [(c, s) for c in COLLECTIVES for s in RailShape
                                               if c != "alltoall" or s == RailShape.DIRECT])
def test_compositions_verify_and_cross_nodes_only_on_rails(collective, shape):
    g = H100X4.gpus_per_node
    for order in AlltoallOrder if collective == "alltoall" else [AlltoallOrder.NODE_FIRST]:
        schedule = compose(H100X4, collective, HierarchyPlan(shape, 1 if collective == "alltoall" else 2, order),
                           GB)
        verify(schedule, H100X4, GB)        # raises unless every postcondition holds
        crossing = _crossing(schedule, H100X4)
        assert crossing and all(t.src % g == t.dst % g for t in crossing)


def test_allgather_moves_each_shard_once_per_rank_and_node_links_carry_k_times_c():
    k, c = H100X4.num_nodes, 2
    schedule = compose(H100X4, "allgather", HierarchyPlan(RailShape.DIRECT, c), GB)
    n = H100X4.num_ranks
    assert len(schedule.transfers) == n * (n - 1) * c           # every rank receives every piece exactly once
    per_connection = Counter((t.src, t.dst) for t in schedule.transfers)
    inside = [m for (u, v), m in per_connection.items() if H100X4.node_of(u) == H100X4.node_of(v)]
    assert set(inside) == {k * c}                                # a node star edge carries its rail's pieces
    rails = [m for (u, v), m in per_connection.items() if H100X4.node_of(u) != H100X4.node_of(v)]
    assert set(rails) == {c}                                     # direct: each piece once to each node


def test_ring_rail_talks_to_one_node_each_way():
    schedule = compose(H100X4, "allgather", HierarchyPlan(RailShape.RING, 1), GB)
    peers = {(t.src, t.dst) for t in _crossing(schedule, H100X4)}
    assert peers == {(r, (r + 8) % 32) for r in range(32)}


def test_pipelining_reaches_the_node_bound_at_two_nodes():
    """At 2 nodes the NVSwitch carries 7/8 of the buffer per GPU: 2^30 * 7/8 / 450 GB/s = 2087.8 us."""
    one, many = (verify(compose(H100X2, "allgather", HierarchyPlan(RailShape.DIRECT, c), GB), H100X2, GB).time_us
                 for c in (1, 16))
    assert many < one and many == pytest.approx(GB * 7 / 8 / 450e3, rel=0.002)


def test_alltoall_pxn_rounds_reach_the_nic_bound():
    """Each NIC sends its node's 8 GPUs' blocks to the 3 other nodes: 3 * 8 * 2^30/32 / 50 GB/s = 16106.1 us; the
    Latin-square rounds keep every NIC busy (first-come-first-served booking left holes: 73% of this)."""
    schedule = compose(H100X4, "alltoall", HierarchyPlan(RailShape.DIRECT, 1, AlltoallOrder.NODE_FIRST), GB)
    assert verify(schedule, H100X4, GB).time_us == pytest.approx(3 * 8 * GB / 32 / 50e3, rel=0.001)
    nic_sends = Counter((t.step, t.src) for t in _crossing(schedule, H100X4))
    assert set(nic_sends.values()) == {1}        # one block per NIC per round


def test_written_program_fits_the_runtime():
    schedule = compose(H100X2, "allgather", HierarchyPlan(RailShape.DIRECT, 2), GB)
    emitted = emit_verified_xml(schedule, H100X2, "executor", GB)
    assert max(len(g.tbs) for g in emitted.program.gpus) <= H100X2.sms_per_gpu
    assert emitted.simulated_us == pytest.approx(verify(schedule, H100X2, GB).time_us, rel=0.01)


def test_node_trees_star_on_nvswitch_and_fewest_hops_on_a_mesh():
    assert node_trees(H100X2).kind == "star"
    ndv2 = load_topology("ndv2", nodes=2)
    trees = node_trees(ndv2)
    assert trees.kind == "fewest-hop trees" and all(len(edges) == 7 for edges in trees.edges)
    verify(compose(ndv2, "allreduce", HierarchyPlan(RailShape.DIRECT, 2), 1 << 20), ndv2, 1 << 20)


def test_piece_options_fit_the_step_budget_and_include_one():
    big = load_topology("dgx-h100", nodes=8)
    for collective in COLLECTIVES:
        options = piece_options(big, collective, GB)
        assert options[0] == 1 and all(c & (c - 1) == 0 for c in options)
        multiplier = 2 if collective == "allreduce" else 1
        assert all(2 * 8 * c * multiplier <= 64 * 4 for c in options)


def test_single_node_is_refused_with_the_fix():
    with pytest.raises(InputError, match="--nodes K"):
        synthesize_hierarchy(load_topology("dgx-h100"), "allgather", GB)
    with pytest.raises(InputError, match="covers"):
        synthesize_hierarchy(H100X2, "broadcast", GB)


def test_method_hierarchy_gives_hierarchy_candidates_and_auto_tries_it():
    request = SynthesisRequest(H100X2, "alltoall", 1 << 20, method=Method.HIERARCHY, include_baselines=False)
    found = verified_candidates(request)
    assert found and all(c.label.startswith("hierarchy/") for c in found)
    assert found == sorted(found, key=lambda c: c.report.time_us)
    assert hierarchy_applies(SynthesisRequest(H100X2, "allgather", GB))
    assert not hierarchy_applies(SynthesisRequest(load_topology("dgx-h100"), "allgather", GB))


def test_a_process_pool_gives_the_same_candidates_as_this_process():
    from concurrent.futures import ProcessPoolExecutor

    serial = synthesize_hierarchy(H100X2, "reducescatter", 1 << 20, pieces=2)
    with ProcessPoolExecutor(2) as pool:
        pooled = synthesize_hierarchy(H100X2, "reducescatter", 1 << 20, pieces=2, executor=pool)
    assert [c.plan for c in pooled] == [c.plan for c in serial]
    assert [c.schedule for c in pooled] == [c.schedule for c in serial]
    assert [c.report for c in pooled] == [c.report for c in serial]


def test_crossing_rails_at_two_nodes_beats_the_node_bound():
    """Half the pieces also go NIC to another rail: NICs and NVSwitch ports then finish together."""
    # a half would balance the loads, but the last piece still has its node to cross after the NIC: 15 of 32
    assert cross_pieces(H100X2, "allgather", 32, node_trees(H100X2)) == 15
    assert cross_pieces(H100X4, "allgather", 32, node_trees(H100X4)) == 1     # the NICs nearly bind already
    schedule = compose(H100X2, "allgather", HierarchyPlan(RailShape.DIRECT, 32, cross=15), GB)
    assert verify(schedule, H100X2, GB).time_us < GB * 7 / 8 / 450e3 * 0.985
    assert any(t.src % 8 != t.dst % 8 for t in _crossing(schedule, H100X2))


def test_rails_too_wide_for_one_channel_go_round_a_ring():
    """On 32 nodes a direct rail gives every GPU 31 NIC peers plus 7 node peers to send to: over one channel's 32."""

    wide = load_topology("dgx-h100", nodes=32)
    assert {p.rail for p in hierarchy_plans(wide, "allgather", GB)} == {RailShape.RING}
    assert {p.rail for p in hierarchy_plans(H100X4, "allgather", GB)} == set(RailShape)


def test_more_pieces_are_kept_only_when_clearly_faster():
    found = synthesize_hierarchy(load_topology("ndv2", nodes=2), "allgather", 1 << 20)
    for a in found:
        for b in found:
            if len(b.schedule.transfers) > len(a.schedule.transfers):
                assert b.report.time_us < a.report.time_us * 0.98


DGX2X2 = load_topology("dgx2", nodes=2)


def test_each_shard_crosses_the_network_once_and_a_crossing_piece_once_more():
    c, g = 4, DGX2X2.gpus_per_node
    plan = HierarchyPlan(RailShape.DIRECT, c, cross=1)
    schedule = compose(DGX2X2, "allgather", plan, GB)
    verify(schedule, DGX2X2, GB)
    times = Counter(t.chunk for t in _crossing(schedule, DGX2X2))
    assert {chunk: n for chunk, n in times.items()} == {chunk: 1 + plan.crosses(chunk % c)
                                                       for chunk in range(DGX2X2.num_ranks * c)}
    assert all(t.src % g == t.dst % g for t in _crossing(schedule, DGX2X2) if not plan.crosses(t.chunk % c))


def test_a_nic_two_gpus_share_gets_half_the_crossing_pieces_reach_the_limit():
    """DGX-2: two GPUs per 12.5 GB/s NIC. Crossing 3 of 8 pieces balances NIC (1.375 shards at 6.25 GB/s per GPU)
    and NVSwitch port (29.625 shards at 125 GB/s): 99.65% of the limit, where each shard crossing once is
    bound to 30 shards at 125 GB/s, 98.4%."""
    assert cross_pieces(DGX2X2, "allgather", 8, node_trees(DGX2X2)) == 3
    limit = lower_bound("allgather", DGX2X2, GB).limit_us
    once = verify(compose(DGX2X2, "allgather", HierarchyPlan(RailShape.DIRECT, 8), GB), DGX2X2, GB).time_us
    crossing = verify(compose(DGX2X2, "allgather", HierarchyPlan(RailShape.DIRECT, 8, cross=3), GB), DGX2X2,
                      GB).time_us
    assert once == pytest.approx(30 * GB / 32 / 125e3, rel=1e-3)
    assert limit / crossing > 0.995


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_a_composition_in_step_runs_as_planned(collective):
    """The plain program of a two-node composition, simulated with the runtime's FIFOs and shared ports, takes
    the plan's own time (the planned order is the one the runtime follows)."""
    schedule = compose(H100X2, collective, HierarchyPlan(RailShape.DIRECT, 4), GB)
    planned = max(t.end_us for t in schedule.transfers)
    program = lower_to_msccl(schedule, topology=H100X2, fuse=False)
    assert simulate_program(program, H100X2, GB).time_us == pytest.approx(planned, rel=1e-9)
    assert verify(schedule, H100X2, GB).time_us == pytest.approx(planned, rel=1e-3)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_a_ring_of_rails_relays_pieces_in_the_order_the_ring_brings_them(collective):
    # booked in step with relays ordered by origin (or the nearest node last), each relay waited for the piece that
    # comes last: 4 x dgx-h100 Allgather replayed at 7.6 ms for 2.1 ms of NIC and node-port load (2.5 ms in the
    # ring's order; more than two nodes are now booked greedily, which this guards too)
    from synth.synthesis.hierarchy import HierarchyPlan, RailShape, compose, volumes

    topo = load_topology("dgx-h100", 4, "rail")
    schedule = compose(topo, collective, HierarchyPlan(RailShape.RING, 1), 1 << 30)
    assert verify(schedule, topo, 1 << 30).time_us < 1.25 * volumes(topo, collective, 1 << 30).time_us


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_four_nodes_pipelined_reach_the_limit(collective):
    """4 x dgx-h100 on one switch, 16 pieces per rank: within 2% of the limit (the NVSwitch ports bind at 2080 us;
    the booking in step, made for two nodes, replayed ReduceScatter by ring at 2.2x the time of the greedy one)."""
    limit = lower_bound(collective, H100X4, GB).limit_us
    for shape in RailShape:
        schedule = compose(H100X4, collective, HierarchyPlan(shape, 16), GB)
        assert limit / verify(schedule, H100X4, GB).time_us > 0.98, shape


def test_reducescatter_reversed_from_allgather_pipelines_as_the_allgather_does():
    """ReduceScatter as the time-reversal of the Allgather composition runs in the Allgather's time, collective
    for collective, and its pieces pipeline where the greedy booking of the collecting trees falls behind
    (4 x dgx-h100 on rails, ring, 4 pieces: 2146 us against 2206 us; at 32 nodes 98.7% of the limit against 95.3%).
    It is a ReduceScatter that verifies, and auto tries both."""
    topo = load_topology("dgx-h100", 4, "rail")
    plan = HierarchyPlan(RailShape.RING, 4)
    greedy = verify(compose(topo, "reducescatter", plan, GB), topo, GB).time_us
    reversed_rs = compose(topo, "reducescatter", replace(plan, reversal=True), GB)
    allgather = verify(compose(topo, "allgather", plan, GB), topo, GB).time_us
    assert reversed_rs.collective.name == "reducescatter"
    assert verify(reversed_rs, topo, GB).time_us == pytest.approx(allgather)
    assert allgather < 0.98 * greedy
    plans = hierarchy_plans(topo, "reducescatter", GB)
    # with several pieces both, the greedy booking first: at equal replayed time the first is written (the
    # reversal's file fell behind at 8 nodes); with one piece on a NIC per GPU only the reversal (the greedy
    # booking's fused lowering on several channels falls behind its plan)
    several = [p for p in plans if p.pieces > 1 and not p.cross]
    assert {p for p in several if p.reversal} == {replace(p, reversal=True) for p in several if not p.reversal}
    assert all(plans.index(p) < plans.index(replace(p, reversal=True)) for p in several if not p.reversal)
    assert {p.reversal for p in plans if p.pieces == 1 and not p.cross} == {True}
    # where two GPUs share a NIC (4 x dgx2), the greedy booking of one piece stays, after the reversal
    dgx2 = load_topology("dgx2", 4)
    ones = [p for p in hierarchy_plans(dgx2, "reducescatter", GB, pieces=1) if not p.cross]
    assert [p.reversal for p in ones[:2]] == [True, False]
    assert not any(p.reversal for p in hierarchy_plans(topo, "allgather", GB))


def test_the_compositions_are_announced_before_they_are_made():
    # at 1024 GPUs composing and replaying take minutes: the heartbeat names them instead of "starting"
    heard = []
    topology = load_topology("dgx-h100", 4, "rail")
    found = synthesize_hierarchy(topology, "allgather", 1 << 20, progress=heard.append)
    labels = ", ".join(p.label("allgather") for p in hierarchy_plans(topology, "allgather", 1 << 20))
    assert heard[0] == (f"  hierarchy: composing {len(heard) - 1} plan(s) of one rail and one node over 4 x 8 GPUs "
                        f"({labels}), each replayed")
    assert len(heard) - 1 >= len(found)


def test_an_alltoall_over_more_peers_than_sms_is_refused_before_composing():
    """128 x dgx-h100: every GPU would receive from 127 rail peers and 7 node peers, a threadblock each, on 132
    SMs; refused at once with the node count that fits (126), where composing took four minutes."""
    from synth.errors import BackendError
    from synth.synthesis.hierarchy import check_threadblocks

    topo = load_topology("dgx-h100", 128, "rail")
    with pytest.raises(BackendError, match=r"receive from 127 rail peers and 7 peers in its node.*at most 132 "
                                           r"threadblocks.*use at most 126 nodes"):
        synthesize_hierarchy(topo, "alltoall", GB)
    check_threadblocks(load_topology("dgx-h100", 126, "rail"), "alltoall", node_trees(topo))   # fits: no error
    check_threadblocks(topo, "allgather", node_trees(topo))


def test_solve_refuses_such_an_alltoall_before_building_its_tables_or_bound(monkeypatch):
    """The composition is all `synth solve` has at 1024 GPUs, so its refusal comes first: not after 10 s of
    building a million chunks' tables and 10 s of the Alltoall cut bound (25 s of CPU before)."""
    from synth.errors import BackendError
    from synth.synthesis import request as request_module
    from synth.synthesis.request import SynthesisRequest
    from synth.synthesis.solve import solve

    from synth.model.collectives import make_collective

    def no_bound(*args, **kwargs):
        raise AssertionError("the bound was computed before the refusal")

    monkeypatch.setattr(request_module, "lower_bound", no_bound)
    topo = load_topology("dgx-h100", 128, "rail")
    make_collective.cache_clear()
    with pytest.raises(BackendError, match=r"use at most 126 nodes"):
        solve(SynthesisRequest(topo, "alltoall", GB))
    assert make_collective.cache_info().currsize == 0     # no tables built


def test_the_early_refusal_leaves_rooted_collectives_to_their_composition():
    """Broadcast and Reduce across nodes count as composed (by the rooted composition, which the hierarchy's
    own check refuses): on more ranks than the flat searches take, `synth solve` still writes them."""
    from synth.synthesis.request import SynthesisRequest
    from synth.synthesis.solve import solve

    result = solve(SynthesisRequest(load_topology("ndv2", 2), "reduce", 1 << 20))
    assert result.chosen.candidate.label.startswith("rooted"), result.chosen.candidate.label


def test_a_composition_that_cannot_load_is_refused_before_it_is_composed(monkeypatch):
    """At 128 x dgx-h100 every Allreduce composition's ranks need at least 4361 XML elements (of 4095): the floor
    on node 0's transfers, from the routes, says so in seconds, before composing (a minute), the replay and the
    lowerings (an hour of them before). A refused plan is named; when every plan is refused the refusal lists
    them all."""
    from synth.errors import BackendError
    from synth.synthesis import hierarchy

    def no_compose(*args, **kwargs):
        raise AssertionError("a composition that cannot load was composed")

    topo = load_topology("dgx-h100", 4, "rail")
    plans = hierarchy_plans(topo, "allgather", GB)
    monkeypatch.setattr(hierarchy, "hopeless", lambda schedule, topology, target, ranks: "rank 3 loads too much")
    monkeypatch.setattr(hierarchy, "compose", no_compose)
    with pytest.raises(BackendError) as caught:
        synthesize_hierarchy(topo, "allgather", GB)
    assert str(caught.value) == ("no composition of allgather over 4 x 8 GPUs can load on the executor runtime: "
                                 + "; ".join(f"{p.label('allgather')}: rank 3 loads too much" for p in plans))
    monkeypatch.undo()
    first = plans[0]
    monkeypatch.setattr(hierarchy, "unloadable", lambda topology, collective, plan, nodes, target: (
        "rank 3 loads too much" if plan == first else None))
    heard = []
    found = synthesize_hierarchy(topo, "allgather", GB, progress=heard.append)
    assert first not in {c.plan for c in found} and found
    assert f"  hierarchy: {first.label('allgather')} cannot load, not composed (rank 3 loads too much)" in heard


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "alltoall"])
def test_node_0s_share_from_the_routes_has_the_composed_schedules_floor(collective):
    """The floor :func:`unloadable` takes from node 0's share of the routes is the composed, ordered schedule's;
    for Alltoall at most (its relays hold chunks in scratch, which a share packs more tightly: never above)."""
    from backends.msccl.step_floor import rank_floors
    from synth.synthesis.hierarchy import node_share

    topo = load_topology("dgx-h100", 4, "rail")
    nodes = node_trees(topo)
    for plan in hierarchy_plans(topo, collective, GB)[:2]:
        composed = rank_floors(compose(topo, collective, plan, GB, None, nodes))[:8]
        share = rank_floors(node_share(topo, collective, plan, nodes))[:8]
        if collective != "alltoall":
            assert share == composed, plan
        assert all(a.steps <= b.steps and a.threadblocks == b.threadblocks for a, b in zip(share, composed))


def test_where_the_flat_searches_run_a_refused_composition_leaves_them_competing(monkeypatch):
    from synth.errors import BackendError
    from synth.synthesis import select

    request = SynthesisRequest(H100X2, "allgather", 1 << 20)
    stand_in = select.baseline_candidate(request)

    def refused(request, progress):
        raise BackendError("no composition of allgather over 2 x 8 GPUs can load on the executor runtime: ...")

    monkeypatch.setattr(select, "FLAT_SEARCH_MAX_RANKS", 16)       # a machine small enough for both
    monkeypatch.setattr(select, "hierarchy_candidates", refused)
    monkeypatch.setattr(select, "composable_plans", refused, raising=False)
    monkeypatch.setattr(select, "tree_candidates", lambda request, progress, fallbacks: [stand_in])
    monkeypatch.setattr(select, "alpha_beta_candidate", lambda request, progress: stand_in)
    heard = []
    assert stand_in in verified_candidates(request, heard.append)
    assert "  hierarchy: no composition of allgather over 2 x 8 GPUs can load on the executor runtime: ..." in heard
    monkeypatch.setattr(select, "FLAT_SEARCH_MAX_RANKS", 8)        # the composition is all there is: it raises
    with pytest.raises(BackendError, match="no composition"):
        verified_candidates(request, heard.append)
