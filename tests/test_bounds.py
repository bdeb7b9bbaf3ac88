"""Lower bounds: the published limits (DESIGN section 9), ring closed forms, and max-flow = cut formula."""

from __future__ import annotations

import itertools

import pytest

from synth.bounds.physical import bandwidth_bound_us, lower_bound
from synth.errors import InputError
from synth.model.topology import load_topology, topology_from_dict

GB = 10**9  # the TE-CCL figures use 1 GB = 1e9 bytes; 2**30 bytes gives 7.37% more
BW = 25.0   # GB/s of ring-N and fully-connected-N links
ALPHA = 0.7


@pytest.mark.parametrize("name, collective, limit_ms", [
    ("ndv2-2node-tecc", "allgather", 40.0),
    ("ndv2-4node-tecc", "allgather", 60.0),
    ("dgx2-2node-tecc", "allgather", 7.75),
    ("dgx2-2node-tecc", "alltoall", 80.0),
    ("ndv2-2node-tecc", "alltoall", 320.0),
])
def test_published_limits(name, collective, limit_ms):
    b = lower_bound(collective, load_topology(name), GB)
    assert b.bandwidth_us == pytest.approx(limit_ms * 1e3, rel=1e-6)
    # the crossing bound adds the latency around the bytes that cross (a few microseconds of 40 ms)
    assert b.binding == "bandwidth" and b.bandwidth_us <= b.limit_us <= b.bandwidth_us + 5
    # with nccl-tests' 1GB (2**30 bytes) the same limit scales by 1.0737
    b30 = lower_bound(collective, load_topology(name), 1 << 30)
    assert b30.bandwidth_us == pytest.approx(limit_ms * 1e3 * (1 << 30) / GB, rel=1e-6)


def test_ndv2_two_node_alpha_diameter():
    b = lower_bound("allgather", load_topology("ndv2-2node-tecc"), GB)
    assert b.latency_us == pytest.approx(4.1)  # 2 NVLink hops + the 1.3 us inter-node link + 2 NVLink hops
    assert b.hops == 5


def test_dgx2_binding_cut_is_the_gpu_ingress_port():
    # 31 of 32 shards through a 125 GB/s switch port; the node cut (8 x 12.5 GB/s) allows 5 ms
    t = load_topology("dgx2-2node-tecc")
    assert bandwidth_bound_us("allgather", t, GB)[0] == pytest.approx(31 / 32 * GB / 125e3)


def test_composed_ndv2_shares_one_nic_per_node():
    t = load_topology("ndv2", nodes=2)
    assert lower_bound("allgather", t, GB).bandwidth_us == pytest.approx(40e3)
    assert lower_bound("alltoall", t, GB).bandwidth_us == pytest.approx(320e3)


def test_gpus_behind_one_nic_share_its_ingress():
    # dgx2 x2: GPUs 0 and 1 share one 12.5 GB/s NIC port and each has a 125 GB/s NVSwitch port. Each receives 31
    # of 32 shards, together through 262.5 GB/s: the one-sink cut (137.5 GB/s into GPU 0) misses this.
    t = load_topology("dgx2", nodes=2)
    ag = 2 * 31 / 32 * GB / 262.5e3
    assert bandwidth_bound_us("allgather", t, GB)[0] == pytest.approx(ag)
    # ReduceScatter sends the same through the same ports' egress (the reversed network); Allreduce is both
    assert bandwidth_bound_us("reducescatter", t, GB)[0] == pytest.approx(ag)
    assert bandwidth_bound_us("allreduce", t, GB)[0] == pytest.approx(2 * ag)


