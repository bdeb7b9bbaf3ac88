"""Broadcast and Reduce on one NVSwitch node as the root's Latin square (synth.synthesis.rooted.one_node_square):
two hops, every peer receiving one chunk per slot, planned as the runtime runs it."""

import pytest

from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.model.topology import load_topology
from synth.schedule.replay import verify
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.rooted import SQUARE, compose, one_node_square, synthesize_rooted
from synth.synthesis.solve import solve

MB = 1 << 20


@pytest.mark.parametrize("name,root", [("dgx-a100", 0), ("dgx-h100", 5), ("dgx2", 3)])
def test_the_square_hands_each_chunk_to_one_peer_which_forwards_it_to_every_other(name, root):
    topo = load_topology(name)
    n = topo.num_ranks
    schedule = compose(topo, "broadcast", 32, MB, root, design=SQUARE)
    for chunk in range(32):
        tree = [(t.src, t.dst) for t in schedule.transfers if t.chunk == chunk]
        relays = [v for u, v in tree if u == root]
        assert len(relays) == 1
        assert sorted(tree) == sorted([(root, relays[0])] + [(relays[0], v) for v in range(n)
                                                              if v not in (root, relays[0])])
    # the root hands the chunks to its peers in turn
    handed = [t.dst for t in sorted(schedule.transfers, key=lambda t: t.start_us) if t.src == root]
    assert handed == [(root + 1 + c % (n - 1)) % n for c in range(32)]


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_a_1mb_square_on_a_switch_runs_as_planned_and_beats_the_relay_stars(collective):
    # the tree packing's relay stars ran at 6.25 us (Broadcast) and 6.27 us (Reduce), 67% of the limit
    topo = load_topology("dgx-a100")
    schedule = compose(topo, collective, 32, MB, design=SQUARE)
    plan = verify(schedule, topo, MB)
    xml = emit_verified_xml(schedule, topo, "executor", MB, plan_us=plan.time_us)
    assert abs(xml.simulated_us - plan.time_us) <= 0.03 * xml.simulated_us
    assert xml.simulated_us <= 5.7
    assert xml.simulated_us <= lower_bound(collective, topo, MB, root=0).limit_us / 0.74


def test_solve_writes_the_square_for_a_1mb_broadcast_on_one_switch():
    solution = solve(SynthesisRequest(load_topology("dgx-a100"), "broadcast", MB))
    assert solution.chosen.candidate.label == "rooted/square/c32"
    assert solution.chosen.simulated_us <= 5.7


def test_the_square_is_offered_only_on_one_switch_with_an_odd_number_of_peers_at_small_sizes():
    assert one_node_square(load_topology("dgx-h100"), "reduce", MB, root=2) == [3, 4, 5, 6, 7, 0, 1]
    assert one_node_square(load_topology("dgx2"), "bcast", 64 << 10) is not None
    assert one_node_square(load_topology("dgx-a100"), "allgather", MB) is None      # not rooted
    assert one_node_square(load_topology("dgx1"), "broadcast", MB) is None          # no switch
    assert one_node_square(load_topology("dgx-h100", nodes=2), "broadcast", MB) is None
    assert one_node_square(load_topology("dgx-a100"), "broadcast", 64 * MB) is None  # the chain is at the limit
    assert [c.chunks for c in synthesize_rooted(load_topology("dgx-a100"), "broadcast", 64 * MB)] == []
    assert sorted(c.chunks for c in synthesize_rooted(load_topology("dgx-a100"), "reduce", MB)) == [16, 32, 64]


def test_a_square_where_it_does_not_apply_is_refused_with_the_reason():
    with pytest.raises(InputError, match="Latin square covers Broadcast and Reduce on one NVSwitch node"):
        compose(load_topology("dgx1"), "broadcast", 32, MB, design=SQUARE)
