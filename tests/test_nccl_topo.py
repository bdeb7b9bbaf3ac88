"""Importing NCCL topology dumps (backends/nccl_topo.py) and `synth topo import-nccl`."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.nccl.topo_import import import_nccl_dumps, parse_nccl_dump, pcie_bandwidth_GBps
from synth.cli import main
from synth.errors import InputError
from synth.model.topology import check_connected, load_topology, topology_from_dict

DATA = Path(__file__).resolve().parent / "data" / "nccl"
DGX1 = DATA / "dgx1_v100.xml"
A100 = DATA / "dgx_a100.xml"
PCIE = DATA / "pcie_4gpu.xml"


def _load(*paths):
    return topology_from_dict(import_nccl_dumps(list(paths)), str(paths[0]))


def test_dgx1_dump_has_the_builtin_cube_mesh():
    t = _load(DGX1)
    builtin = load_topology("dgx1")
    assert {(l.src, l.dst, l.lanes) for l in t.links} == {(l.src, l.dst, l.lanes) for l in builtin.links}
    assert all(l.bw_GBps == 20.0 and l.switch is None for l in t.links)  # sm70: 20 GB/s per NVLink
    for r in range(8):
        assert sum(l.lanes for l in t.links if l.src == r) == 6
    # one 100 Gb/s NIC per PCIe switch, shared by the two GPUs behind it
    assert [(n.ranks, n.bw_GBps) for n in t.nics] == [((0, 1), 12.5), ((2, 3), 12.5), ((4, 5), 12.5),
                                                      ((6, 7), 12.5)]
    check_connected(t)


def test_a100_dump_is_an_nvswitch_with_one_nic_per_gpu():
    t = _load(A100)
    assert not [l for l in t.links if l.switch is None]
    (sw,) = t.switches
    assert [p.ranks for p in sw.ports] == [(r,) for r in range(8)]
    assert all(p.egress_GBps == p.ingress_GBps == 12 * 20.0 for p in sw.ports)  # 12 NVLinks x 20 GB/s
    assert len(t.links) == 56 and t.link(0, 7).bw_GBps == 240.0
    assert [(n.ranks, n.bw_GBps) for n in t.nics] == [((r,), 25.0) for r in range(8)]  # 200 Gb/s each


def test_pcie_box_gets_pcie_paths_from_link_speed_and_width():
    t = _load(PCIE)
    assert len(t.links) == 12 and not t.switches
    for l in t.links:
        expected = 12.0 if 3 in (l.src, l.dst) else 24.0  # Gen4 x16 = 24 GB/s; GPU 3 sits in an x8 slot
        assert (l.bw_GBps, l.lanes) == (expected, 1), l
    assert [(n.ranks, n.bw_GBps) for n in t.nics] == [((0, 1, 2, 3), 12.5)]


def test_two_dumps_make_two_nodes_joined_through_their_nics(tmp_path):
    t = _load(A100, A100)
    assert (t.num_ranks, t.gpus_per_node, t.num_nodes) == (16, 8, 2)
    net = t.switches[-1]
    assert net.name == "network" and len(net.ports) == 16
    assert all(p.egress_GBps == 25.0 for p in net.ports)
    cross = t.link(3, 11)
    assert cross.switch == "network" and cross.bw_GBps == 25.0
    assert t.link(8, 15).switch == "nvswitch@node1"
    single = tmp_path / "a100.json"
    single.write_text(json.dumps(import_nccl_dumps([A100])))
    same = load_topology(str(single), nodes=2)  # the same as composing one node with --nodes 2
    assert {(l.src, l.dst, l.bw_GBps) for l in same.links} == {(l.src, l.dst, l.bw_GBps) for l in t.links}


@pytest.mark.parametrize("speed,width,expected", [("16.0 GT/s PCIe", "16", 24.0), ("8 GT/s", "16", 12.0),
                                                  ("8.0 GT/s PCIe", "8", 6.0), ("32.0 GT/s PCIe", "16", 48.0),
                                                  ("", "16", None), ("Unknown", "x", None)])
def test_pcie_bandwidth(speed, width, expected):
    assert pcie_bandwidth_GBps(speed, width) == expected


SMALL = """<system version="1"><cpu numaid="0" vendor="GenuineIntel">
<pci busid="0000:01:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
<gpu dev="0" sm="{sm}" rank="0" gdr="1">{nvlink}</gpu></pci>
<pci busid="0000:02:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
<gpu dev="1" sm="{sm}" rank="1" gdr="1"/></pci></cpu>
<cpu numaid="1" vendor="GenuineIntel"><pci busid="0000:81:00.0" class="0x030200" link_speed="16.0 GT/s PCIe"
link_width="16"><gpu dev="2" sm="{sm}" rank="2" gdr="1"/></pci></cpu></system>"""


def test_nvlink_components_and_cross_socket_pcie(tmp_path):
    f = tmp_path / "d.xml"
    f.write_text(SMALL.format(sm=90, nvlink='<nvlink target="0000:02:00.0" count="4" tclass="0x030200"/>'))
    t = _load(f)
    assert (t.link(0, 1).lanes, t.link(0, 1).bw_GBps) == (4, 20.6)
    assert t.link(1, 0) is None             # only GPU 0 lists the NVLink; GPUs 0 and 1 share a component
    assert t.link(0, 2).bw_GBps == 10.0     # PCIe path crosses the Intel inter-socket link
    assert t.link(2, 1).bw_GBps == 10.0 and t.link(2, 0).alpha_us == 1.0


@pytest.mark.parametrize("text,match", [
    ('<!DOCTYPE s [<!ENTITY x "y">]><system version="1"/>', "refused"),
    ("<system version='1'><cpu>", "invalid XML"),
    ("<graphs version='1'/>", "root element must be <system"),
    ("<system version='2'/>", "unsupported version"),
    ("<system version='1'/>", "no <gpu> elements"),
    (SMALL.format(sm=75, nvlink='<nvlink target="0000:02:00.0" count="1" tclass="0x030200"/>'),
     "no NVLink bandwidth known for sm75"),
    (SMALL.format(sm=70, nvlink='<nvlink target="0000:02:00.0" count="x1" tclass="0x030200"/>'),
     r"gpu\[dev=0\].nvlink\[0\].count: must be an integer"),
    (SMALL.format(sm=70, nvlink='<nvlink target="0000:02:00.0" count="999" tclass="0x030200"/>'),
     "not plausible"),
    (SMALL.replace('dev="1"', 'dev="0"').format(sm=70, nvlink=""), r"device\(s\) \[0\] appear twice"),
    ('<system version="1"><gpu dev="0" sm="70"/></system>', "must sit inside the <pci"),
])
def test_bad_dumps_name_file_and_problem(tmp_path, text, match):
    f = tmp_path / "bad.xml"
    f.write_text(text)
    with pytest.raises(InputError, match=match) as info:
        import_nccl_dumps([f])
    assert str(f) in str(info.value)


def test_nodes_must_have_the_same_gpu_count():
    with pytest.raises(InputError, match="every node must have the same number of GPUs"):
        import_nccl_dumps([A100, PCIE])


def test_nodes_without_nics_cannot_be_joined(tmp_path):
    f = tmp_path / "d.xml"
    f.write_text(SMALL.format(sm=70, nvlink=""))
    with pytest.raises(InputError, match="has no network device"):
        import_nccl_dumps([f, f])


def test_oversized_file_is_refused_before_parsing(tmp_path, monkeypatch):
    import backends.nccl.topo_import as nt
    monkeypatch.setattr(nt, "MAX_DUMP_BYTES", 100)
    with pytest.raises(InputError, match="limit 100"):
        import_nccl_dumps([DGX1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300) | st.sampled_from([DGX1.read_text()[:n] for n in (50, 700, 2000, 4000)]))
def test_any_text_ends_in_a_topology_or_an_input_error(text):
    try:
        node = parse_nccl_dump(text, "fuzz.xml")
    except InputError:
        return
    assert node.gpus


def test_cli_import_nccl_writes_a_loadable_topology(tmp_path):
    out = tmp_path / "topo.json"
    result = CliRunner().invoke(main, ["topo", "import-nccl", str(DGX1), str(DGX1), "-o", str(out)])
    assert result.exit_code == 0, result.output
    t = load_topology(str(out))
    assert t.num_ranks == 16 and t.num_nodes == 2
    assert "wrote" in result.output


def test_cli_import_nccl_bad_file_is_one_error_line(tmp_path):
    f = tmp_path / "bad.xml"
    f.write_text("<system>")
    result = CliRunner().invoke(main, ["topo", "import-nccl", str(f), "-o", str(tmp_path / "t.json")])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


def test_solve_on_imported_dgx1_dump_matches_the_builtin(dgx1):
    """Same machine, same answers: (2,3,2) and (3,7,6) feasible, (3,6,6) infeasible, same symmetry and sends.

    Only bandwidth differs (NCCL's sm70 NVLink figure is 20 GB/s per link, SCCL's model uses 25), so predicted
    times scale by exactly 25/20 at large sizes.
    """
    from synth.model.collectives import make_collective
    from synth.model.symmetry import symmetry_for_collective
    from synth.errors import InfeasibleError
    from synth.schedule.replay import verify
    from synth.synthesis.steps import synthesize_steps

    imported = topology_from_dict(import_nccl_dumps([DATA / "dgx1_v100.xml"]), "dgx1_v100.xml")
    coll = make_collective("allgather", 8, 6)
    assert symmetry_for_collective(imported, coll).order == symmetry_for_collective(dgx1, coll).order == 4
    for S, R, C in ((2, 3, 2), (3, 7, 6)):
        a = synthesize_steps(imported, "allgather", S, R, C).schedule
        b = synthesize_steps(dgx1, "allgather", S, R, C).schedule
        assert len(a.transfers) == len(b.transfers)
        size = 1 << 30
        ratio = verify(a, imported, size).time_us / verify(b, dgx1, size).time_us
        assert abs(ratio - 25 / 20) < 0.01
    with pytest.raises(InfeasibleError):
        synthesize_steps(imported, "allgather", 3, 6, 6)
