"""The crossing bound (synth.bounds.crossing): what must leave a node through its NIC ports, with what a byte can
sum before it leaves and reach after it lands. Exact where the argument is simple, never above what a schedule
achieves, and no change where it does not apply."""

import json

import pytest
from click.testing import CliRunner

from synth.bounds.crossing import crossing_bound_us
from synth.bounds.physical import lower_bound
from synth.cli import main
from synth.model.topology import load_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.replay import verify
from synth.synthesis.baselines import baseline_status, build_baseline

KB = 1024


def test_two_ndv2_nodes_allreduce_1kb_is_the_three_ways_to_cross():
    """Node 0's 8 inputs must reach node 1's 8 GPUs (64 pairs of 1 KB) through one 12.5 GB/s port, 1.3 us away;
    an NVLink hop is 0.7 us and a GPU's neighbourhood is 5 GPUs. At T = 2 + x (x < 0.7) a byte sent before x can
    land early enough for one more hop (5 destinations), one sent from 0.7 can hold a sum of 5 inputs, and one in
    between covers one pair: 5x + (0.7 - x) + 5x port-microseconds' worth of bytes must cover 64 KB."""
    port = 12.5 * BYTES_PER_US_PER_GBPS
    x = (64 * KB / port - 0.7) / 9
    b = lower_bound("allreduce", load_topology("ndv2", 2), KB)
    assert b.direct_us == pytest.approx(2.0)
    assert b.crossing_us == pytest.approx(2 + x, abs=1e-5)
    assert b.limit_us == b.crossing_us and b.binding == "latency"


def test_large_sizes_add_at_most_a_crossing_and_two_hops_to_the_bandwidth_bound():
    """At 1 GB the bound is the bandwidth bound's bytes through the port plus the latency around them."""
    topo = load_topology("ndv2", 2)
    b = lower_bound("allreduce", topo, 1 << 30)
    assert b.binding == "bandwidth"
    assert b.bandwidth_us < b.crossing_us < b.bandwidth_us + 1.3 + 2 * 1.4
    assert b.limit_us == b.crossing_us


def test_a_gather_across_ndv2_nodes_is_its_shards_through_the_port_plus_a_crossing():
    """Root 0's 8 peers on node 1 send their shards (64 KB / 16 each) through node 1's one 12.5 GB/s NIC port,
    1.3 us away: the bandwidth bound leaves that latency out, the direct bound stops where relaying could start."""
    b = lower_bound("gather", load_topology("ndv2", 2), 64 * KB)
    assert b.crossing_us == pytest.approx(1.3 + 8 * (64 * KB / 16) / (12.5 * BYTES_PER_US_PER_GBPS), abs=1e-5)
    assert b.crossing_us > max(b.bandwidth_us, b.direct_us) and b.limit_source == "crossing"


def test_one_node_keeps_the_bound_it_had():
    assert crossing_bound_us("allreduce", load_topology("dgx1"), KB, None, 1.4) == 1.4


def test_a_direct_link_between_nodes_is_its_own_queue():
    """TE-CCL's two ndv2 nodes are joined by links, not NIC ports: each link serialises what crosses on it."""
    b = lower_bound("broadcast", load_topology("ndv2-2node-tecc"), 1 << 20)
    assert b.crossing_us > max(b.bandwidth_us, b.direct_us)


@pytest.mark.parametrize("topology, nodes, fabric, chunk_counts", [
    ("ndv2", 2, "switch", (1, 4)), ("ndv2-2node-tecc", 1, "switch", (1, 4)), ("dgx2", 2, "switch", (1,)),
    ("dgx-h100", 4, "rail", (1,))])
@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "reduce", "allgather", "reducescatter"])
def test_no_baseline_beats_the_bound(topology, nodes, fabric, chunk_counts, collective):
    """A lower bound: every applicable baseline, replayed in the cost model, takes at least as long (1 KB, 64 KB
    and 1 MB). ``benchmarks/bench_crossing.py`` checks more machines, sizes and chunk counts."""
    topo = load_topology(topology, nodes, fabric)
    for size in (KB, 64 * KB, 1 << 20):
        bound = lower_bound(collective, topo, size, root=0)
        for name, reason in baseline_status(collective, topo).items():
            if reason is not None:
                continue
            for chunks in chunk_counts:
                schedule = build_baseline(name, collective, topo, chunks_per_rank=chunks)
                time_us = verify(schedule, topo, size).time_us
                assert time_us >= bound.crossing_us * (1 - 1e-7), (name, chunks, size)


@pytest.mark.parametrize("topology, nodes", [("ndv2", 2), ("dgx2", 2)])
@pytest.mark.parametrize("collective", ["gather", "scatter", "alltoall"])
def test_no_personalised_baseline_beats_the_bound(topology, nodes, collective):
    topo = load_topology(topology, nodes)
    for size in (64 * KB, 1 << 20):
        bound = lower_bound(collective, topo, size, root=0)
        for name, reason in baseline_status(collective, topo).items():
            if reason is None:
                time_us = verify(build_baseline(name, collective, topo), topo, size).time_us
                assert time_us >= bound.crossing_us * (1 - 1e-7), (name, size)


def test_the_written_plan_simulates_no_faster_than_the_limit():
    r = CliRunner().invoke(main, ["solve", "allreduce", "-t", "ndv2", "--nodes", "2", "--size", "1KB", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["limit_us"] == pytest.approx(lower_bound("allreduce", load_topology("ndv2", 2), KB).crossing_us)
    assert out["predicted_time_us"] >= out["limit_us"]


def test_bounds_names_the_crossing_bound_when_it_gives_the_limit():
    r = CliRunner().invoke(main, ["bounds", "allreduce", "-t", "ndv2", "--nodes", "2", "--size", "1KB"])
    assert r.exit_code == 0, r.output
    assert "crossing bound            2.505 us" in r.stderr
    assert "limit                     2.505 us  (the crossing bound gives it" in r.stderr
