"""TACCL's topology profiles as TACCL writes them (synth/model/taccl.py).

Every profile below is written by this project in TACCL's format; each docstring/comment names the format
feature it exercises.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.errors import InputError
from synth.model.taccl import profile_size_bytes, taccl_topology_to_dict
from synth.model.topology import check_connected, load_topology, topology_from_dict

MB = 1 << 20

# node_betas_list profile, two link classes on 8 GPUs (TACCL's NDv2 layout), one NIC, size in the name.
CUBE_1MB = {"name": "Cube_1MB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.5,
            "node_betas_list": [25, 50], "node_invbws_list": [25.5, 50.5],
            "remote_alpha": 3, "remote_beta": 100, "remote_invbw": 103}
# The same machine pre-multiplied by 100 for a 1KB profile (TACCL's guide: keep an integral part).
CUBE_1KB = {"name": "Cube_1KB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 50,
            "node_betas_list": [2.44, 4.88], "node_invbws_list": [52.44, 54.88],
            "remote_alpha": 300, "remote_beta": 9.77, "remote_invbw": 309.77}
# One beta: TACCL's DGX-2 / hub-and-spoke switch, 16 GPUs and 8 NICs, size only in the file name,
# node_invbws_list only (beta = invbw - alpha), remote_invbw only.
SWITCH = {"name": "Switched", "gpus_per_node": 16, "nics_per_node": 8, "alpha": 1, "node_invbws_list": [9],
          "remote_alpha": 2, "remote_invbw": 102}


def _write(tmp_path, name, raw):
    f = tmp_path / name
    f.write_text(json.dumps(raw))
    return f


def test_betas_list_profile_is_the_cube_mesh_at_the_profile_size(tmp_path):
    t = load_topology(str(_write(tmp_path, "cube.json", CUBE_1MB)))
    mesh = load_topology("dgx1")
    assert {(l.src, l.dst, l.lanes) for l in t.links} == {(l.src, l.dst, l.lanes) for l in mesh.links}
    double, single = t.link(0, 1), t.link(0, 2)
    assert double.lanes == 2 and double.capacity_GBps == pytest.approx(MB / 25 / 1e3)
    assert single.lanes == 1 and single.bw_GBps == pytest.approx(MB / 50 / 1e3)
    assert double.alpha_us == 0.5
    (nic,) = t.nics
    assert nic.ranks == tuple(range(8)) and nic.bw_GBps == pytest.approx(MB / 100 / 1e3) and nic.alpha_us == 3
    assert "for 1MB messages" in t.description and "from its name 'Cube_1MB'" in t.description
    check_connected(load_topology(str(_write(tmp_path, "cube2.json", CUBE_1MB)), nodes=2))


def test_a_pre_scaled_1kb_profile_keeps_the_ratios_and_names_its_size(tmp_path):
    """The 1KB profile's costs are x100 (TACCL's guide): alpha/beta ratios match the 1MB machine's at 1KB."""
    small = load_topology(str(_write(tmp_path, "cube-small.json", CUBE_1KB)))
    assert "for 1KB messages" in small.description and "own unit" in small.description
    per_kb = 1024 / (small.link(0, 2).bw_GBps * 1e3)     # cost of 1KB on a single link, profile units
    assert per_kb == pytest.approx(4.88) and small.link(0, 2).alpha_us == 50


def test_switch_profile_from_invbws_with_size_in_the_file_name(tmp_path):
    t = load_topology(str(_write(tmp_path, "topo-switched-32KB.json", SWITCH)))
    (sw,) = t.switches
    assert len(sw.ports) == 16 and sw.alpha_us == 1
    assert sw.ports[0].egress_GBps == pytest.approx(32 * 1024 / 8 / 1e3)  # beta = invbw - alpha = 8
    assert [n.ranks for n in t.nics] == [(2 * k, 2 * k + 1) for k in range(8)]
    assert t.nics[0].bw_GBps == pytest.approx(32 * 1024 / 100 / 1e3)
    assert "from its file name 'topo-switched-32KB'" in t.description


def test_without_a_size_betas_are_us_per_mb_and_the_description_says_so(tmp_path):
    raw = dict(SWITCH, name="Switched")
    assert profile_size_bytes(raw, "x.json") == (MB, "no size in its name or file name, so betas are read as "
                                                     "us per MB")
    t = load_topology(str(_write(tmp_path, "x.json", raw)))
    assert "us per MB" in t.description


