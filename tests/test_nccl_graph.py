"""NCCL graph file export (backends/nccl_graph.py) checked by a reader that follows NCCL's rules (DESIGN 8)."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from backends.nccl.graph_export import export_nccl_graph, find_rings
from synth.synthesis.baselines import build_baseline
from synth.cli import main
from synth.model.collectives import make_collective
from synth.errors import BackendError
from synth.schedule.ir import REDUCE, Schedule, Transfer
from synth.model.topology import load_topology

GRAPH_ATTRS = ("id", "pattern", "crossnic", "nchannels", "speedintra", "speedinter", "latencyinter", "typeintra",
               "typeinter", "samechannels")
_LINE = re.compile(r'^( *)<(/?)([a-z]+)((?: [a-z]+="[^"<>]*")*)(/?)>$')
_ATTR = re.compile(r' ([a-z]+)="([^"]*)"')
_HEX = re.compile(r"^0x[0-9a-f]+$")


def read_nccl_graph(text: str, gpus_per_node: int, multi_node: bool) -> list[list[int]]:
    """A strict reader in the spirit of NCCL's hand-written lexer; returns each channel's GPU devices."""
    assert not text.startswith("<?xml") and "\t" not in text and "'" not in text
    elements = []
    for line in text.splitlines():
        m = _LINE.match(line)
        assert m, f"not one element per line: {line!r}"
        attrs = dict(_ATTR.findall(m.group(4)))
        assert len(attrs) <= 16 and all(len(v) <= 254 for v in attrs.values())
        elements.append((m.group(2) == "/", m.group(3), attrs, m.group(5) == "/"))
    assert elements[0][1:3] == ("graphs", {"version": "1"}) and elements[-1][:2] == (True, "graphs")
    closing, tag, graph, _ = elements[1]
    assert tag == "graph" and set(GRAPH_ATTRS) <= set(graph)
    assert graph["id"] == "0" and graph["pattern"] == "4"
    assert float(graph["speedintra"]) > 0 and float(graph["speedinter"]) > 0
    channels, current = [], None
    for closing, tag, attrs, empty in elements[2:-2]:
        if tag == "channel":
            if closing:
                channels.append(current)
            else:
                current = []
            continue
        assert tag in ("gpu", "net") and empty and set(attrs) == {"dev"} and _HEX.match(attrs["dev"]), attrs
        current.append((tag, int(attrs["dev"], 16)))
    assert int(graph["nchannels"]) == len(channels) >= 1
    out = []
    for ch in channels:
        if multi_node:
            assert ch[0][0] == "net" and ch[-1][0] == "net", "multi-node channels start and end with <net>"
            ch = ch[1:-1]
        assert all(tag == "gpu" for tag, _ in ch), "nets only at the ends of a multi-node channel"
        devs = [d for _, d in ch]
        assert sorted(devs) == list(range(gpus_per_node)), "every local GPU exactly once per channel"
        out.append(devs)
    return out


def _ring_schedule(collective: str, ring: list[int], topology: str, chunks_per_rank: int = 1) -> Schedule:
    """Allgather/Allreduce along one ring: every chunk hops successor to successor."""
    n = len(ring)
    coll = make_collective(collective, n, chunks_per_rank)
    nxt = {ring[i]: ring[(i + 1) % n] for i in range(n)}
    transfers = []
    for c in coll.chunks:
        if collective == "allgather":
            r = next(iter(c.sources))
            for step in range(n - 1):
                transfers.append(Transfer(c.id, r, nxt[r], step))
                r = nxt[r]
        else:  # allreduce: reduce along the ring towards the chunk's owner, then spread the sum
            owner = ring[c.id % n]
            r = nxt[owner]
            for step in range(n - 1):
                transfers.append(Transfer(c.id, r, nxt[r], step, REDUCE))
                r = nxt[r]
            for step in range(n - 1, 2 * n - 2):
                transfers.append(Transfer(c.id, r, nxt[r], step))
                r = nxt[r]
    return Schedule(coll, topology, tuple(transfers), 2 * n)


def test_ring_baseline_exports_its_ring():
    topo = load_topology("dgx1")
    schedule = build_baseline("ring", "allreduce", topo)
    text = export_nccl_graph(schedule, topo)
    channels = read_nccl_graph(text, 8, multi_node=False)
    ring = [tuple(r) for r in schedule.notes["rings"]]
    # the ring uses only double NVLink pairs (2 lanes x 25 GB/s): NCCL's search speed 40 fits once, and NCCL
    # doubles channels of 25 GB/s or more at half the speed
    assert [tuple(ch) for ch in channels] == ring * 2
    assert 'nchannels="2" speedintra="20"' in text and 'typeintra="NVL"' in text


def test_multi_ring_baseline_gives_one_channel_per_ring():
    topo = load_topology("dgx1")
    schedule = build_baseline("multi-ring", "allgather", topo)
    channels = read_nccl_graph(export_nccl_graph(schedule, topo), 8, multi_node=False)
    rings = [tuple(r[r.index(0):] + r[:r.index(0)]) for r in schedule.notes["rings"]]  # rotated to start at 0
    assert len(rings) >= 2
    assert Counter(map(tuple, channels)) == Counter(rings)  # the same cycle packed twice is two channels


def test_hex_device_ids_above_nine():
    topo = load_topology("ring-12")
    schedule = _ring_schedule("allgather", list(range(12)), "ring-12")
    text = export_nccl_graph(schedule, topo)
    assert '<gpu dev="0xa"/>' in text and '<gpu dev="0xb"/>' in text
    assert read_nccl_graph(text, 12, multi_node=False) == [list(range(12))]


def test_two_node_ring_channels_start_and_end_at_a_nic():
    topo = load_topology("dgx-a100", nodes=2)
    order = [0, 2, 1, 3, 4, 5, 7, 6]
    ring = order + [r + 8 for r in order]
    text = export_nccl_graph(_ring_schedule("allreduce", ring, topo.name), topo)
    assert read_nccl_graph(text, 8, multi_node=True) == [order]
    assert '<net dev="0x0"/>' in text and '<net dev="0x6"/>' in text  # enter at GPU 0's NIC, leave at GPU 6's
    assert 'crossnic="1"' in text and 'speedinter="24"' in text  # NCCL's inter-node speed within 25 GB/s


def test_ring_schedule_is_found_from_partial_chunks():
    # broadcast-like chunks that travel one hop each lie on the ring an allgather chunk defines
    schedule = _ring_schedule("allgather", [0, 1, 2, 3], "ring-4")
    assert find_rings(schedule) == [(0, 1, 2, 3)]


@pytest.mark.parametrize("baseline,collective,match", [
    ("all-pairs", "allreduce", "sends chunk"),
    ("double-binary-tree", "broadcast", "sends chunk"),
])
def test_non_ring_baselines_are_refused(baseline, collective, match):
    topo = load_topology("dgx-a100")
    schedule = build_baseline(baseline, collective, topo)
    with pytest.raises(BackendError, match=match):
        export_nccl_graph(schedule, topo)


def test_chunk_on_a_short_path_outside_any_ring_is_refused():
    coll = make_collective("allgather", 4)
    ts = [Transfer(c, (c + k) % 4, (c + k + 1) % 4, k) for c in range(3) for k in range(3)]
    ts += [Transfer(3, 3, 1, 0), Transfer(3, 1, 2, 1), Transfer(3, 2, 0, 2)]  # a different ring for chunk 3 ...
    ts += [Transfer(0, 2, 1, 3)]                                                 # ... and chunk 0 also goes 2->1
    with pytest.raises(BackendError, match="rank 1 receives chunk 0 from both 0 and 2"):
        find_rings(Schedule(coll, "fully-connected-4", tuple(ts), 4))
    ts = [Transfer(0, 0, 1, 0), Transfer(0, 1, 2, 1), Transfer(1, 1, 3, 0)]
    with pytest.raises(BackendError, match="its ring is unknown"):
        find_rings(Schedule(coll, "fully-connected-4", tuple(ts), 2))


def test_ring_over_a_missing_link_is_refused():
    topo = load_topology("dgx1")
    with pytest.raises(BackendError, match="uses 0->5, which topology dgx1 lacks"):
        export_nccl_graph(_ring_schedule("allgather", [0, 5, 4, 6, 7, 3, 2, 1], "dgx1"), topo)


def test_multi_node_ring_must_visit_each_node_once_in_the_same_order():
    topo = load_topology("dgx-a100", nodes=2)
    interleaved = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]
    with pytest.raises(BackendError, match="enters node 0 8 times"):
        export_nccl_graph(_ring_schedule("allgather", interleaved, topo.name), topo)
    different = [0, 1, 2, 3, 4, 6, 5, 7]   # node 1 is wired 4-6-5-7, so node 0's order has no 4->5 there
    with pytest.raises(BackendError, match="node 1 lacks node 0's link 0->1 .* all nodes must use the same local"):
        export_nccl_graph(_ring_schedule("allgather", different, "two-wirings"), _two_wirings())


def _two_wirings():
    """Two 4-GPU nodes wired differently (node 0 as ring 0-1-2-3, node 1 as ring 4-6-5-7), one NIC each."""
    from synth.model.topology import topology_from_dict
    ring = lambda order: [{"src": a, "dst": b, "bidirectional": True} for a, b in zip(order, order[1:] + order[:1])]
    return topology_from_dict({"name": "two-wirings", "ranks": 8, "gpus_per_node": 4,
                               "defaults": {"alpha_us": 0.7, "bw_GBps": 25.0},
                               "links": ring([0, 1, 2, 3]) + ring([4, 6, 5, 7]),
                               "switches": [{"name": "network", "alpha_us": 2.0,
                                             "ports": [{"ranks": [0, 1, 2, 3], "bw_GBps": 12.5},
                                                       {"ranks": [4, 5, 6, 7], "bw_GBps": 12.5}]}],
                               "nics": [{"ranks": [0, 1, 2, 3], "bw_GBps": 12.5}]})


def test_our_multi_node_ring_baseline_is_exportable():
    """The ring baseline visits node 1 in another order; on identical nodes node 0's order serves both."""
    topo = load_topology("dgx-a100", nodes=2)
    schedule = build_baseline("ring", "allgather", topo)
    (ring,) = schedule.notes["rings"]
    channels = read_nccl_graph(export_nccl_graph(schedule, topo), 8, multi_node=True)
    start = ring.index(0)
    assert channels[0] == [r % 8 for r in (ring[start:] + ring[:start])[:8]]


