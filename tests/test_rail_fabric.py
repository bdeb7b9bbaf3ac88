"""Composed clusters: the rail-optimized fabric, the one port concept (PortUse) and composition at scale."""

import pickle

import pytest
from click.testing import CliRunner

from synth.bounds.physical import lower_bound
from synth.cli import main
from synth.errors import InputError
from synth.model.symmetry import free_symmetry_group, is_automorphism
from synth.model.topology import Direction, PortUse, compose_nodes, load_topology, topology_from_dict
from synth.schedule.costmodel import LinkClock

E, I = Direction.EGRESS, Direction.INGRESS


def _pair_node():
    """Two GPUs with no link between them, each with its own 50 GB/s NIC: every transfer between the two rails
    must cross the spine."""
    return topology_from_dict({"format": "synth-topology/1", "name": "pair", "ranks": 2, "gpus_per_node": 2,
                               "links": [], "nics": [{"ranks": [0], "bw_GBps": 50.0, "alpha_us": 2.0},
                                                     {"ranks": [1], "bw_GBps": 50.0, "alpha_us": 2.0}]})


@pytest.mark.parametrize("name,nodes,fabric,oversubscription", [
    ("dgx-h100", 3, "rail", 2.0), ("dgx-h100", 2, "switch", 1.0), ("ndv2", 3, "switch", 1.0),
    ("ndv2", 2, "rail", 1.0), ("dgx2", 2, "rail", 1.0)])
def test_links_made_on_demand_equal_the_file_loaders(name, nodes, fabric, oversubscription):
    t = load_topology(name, nodes, fabric, oversubscription)
    from_file = topology_from_dict(t.to_dict(), "round trip")
    assert list(t.links) == list(from_file.links)
    assert t.switches == from_file.switches
    assert all(t.link_index[(l.src, l.dst)] == i for i, l in enumerate(from_file.links))
    assert all(is_automorphism(t, perm) for perm in t.symmetries)


def test_rail_links_charge_the_leaves_and_the_spine():
    t = load_topology("dgx-h100", 4, "rail", 2.0)
    assert t.name == "dgx-h100x4-rail"
    same_rail = t.link(3, 8 + 3)
    assert same_rail.ports == (PortUse("rail3", 0, E), PortUse("rail3", 1, I)) and same_rail.alpha_us == 2.0
    cross = t.link(3, 16 + 5)
    assert cross.ports == (PortUse("rail3", 0, E), PortUse("spine", 3, E), PortUse("spine", 5, I),
                           PortUse("rail5", 2, I))
    assert cross.alpha_us == 2.5 and cross.bw_GBps == 50.0
    assert t.port_capacity()[PortUse("spine", 3, E)] == 4 * 50.0 / 2.0
    assert t.link(3, 5).ports[0].switch == "nvswitch@node0"          # inside a node: NVSwitch, not the rails


def test_composed_symmetry_is_node_rotation_times_the_node_group():
    assert len(free_symmetry_group(load_topology("dgx-h100", 4, "rail"))) == 32
    assert len(free_symmetry_group(load_topology("dgx-h100", 32, "rail"))) == 256


@pytest.mark.parametrize("oversubscription,alltoall_us,allgather_us", [
    (1.0, 15000.0, 15000.0), (2.0, 20000.0, 15000.0), (4.0, 40000.0, 20000.0)])
def test_the_spine_bounds_cross_rail_traffic(oversubscription, alltoall_us, allgather_us):
    # 2 nodes x 2 rails, 1e9 bytes. Alltoall: a NIC sends 3 x 250 MB (15 ms at 50 GB/s); rail 0 sends rail 1
    # 4 x 250 MB through one uplink of 2 x 50 / R GB/s: 10 ms x R. Allgather: a rank receives 750 MB (15 ms);
    # rail 0's 2 shards leave through the uplink: 500 MB at 100 / R GB/s, 5 ms x R.
    t = compose_nodes(_pair_node(), 2, "rail", oversubscription)
    assert lower_bound("alltoall", t, 1e9).bandwidth_us == pytest.approx(alltoall_us)
    assert lower_bound("allgather", t, 1e9).bandwidth_us == pytest.approx(allgather_us)


def test_non_blocking_rails_match_the_single_switch_for_allgather():
    switch = lower_bound("allgather", load_topology("dgx-h100", 4), 2**30)
    rail = lower_bound("allgather", load_topology("dgx-h100", 4, "rail"), 2**30)
    assert rail.bandwidth_us == pytest.approx(switch.bandwidth_us) == pytest.approx(2080.375, abs=1e-3)