def test_custom_matrix_form_is_indexed_destination_then_source(tmp_path):
    """TACCL's custom form: links/betas/invbws matrices with row = destination, column = source."""
    raw = {"name": "custom_1MB", "gpus_per_node": 3, "alpha": 0.7,
           "links": [[0, 1, 0], [0, 0, 2], [1, 0, 0]],        # 1->0, 2->1 (2 lanes), 0->2
           "betas": [[0, 50, 0], [0, 0, 40], [25, 0, 0]], "invbws": [[0, 50.7, 0], [0, 0, 40.7], [25.7, 0, 0]]}
    t = load_topology(str(_write(tmp_path, "c.json", raw)))
    assert {(l.src, l.dst, l.lanes) for l in t.links} == {(1, 0, 1), (2, 1, 2), (0, 2, 1)}
    assert t.link(0, 2).bw_GBps == pytest.approx(MB / 25 / 1e3)
    check_connected(t)


@pytest.mark.parametrize("raw,field,words", [
    ({"name": "z", "gpus_per_node": 2, "alpha": 1, "links": [[0, 0], [0, 0]], "betas": [[0, 1], [1, 0]]},
     "links", "yields no links"),
    ({"name": "z", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 1, "remote_alpha": 1, "remote_beta": 2},
     "node_betas_list", "gives no intra-node links"),
    ({"name": "z", "gpus_per_node": 4, "alpha": 1, "node_betas_list": [1, 2]}, "node_betas_list",
     "2 values on 8 GPUs"),
    ({"name": "z", "gpus_per_node": 4, "alpha": 1, "node_betas_list": [1], "nics_per_node": 1},
     "remote_alpha", "missing"),
    ({"name": "z", "gpus_per_node": 4, "alpha": 5, "node_invbws_list": [3]}, "node_betas_list[0]", "positive"),
    ({"name": "z", "gpus_per_node": 4, "alpha": 1, "node_betas_list": [1], "nics_per_node": 3,
      "remote_alpha": 1, "remote_beta": 1}, "nics_per_node", "evenly"),
    ({"name": "z", "gpus_per_node": 2, "links": [[0, 1], [1]], "betas": 4}, "links", "2 x 2 matrix"),
    ({"name": "z", "gpus_per_node": 10 ** 7, "alpha": 1, "node_betas_list": [1]}, "gpus_per_node", "1..4096"),
])
def test_profiles_that_give_no_usable_links_name_the_fields(tmp_path, raw, field, words):
    with pytest.raises(InputError) as info:
        taccl_topology_to_dict(raw, "p.json")
    assert info.value.field == field and words in info.value.problem, info.value


@pytest.mark.parametrize("spelling", ["DGX1", "Dgx1", "NDv2", "Ring-4"])
def test_builtin_names_are_case_insensitive_as_msccl_tools_spells_them(spelling):
    assert load_topology(spelling).name == spelling.lower()


_VALUES = st.one_of(st.integers(-2, 20), st.floats(-1, 300, allow_nan=False), st.text(max_size=4), st.none(),
                    st.lists(st.floats(0, 60, allow_nan=False) | st.integers(0, 3), max_size=4),
                    st.lists(st.lists(st.integers(0, 2), min_size=2, max_size=3), min_size=2, max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "gpus_per_node", "nics_per_node", "alpha", "node_betas_list",
                                        "node_invbws_list", "remote_alpha", "remote_beta", "remote_invbw",
                                        "links", "betas", "invbws"]), _VALUES, min_size=1))
def test_any_profile_ends_in_a_topology_or_an_input_error(raw):
    try:
        topo = topology_from_dict(taccl_topology_to_dict(raw, "fuzz-1MB.json"), "fuzz-1MB.json")
    except InputError:
        return
    assert topo.num_ranks >= 1 and (topo.links or topo.num_ranks == 1)


def test_topo_show_says_which_size_a_taccl_profile_describes(tmp_path):
    from click.testing import CliRunner
    from synth.cli import main
    f = _write(tmp_path, "topo-cube-1MB.json", CUBE_1MB)
    result = CliRunner().invoke(main, ["topo", "show", str(f)])
    assert result.exit_code == 0, result.output
    assert "TACCL profile Cube_1MB for 1MB messages" in result.output and "32 direct links" in result.output
    result = CliRunner().invoke(main, ["topo", "show", str(f), "--nodes", "2"])
    assert "64 direct links" in result.output      # the cube-mesh on both nodes, joined through the NICs