def _imported(dump_name: str, copies: int = 1):
    """A topology imported from one of the project's NCCL dump fixtures (tests/data/nccl/README.md)."""
    from backends.nccl.topo_import import import_nccl_dumps
    from synth.model.topology import topology_from_dict
    dump = Path(__file__).resolve().parent / "data" / "nccl" / dump_name
    return topology_from_dict(import_nccl_dumps([dump] * copies), str(dump))


def test_multi_node_channels_name_nccls_own_net_devices_from_the_dump():
    """Dual-port NICs of an imported dump: <net dev> is NCCL's device of the GPU's NIC, ports alternating."""
    topo = _imported("h100_dual_port_nic.xml", copies=2)
    order = list(range(8))
    text = export_nccl_graph(_ring_schedule("allgather", order + [r + 8 for r in order], topo.name), topo)
    channels = re.findall(r"<channel>\n((?:.*\n)*?)    </channel>", text)
    nets = [re.findall(r'<net dev="(0x[0-9a-f]+)"/>', ch) for ch in channels]
    assert len(nets) > 1
    # GPU 0's NIC holds NCCL's ports 14 and 15, GPU 7's ports 0 and 1 (the dump's numbering, not ours)
    assert nets[0] == ["0xe", "0x0"] and nets[1] == ["0xf", "0x1"]
    assert 'typeinter="PIX"' in text and "NET" not in text     # each NIC shares a PCIe switch with its GPU


