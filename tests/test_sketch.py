"""Sketches: shipped ones load on their machines, TACCL's files convert, every bad sketch names field and fix."""

import json

import pytest

from synth.errors import InputError
from synth.model.sketch import builtin_sketch_names, load_sketch, reverse_sketch, sketch_from_dict
from synth.model.topology import load_topology

SHIPPED = [("ndv2-tecc-relay", "ndv2-2node-tecc", 1), ("ndv2-tecc-relay", "ndv2-4node-tecc", 1),
           ("ndv2-nic-relay", "ndv2", 2), ("dgx2-tecc-relay", "dgx2-2node-tecc", 1), ("dgx2-nic-rail", "dgx2", 2),
           ("dgx-a100-rail", "dgx-a100", 2), ("dgx-h100-rail", "dgx-h100", 2), ("dgx-a100-rail", "dgx-a100", 1)]


@pytest.fixture(scope="module")
def tecc():
    return load_topology("ndv2-2node-tecc")


def _bad(raw, topo, field, words, tmp_path=None):
    with pytest.raises(InputError) as info:
        sketch_from_dict(raw, topo, "bad.json")
    assert info.value.source == "bad.json"
    assert info.value.field == field, str(info.value)
    for w in words:
        assert w in info.value.problem, str(info.value)


def test_every_shipped_sketch_is_covered():
    assert {s for s, _, _ in SHIPPED} == set(builtin_sketch_names())


@pytest.mark.parametrize("name,topo,nodes", SHIPPED)
def test_shipped_sketches_load_on_their_topologies(name, topo, nodes):
    t = load_topology(topo, nodes)
    sketch = load_sketch(name, t)
    mask = sketch.allowed_links(t)
    assert mask.any()
    for perm in sketch.symmetry:
        assert sorted(perm) == list(range(t.num_ranks))