@pytest.mark.parametrize("n", [4, 5, 8])
def test_ring_closed_forms(n):
    t = load_topology(f"ring-{n}")
    size = 8_000_000
    m = size / n
    per_us = BW * 1e3  # bytes per microsecond per link
    ag = (n - 1) * m / (2 * per_us)
    assert lower_bound("allgather", t, size).bandwidth_us == pytest.approx(ag)
    assert lower_bound("reducescatter", t, size).bandwidth_us == pytest.approx(ag)
    assert lower_bound("allreduce", t, size).bandwidth_us == pytest.approx(2 * ag)
    assert lower_bound("broadcast", t, size, root=1).bandwidth_us == pytest.approx(size / (2 * per_us))
    assert lower_bound("reduce", t, size).bandwidth_us == pytest.approx(size / (2 * per_us))
    assert lower_bound("scatter", t, size).bandwidth_us == pytest.approx(ag)
    assert lower_bound("gather", t, size).bandwidth_us == pytest.approx(ag)
    half = n // 2
    a2a = m * half * (n - half) / (2 * per_us)  # the half-ring cut
    assert lower_bound("alltoall", t, size).bandwidth_us == pytest.approx(a2a, rel=1e-6)
    b = lower_bound("allgather", t, size)
    assert b.latency_us == pytest.approx(ALPHA * half) and b.hops == half


def test_switch_bound_is_the_port_rate():
    t = load_topology("dgx-a100")
    b = lower_bound("allgather", t, GB)
    assert b.bandwidth_us == pytest.approx(7 / 8 * GB / 300e3)
    assert lower_bound("alltoall", t, GB).bandwidth_us == pytest.approx(7 / 8 * GB / 300e3, rel=1e-6)


def _cut_bounds(topology, size):
    """Brute force over rank subsets S: Allgather, ReduceScatter and Alltoall cut bounds in us."""
    n = topology.num_ranks
    caps = {(l.src, l.dst): l.capacity_GBps * 1e3 for l in topology.links}
    ag = rs = a2a = 0.0
    for k in range(1, n):
        for subset in itertools.combinations(range(n), k):
            s = set(subset)
            out = sum(c for (u, v), c in caps.items() if u in s and v not in s)
            inn = sum(c for (u, v), c in caps.items() if u not in s and v in s)
            ag = max(ag, size / n * k / out)
            rs = max(rs, size / n * k / inn)
            a2a = max(a2a, size / n * k * (n - k) / out)
    return ag, rs, a2a


def _lopsided():
    """Five ranks with uneven, one-way links: the worst cut is not a symmetric one."""
    links = [(0, 1, 10), (1, 2, 30), (2, 0, 20), (2, 3, 5), (3, 4, 40), (4, 2, 7), (1, 3, 3), (4, 0, 12),
             (0, 4, 6)]
    return topology_from_dict({"ranks": 5, "links": [{"src": a, "dst": b, "alpha_us": 1.0, "bw_GBps": bw}
                                                     for a, b, bw in links]}, "lopsided")


@pytest.mark.parametrize("topology", [load_topology("ring-5"), load_topology("dgx1"),
                                      load_topology("fully-connected-4"), _lopsided()], ids=lambda t: t.name)
def test_max_flow_equals_cut_formula(topology):
    size = 1_000_000
    ag, rs, a2a = _cut_bounds(topology, size)
    assert bandwidth_bound_us("allgather", topology, size)[0] == pytest.approx(ag, rel=1e-7)
    assert bandwidth_bound_us("reducescatter", topology, size)[0] == pytest.approx(rs, rel=1e-7)
    # the concurrent-flow LP is at least the cut bound (equal on rings)
    assert bandwidth_bound_us("alltoall", topology, size)[0] >= a2a * (1 - 1e-7)


def test_broadcast_uses_the_roots_connectivity():
    # DGX-1: six NVLink lanes leave every GPU, and six edge-disjoint paths reach every other GPU
    t = load_topology("dgx1")
    assert lower_bound("broadcast", t, GB, root=5).bandwidth_us == pytest.approx(GB / 150e3)


