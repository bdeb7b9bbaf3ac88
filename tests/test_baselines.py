"""Baselines: every applicable one verifies for every collective it implements; ring closed forms; best."""

from __future__ import annotations

import json

import pytest

from synth.synthesis.baselines import BASELINES, baseline_status, best_baseline, build_baseline, find_ring, pack_rings
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.schedule.replay import verify
from synth.synthesis.baselines.plans import count_transfers
from synth.model.topology import load_topology, topology_from_dict

ALPHA, BW = 0.7, 25.0
TOPOLOGIES = {"ring-8": load_topology("ring-8"), "dgx1": load_topology("dgx1"),
              "ndv2x2": load_topology("ndv2", nodes=2), "dgx-a100": load_topology("dgx-a100")}
CASES = [(t, b, c) for t in TOPOLOGIES for b, spec in BASELINES.items() for c in spec.collectives]
# baselines that must apply (the rest may be skipped, with a reason)
MUST_APPLY = {
    "ring-8": {"ring", "bidir-ring", "multi-ring"},
    "dgx1": {"ring", "bidir-ring", "multi-ring", "recursive-doubling", "recursive-halving-doubling",
             "double-binary-tree"},
    "ndv2x2": {"ring", "bidir-ring", "hierarchical", "double-binary-tree"},
    "dgx-a100": {"ring", "bidir-ring", "double-binary-tree", "recursive-doubling", "recursive-halving-doubling",
                 "all-pairs"},
}


@pytest.mark.parametrize("topo_name, name, collective", CASES)
@pytest.mark.parametrize("chunks", [1, 3])
def test_every_applicable_baseline_verifies(topo_name, name, collective, chunks):
    topo = TOPOLOGIES[topo_name]
    root = 3 if collective in ("broadcast", "reduce", "gather", "scatter") else None
    try:
        schedule = build_baseline(name, collective, topo, chunks, root)
    except InputError as exc:
        assert name not in MUST_APPLY[topo_name], str(exc)
        assert exc.problem
        return
    report = verify(schedule, topo, 1 << 20)
    assert report.time_us > 0
    assert schedule.collective.root == root
    # what the budget of evaluate_baselines counts before building is what gets built
    routes = BASELINES[name].routes(topo, collective, root)
    assert count_transfers(schedule.collective.name, topo.num_ranks, schedule.collective.chunks_per_rank, routes,
                           root) == len(schedule.transfers)
    assert schedule.notes["baseline"] == name and schedule.method == f"baseline:{name}"
    json.loads(schedule.to_json())
    bound = lower_bound(collective, topo, 1 << 20, root=root)
    assert report.time_us >= bound.limit_us * (1 - 1e-9)


@pytest.mark.parametrize("n", [4, 5, 8])
def test_ring_matches_closed_form(n):
    topo = load_topology(f"ring-{n}")
    size = 3_000_000
    hop = ALPHA + size / n / (BW * 1e3)
    for collective, hops in (("allgather", n - 1), ("reducescatter", n - 1), ("allreduce", 2 * (n - 1))):
        s = build_baseline("ring", collective, topo)
        assert verify(s, topo, size).time_us == pytest.approx(hops * hop)
    # pipelined chain: the first chunk crosses n-1 links, the others follow one transmission apart
    chunks = 6
    beta = size / chunks / (BW * 1e3)
    s = build_baseline("ring", "broadcast", topo, chunks, root=1)
    assert verify(s, topo, size).time_us == pytest.approx((n - 1) * (ALPHA + beta) + (chunks - 1) * beta)
    # both directions: half the data each way
    s = build_baseline("bidir-ring", "allgather", topo)
    assert verify(s, topo, size).time_us == pytest.approx((n - 1) * (ALPHA + size / n / 2 / (BW * 1e3)))


def test_dgx1_packs_six_rings_and_reaches_the_allgather_limit():
    topo = TOPOLOGIES["dgx1"]
    assert find_ring(topo) == [0, 1, 3, 2, 6, 7, 5, 4]
    assert len(pack_rings(topo)) == 6
    s = build_baseline("multi-ring", "allgather", topo, order_bytes=10**9)
    limit = lower_bound("allgather", topo, 10**9).limit_us
    assert verify(s, topo, 10**9).time_us == pytest.approx(limit, rel=1e-3)


def test_hierarchical_beats_the_flat_ring_across_nodes():
    topo = TOPOLOGIES["ndv2x2"]
    flat = verify(build_baseline("ring", "allgather", topo, 4), topo, 10**9).time_us
    hier = verify(build_baseline("hierarchical", "allgather", topo, 4, order_bytes=10**9), topo, 10**9).time_us
    assert hier < 0.6 * flat
    assert hier >= 40e3  # the limit: half the data through one 12.5 GB/s NIC


