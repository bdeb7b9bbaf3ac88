"""The rooted star (synth.synthesis.rooted.star_tree): one chunk across every node in two alphas, for small
Broadcasts and Reduces on NVSwitch nodes."""

from collections import Counter

import pytest

from synth.model.topology import load_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.replay import verify
from synth.synthesis.rooted import STAR, compose, star_tree, synthesize_rooted

KB = 1024


@pytest.mark.parametrize("root", [0, 5, 17])
def test_the_star_reaches_every_rank_once_within_two_hops(root):
    topo = load_topology("dgx2", 2)
    tree = star_tree(topo, root)
    assert Counter(dst for _, dst in tree) == Counter(r for r in range(32) if r != root)
    parent = {dst: src for src, dst in tree}
    entry = (root + 16) % 32
    assert tree[0] == (root, entry)                      # across first: its alpha is the longest
    assert all(parent[r] in (root, entry) and (parent[r] == root) == (r // 16 == root // 16) for r in parent
               if r != entry)


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_one_kilobyte_takes_one_crossing_and_one_switch_hop(collective):
    """Two alphas plus the crossing's bytes and the entry's 15 copies through its switch port."""
    topo = load_topology("dgx2", 2)
    schedule = compose(topo, collective, 1, KB, design=STAR)
    across, inside = topo.link(0, 16), topo.link(16, 17)
    port_bytes_per_us = topo.port_capacity()[inside.ports[0]] * BYTES_PER_US_PER_GBPS
    expected = (across.alpha_us + KB / (across.capacity_GBps * BYTES_PER_US_PER_GBPS) + inside.alpha_us
                + 15 * KB / port_bytes_per_us)
    assert verify(schedule, topo, KB).time_us == pytest.approx(expected)
    fastest = synthesize_rooted(topo, collective, KB)[0]
    assert fastest.design == STAR and fastest.label == "rooted/star/c1"


def test_no_star_where_nodes_are_not_switches():
    assert star_tree(load_topology("ndv2", 2), 0) is None


def test_a_user_chunk_count_of_one_on_nodes_without_a_switch_skips_the_star():
    found = synthesize_rooted(load_topology("ndv2", 2), "broadcast", KB, chunks=1)
    assert found and all(c.design != STAR for c in found)