def test_fields_and_store_and_forward_path():
    b = lower_bound("alltoall", load_topology("ring-4"), 4096, chunks_per_rank=2)
    assert b.limit_us == max(b.bandwidth_us, b.latency_us)
    assert b.binding == "latency" and b.limit_us == b.latency_us
    # one 512-byte chunk over two hops: 2 * (0.7 us + 512 B / 25 GB/s)
    assert b.chunk_path_us == pytest.approx(2 * (ALPHA + 512 / 25e3))
    assert set(b.to_dict()) >= {"bandwidth_us", "latency_us", "limit_us", "binding", "hops", "algbw_GBps"}


def test_bad_input():
    t = load_topology("ring-4")
    with pytest.raises(InputError, match="unknown collective"):
        lower_bound("allsum", t, 1024)
    with pytest.raises(InputError, match="must be positive"):
        lower_bound("allgather", t, 0)
    with pytest.raises(InputError, match="root 7"):
        lower_bound("broadcast", t, 1024, root=7)


def test_disconnected_topology_has_no_finite_bound():
    t = topology_from_dict({"ranks": 3, "links": [{"src": 0, "dst": 1, "alpha_us": 1, "bw_GBps": 1},
                                                  {"src": 1, "dst": 0, "alpha_us": 1, "bw_GBps": 1}]}, "split")
    with pytest.raises(InputError, match="cannot be reached"):
        lower_bound("allgather", t, 1024)


@pytest.mark.parametrize("name, nodes", [("dgx1", None), ("ndv2-4node-tecc", None), ("dgx2", 2), ("ndv2", 4)])
def test_alltoall_cuts_never_exceed_the_concurrent_flow_lp(name, nodes):
    from synth.bounds.physical import alltoall_cut_units, alltoall_units, flow_network
    t = load_topology(name, nodes=nodes) if nodes else load_topology(name)
    net = flow_network(t)
    assert alltoall_cut_units(net, t) <= alltoall_units(net, t.num_ranks) * (1 + 1e-9)


def test_alltoall_on_256_gpus_is_bounded_by_the_nics_not_refused():
    # 32 x DGX-H100, rail: the concurrent-flow LP would have 256 commodities; the node cut (8 NICs of 50 GB/s)
    # binds: each GPU sends 248 of its 256 blocks through its own NIC
    t = load_topology("dgx-h100", nodes=32, fabric="rail")
    b = lower_bound("alltoall", t, 1 << 30)
    assert b.bandwidth_us == pytest.approx(248 * (1 << 30) / 256 / 50e3)
    assert b.method.startswith("min cuts around ranks, shared ports and nodes")


def test_the_drain_bound_adds_the_least_alpha_where_ports_are_no_slower_than_their_links():
    from synth.bounds.physical import drain_alpha_us
    b = lower_bound("allgather", load_topology("dgx-h100"), 1 << 20)
    assert b.drain_us == pytest.approx(b.bandwidth_us + 0.6) and b.limit_us == b.drain_us
    assert b.limit_source == "bandwidth" and b.binding == "bandwidth"
    assert drain_alpha_us(load_topology("dgx-h100", nodes=2)) == 0.0     # composed: the crossing bound counts it


@pytest.mark.parametrize("name", ["dgx1", "dgx-h100", "ring-8", "fully-connected-8"])
def test_no_baseline_replays_below_the_drained_limit(name):
    # soundness on the sizes where the alpha is a large part of the limit (the benchmarks' 766 rows, 1 KB to
    # 4 GB, agree: the written files and the baselines are all at or above it)
    from synth.schedule.replay import verify
    from synth.synthesis.baselines import best_baseline
    topo = load_topology(name)
    for collective in ("allgather", "broadcast", "allreduce", "alltoall"):
        for size in (64 << 10, 1 << 20):
            limit = lower_bound(collective, topo, size).limit_us
            best = best_baseline(collective, topo, size, None)
            assert verify(best.schedule, topo, size).time_us >= limit * (1 - 1e-9), (collective, size)
