"""Rank symmetry (synth.model.symmetry): groups, closures and orbits of chunks, ranks, links and ports."""

import numpy as np
import pytest

from synth.model.collectives import make_collective
from synth.model.symmetry import (SymmetryGroup, free_symmetry_group, group_closure, is_automorphism, is_group,
                                  rank_orbit_reps, symmetry_for_collective)
from synth.model.topology import load_topology


@pytest.mark.parametrize("name, order", [("dgx1", 4), ("ring-4", 4), ("dgx-h100", 8)])
def test_free_symmetry_group_orders(name, order):
    topo = load_topology(name)
    group = free_symmetry_group(topo)
    assert len(group) == order and group[0] == tuple(range(topo.num_ranks))
    assert is_group(group) and all(is_automorphism(topo, p) for p in group)
    assert all(p[r] != r for p in group[1:] for r in range(topo.num_ranks))   # acts freely
    sym = symmetry_for_collective(topo, make_collective("allgather", topo.num_ranks, 2))
    assert sym.order == order


def test_dgx1_group_is_the_published_one():
    assert free_symmetry_group(load_topology("dgx1")) == [
        (0, 1, 2, 3, 4, 5, 6, 7), (2, 3, 0, 1, 6, 7, 4, 5), (4, 5, 6, 7, 0, 1, 2, 3), (6, 7, 4, 5, 2, 3, 0, 1)]


def test_group_closure_and_limit():
    assert group_closure([(1, 2, 3, 0)]) == [(0, 1, 2, 3), (1, 2, 3, 0), (2, 3, 0, 1), (3, 0, 1, 2)]
    assert group_closure([(1, 0, 2, 3), (1, 2, 3, 0)], limit=10) is None   # S4 has 24 elements


def test_orbits_on_dgx1():
    dgx1 = load_topology("dgx1")
    sym = symmetry_for_collective(dgx1, make_collective("allgather", 8, 1))
    assert sym.rank_orbit_reps() == (0, 1)
    assert sym.chunk_orbit_reps() == (0, 1)
    images = sym.link_images(dgx1)
    assert images.shape == (4, len(dgx1.links)) and np.array_equal(images[0], np.arange(len(dgx1.links)))
    reps = sym.link_orbit_reps(dgx1)
    assert all(reps[l] <= l for l in range(len(dgx1.links)))
    assert len(set(reps.tolist())) * 4 == len(dgx1.links)   # free on links too: every orbit has 4 links


def test_port_orbits_on_an_nvswitch():
    h100 = load_topology("dgx-h100")
    sym = symmetry_for_collective(h100, make_collective("allgather", 8, 1))
    reps = sym.port_orbit_reps(h100)
    assert set(reps.values()) == {(sw.name, 0, d) for sw in h100.switches for d in ("egress", "ingress")}


def test_trivial_group_and_rank_orbits_of_generators():
    sym = SymmetryGroup.trivial(4, 8)
    assert sym.order == 1 and sym.chunk_orbit_reps() == tuple(range(8)) and sym.rank_orbit_reps() == (0, 1, 2, 3)
    assert rank_orbit_reps(6, [(1, 0, 2, 3, 5, 4)]) == (0, 2, 3, 4)
    with pytest.raises(ValueError):
        sym.perms[0, 0] = 1   # read-only


def test_rooted_collectives_have_no_free_symmetry():
    dgx1 = load_topology("dgx1")
    assert symmetry_for_collective(dgx1, make_collective("broadcast", 8, 1, root=0)).order == 1


def test_undeclared_symmetry_is_found_exactly_and_acts_freely():
    """A topology that declares no symmetries (an imported dump, a user file) gets a free group from the exact
    automorphism search: as large as the built-in's declared one, and never mapping a rank to itself."""
    from synth.model.topology import topology_from_dict

    for name in ("dgx1", "dgx-h100", "ring-8", "ndv2-2node-tecc"):
        declared = load_topology(name)
        raw = declared.to_dict()
        raw.pop("symmetries", None)
        found = free_symmetry_group(topology_from_dict(raw, f"{name}-undeclared"))
        assert len(found) == len(free_symmetry_group(declared)), name
        assert is_group(found) and all(is_automorphism(declared, g) for g in found)
        assert all(g == tuple(range(len(g))) or all(g[r] != r for r in range(len(g))) for g in found)


def test_composed_nodes_declare_node_rotation_times_the_node_group():
    assert len(free_symmetry_group(load_topology("dgx-h100", 2))) == 16     # node swap x 8-fold NVSwitch rotation
    assert len(free_symmetry_group(load_topology("ndv2", 2))) == 8          # node swap x DGX-1's 4