def test_shipped_sketches_match_the_json_schema():
    import jsonschema
    from importlib import resources

    schema = json.loads((resources.files("synth") / "schemas" / "sketch.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for name in builtin_sketch_names():
        jsonschema.validate(json.loads((resources.files("synth.sketches") / f"{name}.json").read_text()), schema)


def test_tecc_relay_sketch_restricts_internode_links(tecc):
    sketch = load_sketch("ndv2-tecc-relay", tecc)
    assert sketch.internode.connections == ((1, (0,)),)
    assert sketch.internode.own_chunks_first
    assert sketch.symmetry == (tuple((r + 8) % 16 for r in range(16)),)


def test_taccl_sketch_files_are_converted(tmp_path):
    path = tmp_path / "sk1-ndv2-n2.json"
    path.write_text(json.dumps({"nnodes": 2, "intranode_sketch": {"strategy": "none"},
                                "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [1]}},
                                "symmetry_offsets": [[8, 16]], "hyperparameters": {"input_chunkup": 2}}))
    sketch = load_sketch(path, load_topology("ndv2", 2))
    assert sketch.internode.connections == ((0, (1,)),)
    assert sketch.chunks_per_rank == 2 and len(sketch.symmetry) == 1
    path2 = tmp_path / "sk2-dgx2-n2.json"
    path2.write_text(json.dumps({"nnodes": 2, "intranode_sketch": {
        "strategy": "switch", "switches": [list(range(16))], "switch_hyperedge_strategy": ["uc-min"]},
        "internode_sketch": {"strategy": "relay", "internode_conn": "direct-map",
                             "gpus_to_sender_rev_map": {str(i): [i] for i in range(16)}},
        "symmetry_offsets": [[2, 16], [16, 32]], "hyperparameters": {"input_chunkup": 1}}))
    sketch = load_sketch(path2, load_topology("dgx2", 2))
    assert sketch.switch_strategy == "uc-min"
    assert sketch.internode.relays[3] == (3, (3,))
    assert len(sketch.symmetry) == 2


def test_taccl_sketch_on_a_topology_without_that_link_names_the_connection(tmp_path, tecc):
    path = tmp_path / "sk.json"
    path.write_text(json.dumps({"nnodes": 2, "intranode_sketch": {"strategy": "none"},
                                "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [1]}},
                                "symmetry_offsets": [[8, 16]], "hyperparameters": {"input_chunkup": 1}}))
    with pytest.raises(InputError) as info:
        load_sketch(path, tecc)
    assert info.value.field == "internode.connections.0"
    assert "no such inter-node link" in info.value.problem and "[1]" in info.value.problem


def test_unknown_sketch_name_lists_the_shipped_ones(tecc):
    with pytest.raises(InputError, match="ndv2-tecc-relay"):
        load_sketch("no-such-sketch", tecc)


def test_invalid_json_names_the_line(tmp_path, tecc):
    path = tmp_path / "broken.json"
    path.write_text('{\n "name": "x",\n oops\n}')
    with pytest.raises(InputError) as info:
        load_sketch(path, tecc)
    assert info.value.field == "line 3"


@pytest.mark.parametrize("raw,field,words", [
    ({"format": "other/1"}, "format", ["synth-sketch/1"]),
    ({"surprise": 1}, "surprise", ["unknown field"]),
    ({"gpus_per_node": 16}, "gpus_per_node", ["8"]),
    ({"nodes": 4}, "nodes", ["--nodes 4"]),
    ({"intranode": {"strategy": "links", "links": [[0, 9]]}}, "intranode.links[0]", ["unknown GPU 9", "0..7"]),
    ({"intranode": {"strategy": "links", "links": [[0, 6]]}}, "intranode.links", ["0->6", "existing links"]),
    ({"intranode": {"strategy": "ring", "ring": [0, 1, 0]}}, "intranode.ring", ["twice"]),
    ({"intranode": {"strategy": "mesh"}}, "intranode.strategy", ["all, links or ring"]),
    ({"switch": {"strategy": "uc-mid"}}, "switch.strategy", ["uc-max or uc-min"]),
    ({"internode": {"connections": {"0": [1]}}}, "internode.connections.0", ["no such inter-node link", "[1]"]),
    ({"internode": {"connections": {"1": [0]}, "relays": {"3": [3]}}}, "internode.relays.3",
     ["has no NIC", "[1]"]),
    ({"internode": {"relays": {"1": [12]}}}, "internode.relays.1", ["unknown GPU 12"]),
    ({"internode": {"connections": "ring"}}, "internode.connections", ["direct-map"]),
    ({"symmetry": [{"offset": 1, "group": "node"}]}, "symmetry[0]", ["not a symmetry", "remove it"]),
    ({"symmetry": [{"offset": 3, "group": 5}]}, "symmetry[0].group", ["groups of 5"]),
    ({"symmetry": [{"permutation": [0, 1]}]}, "symmetry[0]", ["every rank"]),
    ({"chunks_per_rank": 0}, "chunks_per_rank", ["positive integer"]),
    ({"hints": {"time_limit_s": -1}}, "hints.time_limit_s", ["positive"]),
    ({"hints": {"speed": 3}}, "hints.speed", ["unknown hint"]),
])
def test_bad_sketches_name_field_and_fix(tecc, raw, field, words):
    _bad(raw, tecc, field, words)


def test_relay_sender_must_be_a_declared_connection():
    topo = load_topology("ndv2", 2)  # every GPU reaches the NIC, so GPU 2 has one
    _bad({"internode": {"connections": {"0": [1]}, "relays": {"2": [2]}}}, topo, "internode.relays.2",
         ["not a sender", "[0]"])


def test_symmetry_must_preserve_the_sketch():
    # [2,3,0,1,6,7,4,5] is a DGX-1 automorphism, but it maps the only allowed links 0<->1 onto 2<->3
    raw = {"intranode": {"strategy": "links", "links": [[0, 1], [1, 0]]},
           "symmetry": [{"permutation": [2, 3, 0, 1, 6, 7, 4, 5]}]}
    _bad(raw, load_topology("dgx1"), "symmetry[0]", ["forbids"])


def test_symmetry_must_preserve_the_relays():
    topo = load_topology("dgx2-2node-tecc")
    relays = {str(2 * k + 1): [2 * k, 2 * k + 1] for k in range(8)}
    relays["1"] = [1]
    raw = {"internode": {"connections": {str(2 * k + 1): [2 * k] for k in range(8)}, "relays": relays},
           "symmetry": [{"offset": 2, "group": "node"}]}
    _bad(raw, topo, "symmetry[0]", ["relays of GPU", "symmetric"])


def test_ring_strategy_allows_only_ring_links():
    topo = load_topology("dgx1")
    sketch = sketch_from_dict({"intranode": {"strategy": "ring", "ring": [0, 1, 3, 2, 6, 7, 5, 4]}}, topo)
    allowed = {(topo.links[i].src, topo.links[i].dst) for i in sketch.allowed_links(topo).nonzero()[0]}
    assert allowed == {(0, 1), (1, 3), (3, 2), (2, 6), (6, 7), (7, 5), (5, 4), (4, 0)}


def test_reverse_sketch_reverses_connections_and_drops_relays(tecc):
    sketch = reverse_sketch(load_sketch("ndv2-tecc-relay", tecc))
    assert sketch.internode.connections == ((0, (1,)),) and sketch.internode.relays is None
