"""Topology.distances: the Python search small machines use gives scipy's distances, and connectivity errors
still name the ranks."""

import numpy as np
import pytest

import synth.model.topology as topology_module
from synth.errors import InputError
from synth.model.topology import check_connected, load_topology, topology_from_dict


@pytest.mark.parametrize("name, nodes", [("dgx1", 1), ("ndv2", 2), ("dgx2", 1), ("ring-8", 1)])
@pytest.mark.parametrize("reverse", [False, True])
def test_python_search_equals_scipy(name, nodes, reverse, monkeypatch):
    topo = load_topology(name, nodes)
    for weights in (None, topo.link_arrays().alpha_us):
        python = topo.distances(range(topo.num_ranks), weights, reverse)
        monkeypatch.setattr(topology_module, "PYTHON_SEARCH_MAX_WORK", 0)
        scipy = topo.distances(range(topo.num_ranks), weights, reverse)
        monkeypatch.undo()
        np.testing.assert_allclose(python, scipy, rtol=0, atol=1e-12)


def test_a_one_way_link_is_still_reported_with_its_ranks():
    topo = topology_from_dict({"format": "synth-topology/1", "name": "one-way", "ranks": 3,
                               "links": [{"src": 0, "dst": 1, "bw_GBps": 10, "alpha_us": 1},
                                         {"src": 1, "dst": 0, "bw_GBps": 10, "alpha_us": 1},
                                         {"src": 1, "dst": 2, "bw_GBps": 10, "alpha_us": 1}]})
    with pytest.raises(InputError, match=r"ranks \[2\] cannot reach or be reached from the others"):
        check_connected(topo)
