"""The shallowest optimal trees of a Broadcast (synth.formulations.trees.shallow_packing): every spanning
arborescence is listed (Kirchhoff's count), and the trees taken are the least deep that still reach the rate."""

from __future__ import annotations

import numpy as np
import pytest

from synth.bounds.physical import bandwidth_bound_us
from synth.formulations.routes import resource_keys
from synth.formulations.trees import Commodity, _arborescences, _tree_model, shallow_packing, tree_loads
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.solver.highs import solve_model


def _floor_units(topo, chunks: int) -> float:
    """The optimal fractional rate in chunk / (GB/s) (the bandwidth bound at 1 GB in chunks of 1 GB / chunks)."""
    size = 1 << 30
    chunk_bytes = make_collective("broadcast", topo.num_ranks, chunks, 0).chunk_bytes(size)
    return bandwidth_bound_us("broadcast", topo, size, 0)[0] * BYTES_PER_US_PER_GBPS / chunk_bytes


def _depths(topo, links, root=0) -> dict[int, int]:
    depth = {root: 0}
    for li in links:   # parents first
        link = topo.links[li]
        assert link.src in depth and link.dst not in depth
        depth[link.dst] = depth[link.src] + 1
    return depth


@pytest.mark.parametrize("name", ["dgx1", "ring-8", "fully-connected-4"])
def test_every_spanning_arborescence_is_listed(name):
    # Kirchhoff: the arborescences rooted at 0 number det of the in-degree Laplacian without row and column 0
    topo = load_topology(name)
    n = topo.num_ranks
    laplacian = np.zeros((n, n))
    for link in topo.links:
        laplacian[link.dst, link.dst] += 1
        laplacian[link.src, link.dst] -= 1
    listed = _arborescences(topo, 0)
    assert len(listed) == round(np.linalg.det(laplacian[1:, 1:]))
    assert len(set(links for links, _ in listed)) == len(listed)
    for links, depth in listed:
        reached = _depths(topo, links)
        assert len(reached) == n and max(reached.values()) == depth


def test_dgx1_broadcast_takes_depth_4_trees_at_the_rate():
    topo = load_topology("dgx1")
    floor = _floor_units(topo, 1024)
    packing, trees = shallow_packing(topo, Commodity(0, tuple(range(1, 8))), 1024, floor)
    assert sum(t.chunks for t in trees) == 1024
    assert max(max(_depths(topo, t.links).values()) for t in trees) == 4
    # 1024 chunks over the root's six lanes: 171 on the busiest, 1026 / 150 GB/s (the rate: 1024 / 150)
    assert packing.units == pytest.approx(171 / 25, rel=1e-9) and packing.units <= floor * 1.002
    per_link, bandwidth = resource_keys(topo)
    load = dict.fromkeys(bandwidth, 0)
    for tree in trees:
        for li in tree.links:
            for key in per_link[li]:
                load[key] += tree.chunks
    assert all(load[key] <= packing.units * bandwidth[key] * (1 + 1e-9) for key in bandwidth)
    assert np.array_equal(packing.counts[0], np.bincount(
        [li for t in trees for li in t.links for _ in range(t.chunks)], minlength=len(topo.links)))
    # no packing of depth-3 trees reaches the rate: it needs 20% more time
    matrix, capacity = tree_loads(topo, [links for links, depth in _arborescences(topo, 0) if depth <= 3])
    lp = solve_model(_tree_model(matrix, capacity, 1024, integer=False))
    assert lp.x[-1] == pytest.approx(floor * 1.2, rel=1e-9)


def test_too_many_trees_to_list_are_left_to_the_decomposition_or_the_relay_stars():
    topo = load_topology("fully-connected-8")     # 7^7 parent choices
    assert _arborescences(topo, 0) is None
    sinks = Commodity(0, tuple(range(1, 8)))
    assert shallow_packing(topo, sinks, 16, _floor_units(topo, 16), relay_stars=False) is None
    packing, trees = shallow_packing(topo, sinks, 16, _floor_units(topo, 16))
    assert packing.relay_stars and sum(t.chunks for t in trees) == 16
    assert all(max(_depths(topo, t.links).values()) <= 2 for t in trees)
    dgx1 = load_topology("dgx1")                  # a sink set short of every rank: not a spanning commodity
    assert shallow_packing(dgx1, Commodity(0, (1, 2)), 16, 1.0) is None


@pytest.mark.parametrize("name,ranks", [("dgx-a100", 8), ("dgx2", 16)])
def test_relay_stars_reach_the_rate_on_a_switch_in_two_hops(name, ranks):
    # every chunk leaves the root once (its port carries all C) and enters each rank once (from the root in its
    # own tree, from the relays in the others'), so the fractional packing is at the rate; the integer one takes
    # the LP's trees, whose vertex may leave a relay out and load the others' ports to the rate, so rounding
    # adds up to a chunk per relay (dgx-a100: 1026 of 1024 chunks' time; dgx2: 1036)
    topo = load_topology(name)
    floor = _floor_units(topo, 1024)
    packing, trees = shallow_packing(topo, Commodity(0, tuple(range(1, ranks))), 1024, floor)
    assert packing.relay_stars and floor <= packing.units <= floor * (1024 + ranks - 1) / 1024
    assert sum(t.chunks for t in trees) == 1024
    depths = [_depths(topo, t.links) for t in trees]
    assert all(len(d) == ranks and max(d.values()) == 2 for d in depths)
    assert sorted(t.links[0] for t in trees) == sorted({t.links[0] for t in trees})   # one tree per relay


def test_a_small_broadcast_takes_shallower_trees_below_the_rate_and_runs_as_planned():
    """dgx1 Broadcast 64 KB in 64 chunks: depth 4 (the rate) ran at 3.33 us, depth 3 (20% more load, a level
    less) at 2.71 us, as planned; at 1 GB the load outweighs the levels and only the rate's depth is packed."""
    from backends.msccl.writer import emit_verified_xml
    from synth.formulations.trees import shallow_packings
    from synth.synthesis.trees import synthesize_trees

    dgx1 = load_topology("dgx1")
    sinks = Commodity(0, tuple(range(1, 8)))
    size = 64 << 10
    result = synthesize_trees(dgx1, "broadcast", size, chunks=64)
    trees = {}
    for t in result.schedule.transfers:
        trees.setdefault(t.chunk, []).append(dgx1.link_index[(t.src, t.dst)])
    assert max(max(_depths(dgx1, links).values()) for links in trees.values()) == 3
    xml = emit_verified_xml(result.schedule, dgx1, "executor", size, plan_us=result.replay_us)
    assert result.replay_us <= 2.75 and abs(xml.simulated_us - result.replay_us) <= 0.03 * xml.simulated_us
    chunk_bytes = (1 << 30) / 2048
    big = shallow_packings(dgx1, sinks, 2048, _floor_units(dgx1, 2048), unit_us=chunk_bytes / BYTES_PER_US_PER_GBPS,
                           hop_us=0.7 + chunk_bytes / 25e3)
    assert len(big) == 1