def test_typeinter_follows_the_dumps_gpu_to_nic_paths(tmp_path):
    """The PCIe box's one NIC hangs off the CPU, away from the GPUs' switch: NCCL calls that path PHB."""
    single = tmp_path / "imported.json"
    single.write_text(json.dumps(_imported("pcie_4gpu.xml").to_dict()))
    topo = load_topology(str(single), nodes=2)
    assert topo.nics[0].path_type == "PHB"
    text = export_nccl_graph(_ring_schedule("allgather", [0, 1, 2, 3, 4, 5, 6, 7], topo.name), topo)
    assert 'typeinter="PHB"' in text and 'typeintra="PHB"' in text


def test_typeintra_follows_the_links_pcie_rings_are_not_nvl():
    topo = _imported("pcie_4gpu.xml")
    text = export_nccl_graph(_ring_schedule("allgather", [0, 1, 2, 3], topo.name), topo)
    assert 'typeintra="PHB"' in text        # 0->1 share a PCIe switch (PIX), the others cross the host bridge
    assert 'typeintra="NVL"' in export_nccl_graph(_ring_schedule("allgather", list(range(8)), "dgx-a100"),
                                                  load_topology("dgx-a100"))


def test_rank_count_must_match_the_topology():
    with pytest.raises(BackendError, match="pass the topology"):
        export_nccl_graph(_ring_schedule("allgather", [0, 1, 2, 3], "ring-4"), load_topology("dgx1"))


def test_cli_export_writes_the_file_and_refuses_non_rings(tmp_path):
    topo = load_topology("dgx1")
    ring = tmp_path / "ring.json"
    ring.write_text(build_baseline("ring", "allgather", topo).to_json())
    out = tmp_path / "graph.xml"
    result = CliRunner().invoke(main, ["export", "nccl-graph", str(ring), "--topology", "DGX1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = len(read_nccl_graph(out.read_text(), 8, multi_node=False))
    assert f"wrote {out}: {written} channel(s) at 20 GB/s each, typeintra NVL" in result.output
    result = CliRunner().invoke(main, ["export", "nccl-graph", str(ring), "--topology", "dgx1", "--typeinter", "NET"])
    assert result.exit_code == 2   # NET is not one of NCCL's path types
    pairs = tmp_path / "pairs.json"
    pairs.write_text(build_baseline("all-pairs", "allgather", load_topology("dgx-a100")).to_json())
    bad = tmp_path / "bad.xml"
    result = CliRunner().invoke(main, ["export", "nccl-graph", str(pairs), "--topology", "dgx-a100", "-o", str(bad)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot write an NCCL graph file") and not bad.exists()
