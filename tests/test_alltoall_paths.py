"""Alltoall by integerized path flows: the LP reaches the concurrent-flow bound, the MILP's power-of-two chunks
per pair stay within a hair of it, and the written program runs as planned."""

from __future__ import annotations

import pytest

from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import bandwidth_bound_us
from synth.errors import InputError
from synth.model.topology import load_topology
from synth.schedule.replay import verify
from synth.synthesis.alltoall import candidate_paths, chunk_options, solve_path_flows, synthesize_alltoall
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import verified_candidates

GB = 1 << 30


@pytest.mark.parametrize("topology", ["dgx1", "ring-8", "dgx-h100"])
def test_path_lp_is_the_concurrent_flow_bound(topology):
    topo = load_topology(topology)
    flows = solve_path_flows(topo, 1, integer=False)
    block_units = GB / topo.num_ranks / 1e3   # one chunk per pair is a whole block
    assert flows.busiest * block_units == pytest.approx(bandwidth_bound_us("alltoall", topo, GB)[0], rel=1e-6)


def test_dgx1_integer_paths_reach_the_bound_and_run_as_planned():
    topo = load_topology("dgx1")
    result = synthesize_alltoall(topo, GB, 32)
    assert result.schedule.collective.runs_at_power_of_two_sizes
    assert result.integer_us <= result.fractional_us * 1.003
    assert verify(result.schedule, topo, GB).time_us == pytest.approx(result.replay_us)
    assert result.replay_us <= result.fractional_us * 1.003
    emitted = emit_verified_xml(result.schedule, topo, "executor", GB)
    assert emitted.simulated_us == pytest.approx(result.replay_us, rel=1e-3)


def test_paths_are_simple_and_at_most_one_hop_longer():
    topo = load_topology("dgx1")
    for src, dst in [(0, 7), (0, 1), (3, 4)]:
        paths = candidate_paths(topo, src, dst)
        fewest = min(len(p) for p in paths)
        for path in paths:
            ranks = [topo.links[path[0]].src] + [topo.links[li].dst for li in path]
            assert ranks[0] == src and ranks[-1] == dst and len(set(ranks)) == len(ranks)
            assert len(path) <= fewest + 1


def test_chunk_options_are_powers_of_two_within_the_runtime():
    for topology in ("dgx1", "dgx-h100"):
        options = chunk_options(load_topology(topology), GB)
        assert options == sorted(options, reverse=True)
        assert all(c & (c - 1) == 0 for c in options)
        assert options[0] * 7 <= 256


def test_auto_tries_the_path_flows_for_alltoall():
    found = verified_candidates(SynthesisRequest(load_topology("ring-4"), "alltoall", 1 << 20))
    assert any(c.label.startswith("alltoall-paths/") for c in found)


def test_bad_chunk_count_is_refused():
    with pytest.raises(InputError, match="chunks per pair must be a power of two, got 3"):
        synthesize_alltoall(load_topology("ring-4"), GB, 3)