@pytest.mark.parametrize("oversubscription,second_start_us", [(2.0, 20.0), (1.0, 10.0)])
def test_transfers_between_rails_share_the_uplink(oversubscription, second_start_us):
    """Two transfers of 1 MB leave rail 0 at once. R = 2: leaf 0's uplink carries 50 GB/s, so they take turns on
    it. R = 1: it carries 2 x 50 GB/s, so each holds it for its bytes at 100 GB/s and the second waits only for that
    share, not for a whole 50 GB/s transfer."""
    t = compose_nodes(_pair_node(), 2, "rail", oversubscription)
    clock = LinkClock(t)
    first = clock.reserve(t.link_index[(0, 1)], 0.0, 1e6)
    second = clock.reserve(t.link_index[(2, 3)], 0.0, 1e6)
    assert first.start_us == 0.0 and second.start_us == pytest.approx(second_start_us)
    assert second.busy_until_us - second.start_us == pytest.approx(20.0)    # 1 MB at the NIC's 50 GB/s
    back = clock.reserve(t.link_index[(1, 0)], 0.0, 1e6)            # full duplex: the way down is free
    assert back.start_us == 0.0


def test_one_nic_machines_keep_the_single_switch():
    t = load_topology("ndv2", 4, "rail")
    assert t.name == "ndv2x4" and "one NIC per node" in t.description
    assert [s.name for s in t.switches] == ["network"]


def test_composed_topology_pickles_for_worker_processes():
    t = load_topology("dgx-h100", 3, "rail")
    back = pickle.loads(pickle.dumps(t))
    assert back == t and back.link(0, 9) == t.link(0, 9)


def test_oversubscription_needs_the_rail_fabric():
    with pytest.raises(InputError, match="--oversubscription: applies to the spine of --fabric rail"):
        load_topology("dgx-h100", 2, "switch", 2.0)


def test_a_spine_port_must_name_a_leaf_declared_before_it():
    raw = load_topology("dgx-h100", 2, "rail").to_dict()
    raw["switches"][-1]["ports"][0] = {"switch": "nowhere", "bw_GBps": 100}
    with pytest.raises(InputError, match=r"switches\[10\].ports\[0\].switch: 'nowhere' is not a leaf switch"):
        topology_from_dict(raw, "t.json")


def test_topo_show_summarises_a_rail_cluster():
    result = CliRunner().invoke(main, ["topo", "show", "dgx-h100", "--nodes", "32", "--fabric", "rail"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("dgx-h100x32-rail: 256 ranks, 32 node(s) of 8")
    assert "switch rail0 .. rail7 (8 switches alike) (alpha 2 us)" in out and "32 ports of 1 rank(s), 50/50" in out
    assert "switch spine (alpha 0.5 us) ports leaf:egress/ingress GB/s: rail0:1600/1600" in out
    assert "symmetry: 256 rank permutations acting freely" in out
    assert len(out.splitlines()) < 40


def test_a_rail_cluster_written_as_json_follows_the_schema():
    import json
    from importlib import resources

    import jsonschema
    schema = json.loads((resources.files("synth") / "schemas" / "topology.schema.json").read_text())
    jsonschema.validate(load_topology("dgx-h100", 2, "rail").to_dict(), schema)


@pytest.mark.parametrize("name,fabric", [("dgx-h100", "rail"), ("ndv2", "switch")])
def test_a_reversed_cluster_is_the_file_loaders_reversed(name, fabric):
    from synth.model.topology import reverse_topology
    t = load_topology(name, 3, fabric, 2.0 if fabric == "rail" else 1.0)
    expected = reverse_topology(topology_from_dict(t.to_dict(), "round trip"))
    got = reverse_topology(t)
    assert list(got.links) == list(expected.links) and got.switches == expected.switches
    assert got.sms_per_gpu == t.sms_per_gpu


@pytest.mark.parametrize("name,nodes,fabric,orbits", [
    ("dgx-h100", 2, "switch", 4),     # NVSwitch ports of both nodes; NIC ports; each way
    ("dgx-h100", 3, "rail", 6),       # NVSwitch, leaf and spine ports
    ("dgx2", 2, "rail", 8)])          # its group rotates NIC pairs: a pair's two GPUs stay apart (2 NVSwitch orbits)
def test_port_orbits_span_nodes_and_rails(name, nodes, fabric, orbits):
    from synth.model.collectives import make_collective
    from synth.model.symmetry import symmetry_for_collective
    t = load_topology(name, nodes, fabric)
    group = symmetry_for_collective(t, make_collective("alltoall", t.num_ranks, 1))
    reps = group.port_orbit_reps(t)
    images = group.link_images(t)
    links = list(t.links)
    for g in range(group.order):          # a permutation maps a link's k-th port onto its image's k-th port
        for li, link in enumerate(links):
            image = links[images[g, li]]
            assert [reps[u] for u in link.ports] == [reps[u] for u in image.ports]
    assert len(set(reps.values())) == orbits
