"""The direct bound (synth.bounds.physical.direct_bound_us): a latency bound that counts the bytes which cannot be
relayed in time. It must be exact where the argument is simple and never above what a schedule achieves."""

import pytest

from synth.bounds.physical import direct_bound_us, lower_bound
from synth.model.topology import load_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.replay import verify
from synth.synthesis.baselines import baseline_status, build_baseline

KB = 1024


def test_switch_allreduce_is_one_alpha_and_fifteen_buffers_through_a_port():
    """dgx2: one hop is 0.35 us, two are 0.7 us; below 0.7 us every rank's whole buffer must come straight from
    each of the 15 others through the one NVSwitch ingress port."""
    topo = load_topology("dgx2")
    link = topo.links[0]
    port_bytes_per_us = topo.port_capacity()[link.ports[1]] * BYTES_PER_US_PER_GBPS
    expected = link.alpha_us + 15 * KB / port_bytes_per_us
    assert expected < 2 * link.alpha_us
    b = lower_bound("allreduce", topo, KB)
    assert b.latency_us == pytest.approx(link.alpha_us)
    assert b.direct_us == pytest.approx(expected)
    assert b.limit_us == pytest.approx(expected) and b.binding == "latency"


def test_shared_nic_allgather_books_every_remote_shard_on_the_port():
    """ndv2 x 2: a remote shard relayed through the other node costs 1.3 + 0.7 us; below that, the 8 local ranks
    take all 8 remote shards (1 KB / 16 each) straight through their node's one 12.5 GB/s NIC port."""
    topo = load_topology("ndv2", 2)
    b = lower_bound("allgather", topo, KB)
    assert b.latency_us == pytest.approx(1.4)
    assert b.direct_us == pytest.approx(1.3 + 64 * (KB / 16) / (12.5 * BYTES_PER_US_PER_GBPS))


def test_large_sizes_fall_back_to_the_relayed_paths():
    """At 1 GB nothing can go direct in time: past the relayed thresholds the bound is a relayed path's alpha,
    so the bandwidth bound binds as before."""
    b = lower_bound("allreduce", load_topology("dgx2"), 1 << 30)
    assert b.binding == "bandwidth"
    assert b.direct_us == pytest.approx(0.7)


@pytest.mark.parametrize("topology, nodes", [("dgx2", 1), ("ndv2", 2), ("dgx1", 1), ("ring-8", 1),
                                             ("dgx-h100", 1)])
@pytest.mark.parametrize("collective", ["allgather", "allreduce", "broadcast", "reduce", "alltoall", "gather"])
def test_no_baseline_beats_the_bound(topology, nodes, collective):
    """A lower bound: every applicable baseline, replayed in the cost model, takes at least as long (1 KB and
    64 KB, one chunk per rank)."""
    topo = load_topology(topology, nodes)
    for size in (KB, 64 * KB):
        bound = lower_bound(collective, topo, size)
        for name, reason in baseline_status(collective, topo).items():
            if reason is not None:
                continue
            schedule = build_baseline(name, collective, topo)
            assert verify(schedule, topo, size).time_us >= bound.direct_us * (1 - 1e-9), (name, size)


def test_a_large_topology_keeps_the_alpha_diameter():
    topo = load_topology("dgx-h100", 17)
    assert direct_bound_us("allgather", topo, KB, None, 1.25) == 1.25
