"""Topology loading, built-ins, composition and symmetry."""

import json

import jsonschema
import pytest

from synth.errors import InputError
from synth.model.symmetry import free_symmetry_group
from synth.model.topology import builtin_names, load_topology, topology_from_dict


def test_dgx1_has_sccl_matrix():
    t = load_topology("dgx1")
    assert t.num_ranks == 8
    for r in range(8):
        assert sum(l.lanes for l in t.links if l.src == r) == 6
    assert t.link(0, 1).lanes == 2 and t.link(0, 2).lanes == 1 and t.link(0, 5) is None


def test_dgx1_free_symmetry_has_four_elements():
    group = free_symmetry_group(load_topology("dgx1"))
    assert len(group) == 4
    assert (2, 3, 0, 1, 6, 7, 4, 5) in group


@pytest.mark.parametrize("name", builtin_names() + ["ring-5", "fully-connected-3"])
def test_every_builtin_loads_and_is_connected(name):
    from synth.model.topology import check_connected
    t = load_topology(name)
    check_connected(t)
    assert t.num_ranks % t.gpus_per_node == 0


def test_compose_two_ndv2_nodes_through_one_nic():
    t = load_topology("ndv2", nodes=2)
    assert t.num_ranks == 16 and t.num_nodes == 2
    cross = [l for l in t.links if t.node_of(l.src) != t.node_of(l.dst)]
    assert len(cross) == 2 * 8 * 8
    assert all(l.switch == "network" and l.bw_GBps == 12.5 for l in cross)
    # all cross-node traffic of a node shares its one NIC port
    assert len({l.ports[0] for l in cross if l.src < 8}) == 1


def test_user_file_with_unknown_rank_is_rejected(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"ranks": 2, "links": [{"src": 0, "dst": 5, "alpha_us": 1, "bw_GBps": 1}]}))
    with pytest.raises(InputError, match=r"bad.json: links\[0\].dst: unknown rank 5"):
        load_topology(str(f))


def test_negative_bandwidth_is_rejected(tmp_path):
    f = tmp_path / "neg.json"
    f.write_text(json.dumps({"ranks": 2, "links": [{"src": 0, "dst": 1, "alpha_us": 1, "bw_GBps": -3}]}))
    with pytest.raises(InputError, match=r"links\[0\].bw_GBps: must be positive"):
        load_topology(str(f))


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_files_follow_the_schema(name):
    from importlib import resources
    schema = json.loads((resources.files("synth") / "schemas" / "topology.schema.json").read_text())
    raw = json.loads((resources.files("synth.topologies") / f"{name}.json").read_text())
    jsonschema.validate(raw, schema)


def test_taccl_format_is_converted(tmp_path):
    f = tmp_path / "taccl.json"
    f.write_text(json.dumps({"name": "t", "links": [[0, 2], [2, 0]], "alpha": [[0, 0.7], [0.7, 0]],
                             "betas": [[0, 40], [40, 0]]}))
    t = load_topology(str(f))
    assert t.link(0, 1).lanes == 2 and t.link(0, 1).alpha_us == 0.7
    assert abs(t.link(0, 1).bw_GBps - (1 << 20) / 40 / 1e3) < 1e-9  # no size in the name: beta in us per MB


@pytest.mark.parametrize("change,message", [
    (lambda r: r.update(switches=5), "switches: must be a list of {name, alpha_us, ports}"),
    (lambda r: r["switches"][0].update(name=["a"]), "switches[0].name: must be a non-empty string, got ['a']"),
    (lambda r: r["switches"][0]["ports"][0].update(bw_GBps=0), "ports[0].bw_GBps: must be positive, got 0"),
    (lambda r: r["switches"][0]["ports"][0].update(bw_GBps=1e-300),
     "ports[0].bw_GBps: 1e-300 is outside the range 0.001..100000"),
    (lambda r: r["switches"][0]["ports"][0].update(bw_GBps=float("inf")),
     "ports[0].bw_GBps: must be a finite number, got inf"),
    (lambda r: r.update(defaults={"alpha_us": -1}), "defaults.alpha_us: must not be negative, got -1"),
    (lambda r: r.update(symmetries=[[0.0, 1, 2, 3, 4, 5, 6, 7]]), "symmetries[0]: must be a permutation of 0..7"),
    (lambda r: r.update(symmetries=[["a", {}]]), "symmetries[0]: must be a permutation of 0..7"),
    (lambda r: r.update(links=[{"src": 0, "dst": 1, "alpha_us": 1, "bw_GBps": 9, "bidirectional": "no"}]),
     "links[0].bidirectional: must be true or false, got 'no'"),
    (lambda r: r.update(links=[{"src": 0, "dst": 1, "alpha_us": 1, "bw_GBps": 9, "lanes": 1.5}]),
     "links[0].lanes: must be an integer, got 1.5"),
    (lambda r: r.update(sms_per_gpu=0), "topology.sms_per_gpu: must be positive, got 0"),
    (lambda r: r.update(sms_per_gpu=132.5), "topology.sms_per_gpu: must be an integer, got 132.5"),
    (lambda r: r.update(sms_per_gpu=5000), "topology.sms_per_gpu: 5000 is outside the range 1..1024"),
])
def test_type_confusion_in_topology_files_is_one_input_error(change, message):
    raw = load_topology("dgx-h100").to_dict()
    change(raw)
    with pytest.raises(InputError) as err:
        topology_from_dict(raw, "bad.json")
    assert message in str(err.value) and str(err.value).startswith("bad.json")


def test_family_sizes_are_bounded_before_anything_is_built():
    with pytest.raises(InputError, match=r"fully-connected-N takes N in 2\.\.256 .* got 1024"):
        load_topology("fully-connected-1024")
    assert load_topology("ring-1024").num_ranks == 1024


@pytest.mark.parametrize("name, sms", [("dgx1", 80), ("dgx2", 80), ("dgx-a100", 108), ("ndv4", 108),
                                       ("dgx-h100", 132), ("ring-8", None)])
def test_sm_count_is_part_of_the_machine_and_survives_composition_and_json(name, sms):
    topo = load_topology(name)
    assert topo.sms_per_gpu == sms
    assert topology_from_dict(topo.to_dict()).sms_per_gpu == sms
    if topo.nics:
        assert load_topology(name, nodes=2).sms_per_gpu == sms
