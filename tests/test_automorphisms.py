"""Symmetry detection for any topology (synth/model/automorphisms.py)."""

import math
from pathlib import Path

import pytest

from backends.nccl.topo_import import import_nccl_dumps
from synth.model.automorphisms import rank_automorphisms
from synth.model.topology import load_topology, topology_from_dict

DUAL = Path(__file__).resolve().parent / "data" / "nccl" / "h100_dual_port_nic.xml"


def _preserves(topo, perm) -> bool:
    """perm maps every link onto a link of equal cost, every NIC's ranks onto a NIC's, and nodes onto nodes."""
    for l in topo.links:
        image = topo.link(perm[l.src], perm[l.dst])
        if image is None or (image.lanes, image.bw_GBps, image.alpha_us) != (l.lanes, l.bw_GBps, l.alpha_us):
            return False
    gpn = topo.gpus_per_node
    nodes = {frozenset(range(k * gpn, (k + 1) * gpn)) for k in range(topo.num_nodes)}
    if {frozenset(perm[r] for r in node) for node in nodes} != nodes:
        return False
    nic_sets = {(frozenset(k * gpn + r for r in nic.ranks), nic.bw_GBps) for nic in topo.nics
                for k in range(topo.num_nodes)}
    return {(frozenset(perm[r] for r in ranks), bw) for ranks, bw in nic_sets} == nic_sets


@pytest.mark.parametrize("name,nodes,order", [
    ("ring-4", 1, 8),                                  # dihedral group of the square
    ("ring-12", 1, 24),
    ("dgx1", 1, 4),                                    # DESIGN section 6: the cube-mesh's 4 automorphisms
    ("dgx-h100", 1, math.factorial(8)),                # an NVSwitch with one NIC per GPU
    ("dgx2", 1, 2 ** 8 * math.factorial(8)),           # NICs shared by GPU pairs: pairs permute, and swap within
    ("dgx-a100", 2, math.factorial(8) ** 2 * 2),       # each node's NVSwitch, and the two nodes
    ("ndv2-2node-tecc", 1, 2),                         # only the node swap keeps the one inter-node link pair
])
def test_known_machines_have_their_group_orders(name, nodes, order):
    topo = load_topology(name, nodes)
    result = rank_automorphisms(topo)
    assert result.complete and result.order == order, result.note
    assert all(_preserves(topo, g) for g in result.generators)
    assert len(result.generators) < topo.num_ranks * 2     # generators, not the whole group


def test_an_imported_dgx_h100_like_dump_has_the_builtins_symmetry():
    """Imported topologies declare no symmetries; the search finds the same group as the built-in's links."""
    imported = topology_from_dict(import_nccl_dumps([DUAL]), str(DUAL))
    assert not imported.symmetries
    assert rank_automorphisms(imported).order == rank_automorphisms(load_topology("dgx-h100")).order
    two = topology_from_dict(import_nccl_dumps([DUAL, DUAL]), str(DUAL))
    result = rank_automorphisms(two)
    assert result.complete and result.order == math.factorial(8) ** 2 * 2
    assert all(_preserves(two, g) for g in result.generators)


def test_an_asymmetric_topology_has_only_the_identity():
    raw = {"name": "lopsided", "ranks": 3, "defaults": {"alpha_us": 1.0},
           "links": [{"src": 0, "dst": 1, "bw_GBps": 10, "bidirectional": True},
                     {"src": 1, "dst": 2, "bw_GBps": 20, "bidirectional": True}]}
    result = rank_automorphisms(topology_from_dict(raw))
    assert (result.generators, result.order, result.complete) == ((), 1, True)


def test_the_search_is_bounded_and_says_so():
    result = rank_automorphisms(load_topology("dgx-a100", 2), max_refinements=20)
    assert not result.complete
    assert result.note.startswith("symmetry search stopped after 21 refinements (limit 20")
    assert "declare the rest as symmetries in the topology file" in result.note
    topo = load_topology("dgx-a100", 2)
    assert all(_preserves(topo, g) for g in result.generators)


def test_an_imported_dgx_h100_like_dump_solves_with_the_builtins_free_group():
    from synth.model.symmetry import free_symmetry_group

    imported = topology_from_dict(import_nccl_dumps([DUAL]), str(DUAL))
    assert len(free_symmetry_group(imported)) == len(free_symmetry_group(load_topology("dgx-h100"))) == 8