def test_skips_name_the_missing_piece():
    status = baseline_status("allgather", TOPOLOGIES["ring-8"])
    assert status["ring"] is None
    assert "no direct link 0->2" in status["all-pairs"]
    assert "several nodes" in status["hierarchical"]
    assert "does not implement allgather" in status["double-binary-tree"]
    assert "power-of-two" in baseline_status("allgather", load_topology("fully-connected-6"))["recursive-doubling"]
    assert "cannot run backwards" in baseline_status("allgather", load_topology("ndv2-2node-tecc"))["bidir-ring"]


def test_build_errors():
    topo = TOPOLOGIES["ring-8"]
    with pytest.raises(InputError, match="unknown baseline 'spiral'"):
        build_baseline("spiral", "allgather", topo)
    with pytest.raises(InputError, match="does not implement alltoall"):
        build_baseline("double-binary-tree", "alltoall", topo)
    with pytest.raises(InputError, match="at least 1"):
        build_baseline("ring", "allgather", topo, 0)


def test_best_baseline_is_the_fastest():
    topo = TOPOLOGIES["dgx-a100"]
    size = 1 << 20
    best = best_baseline("allreduce", topo, size)
    schedule, report = best.schedule, best.report
    assert verify(schedule, topo, size).time_us == pytest.approx(report.time_us)
    for other, reason in baseline_status("allreduce", topo).items():
        if reason is None:
            for chunks in (1, 2, 4):
                s = build_baseline(other, "allreduce", topo, chunks, order_bytes=size)
                assert verify(s, topo, size).time_us >= report.time_us - 1e-9


def test_best_baseline_without_any_applicable_one():
    star = topology_from_dict({"ranks": 4, "defaults": {"alpha_us": 1, "bw_GBps": 10},
                               "links": [{"src": 0, "dst": r, "bidirectional": True} for r in (1, 2, 3)]}, "star")
    # only shortest paths relay through the hub, and they serve machines of up to 64 ranks
    assert best_baseline("alltoall", star, 1024).name == "shortest-path"
    star = topology_from_dict({"ranks": 65, "defaults": {"alpha_us": 1, "bw_GBps": 10},
                               "links": [{"src": 0, "dst": r, "bidirectional": True} for r in range(1, 65)]}, "star")
    with pytest.raises(InputError, match="no baseline applies to alltoall on star"):
        best_baseline("alltoall", star, 1024)


def test_switch_topology_takes_any_ring_order():
    topo = load_topology("dgx2")
    assert find_ring(topo) == list(range(16))
    assert verify(build_baseline("ring", "allgather", topo), topo, 1 << 20)


def test_all_pairs_alltoall_takes_turns_no_receiver_sees_two_senders_of_a_port():
    """2 x dgx-h100 on rails: in each turn every rank gets one block over its node and one over its NIC, so the
    written file runs as planned (in plain rank rotation every NIC of a node started at the same GPU of the other
    node and queued there: 49.0 ms simulated for 20.8 ms planned)."""
    from collections import Counter

    from backends.msccl.lowering import lower_to_msccl
    from backends.msccl.simulate import simulate_program

    topo = load_topology("dgx-h100", 2, "rail")
    schedule = build_baseline("all-pairs", "alltoall", topo, 1, None, order_bytes=1 << 30)
    per_turn = Counter((t.step, t.dst, t.src // 8 == t.dst // 8) for t in schedule.transfers)
    assert set(per_turn.values()) == {1}
    planned = verify(schedule, topo, 1 << 30).time_us
    simulated = simulate_program(lower_to_msccl(schedule, topology=topo, fuse=False), topo, 1 << 30).time_us
    assert simulated == pytest.approx(planned, rel=1e-6)
    assert lower_bound("alltoall", topo, 1 << 30).limit_us / simulated > 0.94
    single = build_baseline("all-pairs", "alltoall", load_topology("dgx-h100"), 1, None)
    assert {(t.src, t.dst, t.step) for t in single.transfers} == \
        {(s, d, (d - s) % 8 - 1) for s in range(8) for d in range(8) if s != d}      # one node: plain rotation


def test_a_reduce_tree_over_one_way_rails_is_built_from_the_links_it_uses():
    """dgx2-2node-tecc's rails run one way: a Reduce tree rooted on the far node uses each rail child -> parent,
    and ordering its children by the unused way's speed failed with KeyError: (16, 1) (`synth solve reduce
    --root 21`)."""
    from synth.model.topology import load_topology
    from synth.schedule.replay import verify
    from synth.synthesis.baselines import build_baseline

    tecc = load_topology("dgx2-2node-tecc")
    schedule = build_baseline("double-binary-tree", "reduce", tecc, 1, root=21)
    assert all(tecc.link(t.src, t.dst) is not None for t in schedule.transfers)
    assert verify(schedule, tecc, 1 << 20).time_us > 0
