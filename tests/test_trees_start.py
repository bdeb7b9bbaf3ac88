"""The packing MILP's start: where fewest-hop trees cross a shared NIC once per remote rank, the cheapest-resource
trees cross it once, and the integer packing reaches the fractional optimum."""

from __future__ import annotations

import pytest

from synth.bounds.physical import bandwidth_bound_us
from synth.formulations.trees import _cheapest_tree
from synth.model.topology import load_topology
from synth.synthesis.trees import synthesize_trees

GB = 1 << 30


def test_cheapest_tree_crosses_the_nic_once():
    topo = load_topology("ndv2", 2)
    tree = _cheapest_tree(topo, 0)
    links = [topo.links[li] for li in tree]
    assert sorted(l.dst for l in links) == [r for r in range(16) if r != 0]     # spanning, from the root
    assert sum(topo.node_of(l.src) != topo.node_of(l.dst) for l in links) == 1


def test_two_node_allgather_packing_reaches_the_bound():
    topo = load_topology("ndv2", 2)
    result = synthesize_trees(topo, "allgather", GB, chunks=16)
    assert result.fractional_us == pytest.approx(bandwidth_bound_us("allgather", topo, GB)[0], rel=1e-6)
    assert result.integer_us == pytest.approx(result.fractional_us, rel=1e-6)
    assert result.replay_us <= result.fractional_us * 1.02
