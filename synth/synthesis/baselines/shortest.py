"""The shortest-path baseline: every chunk goes from its origin to each rank that needs it along the alpha-shortest
path (an out-tree of shortest paths; for reductions the in-tree of shortest paths to the owner), so each rank hears
from every other after the alpha-diameter at most, where a ring or a tree crosses it several times.

At small sizes a collective costs its alphas: on two NDv2 nodes (every GPU reaches every GPU of the other node
through the node's NIC, 1.3 us; NVLink 0.7 us, two hops between some GPUs of a node) an Allgather of 1 KB takes
1.3 us plus the NIC's 64 small messages, where composing node phases adds an NVLink hop (ndv2 x2: 2.7 us before).
Where every pair is linked it is the all-pairs routing. Paths of equal alpha prefer fewer hops.

>>> from synth.model.topology import load_topology
>>> routes = shortest_path_routes(load_topology("dgx1"), "allgather", None)
>>> sorted(v for _, v in routes.spread(0, 0)) == list(range(1, 8)), max(len(routes.path(0, d, 0)) for d in range(1, 8))
(True, 2)
"""

from __future__ import annotations

import numpy as np

from synth.model.topology import Topology
from synth.synthesis.baselines.plans import Edge, Routes, not_applicable

SHORTEST_PATH = "shortest-path"
# Latency added per hop when comparing paths (us): among paths of equal alpha the one of fewer hops wins, and no
# real difference of alphas is this small.
HOP_TIE_US = 1e-6
# Difference of path lengths (us) that is rounding: paths this close are equally short.
PATH_TOLERANCE_US = 1e-9
# Ranks up to which the routing is built (it serves small sizes; a search per rank on a cluster's million links
# would take minutes, and the budget of transfers would refuse its schedules anyway).
MAX_RANKS = 64


class ShortestPathRoutes(Routes):
    """Out-trees (in-trees) of alpha-shortest paths from (to) every rank, from one search per direction."""

    def __init__(self, topology: Topology):
        from scipy.sparse.csgraph import dijkstra

        weights = topology.link_arrays().alpha_us + HOP_TIE_US
        n = topology.num_ranks
        # row r: distance from r / predecessor on the path from r (forward) or to r (searched on the reversed graph)
        self._dist, self._pred = dijkstra(topology.sparse_graph(weights), directed=True, return_predecessors=True)
        self._dist_to, self._next = dijkstra(topology.sparse_graph(weights, reverse=True), directed=True,
                                             return_predecessors=True)
        if np.isinf(self._dist).any():
            row, col = (int(x[0]) for x in np.nonzero(np.isinf(self._dist)))
            raise not_applicable(SHORTEST_PATH, f"rank {col} cannot be reached from rank {row}")
        self.n = n
        self._out: list[list[tuple[int, float]]] = [[] for _ in range(n)]   # per rank: (peer, alpha us)
        for link in topology.links:
            self._out[link.src].append((link.dst, link.alpha_us))
        self._paths: dict[tuple[int, int], list[Edge]] | None = None

    @property
    def all_direct(self) -> bool:
        """Whether every rank's shortest path to every other is one link (the all-pairs routing)."""
        return bool((self._pred == np.arange(self.n)[:, None])[~np.eye(self.n, dtype=bool)].all())

    def spread(self, origin: int, index: int) -> list[Edge]:
        # farthest first: among transfers ready together, the long paths start first
        ranks = sorted((v for v in range(self.n) if v != origin), key=lambda v: (-self._dist[origin, v], v))
        return [(int(self._pred[origin, v]), v) for v in ranks]

    def collect(self, root: int, index: int) -> list[Edge]:
        ranks = sorted((v for v in range(self.n) if v != root), key=lambda v: (-self._dist_to[root, v], v))
        return [(v, int(self._next[root, v])) for v in ranks]

    def path(self, src: int, dst: int, index: int) -> list[Edge]:
        if self._paths is None:
            self._paths = self._balanced_paths()
        return self._paths[(src, dst)]

    def _balanced_paths(self) -> dict[tuple[int, int], list[Edge]]:
        """A shortest path for every pair, farthest pairs first, each hop on the least loaded link among those that
        stay on a shortest path (ties: the lower rank). One search tree would send every pair over the same relay
        where several are as short: on TE-CCL's two DGX-2 nodes (eight links each way between them) one link
        carried 88 of an Alltoall's 256 crossing blocks, 32 when balanced."""
        load: dict[Edge, int] = {}
        paths = {}
        pairs = sorted(((s, d) for s in range(self.n) for d in range(self.n) if s != d),
                       key=lambda p: (-self._dist[p], p))
        for src, dst in pairs:
            edges, u = [], src
            while u != dst:
                w = min((w for w, alpha in self._out[u]
                         if abs(alpha + HOP_TIE_US + self._dist[w, dst] - self._dist[u, dst]) <= PATH_TOLERANCE_US),
                        key=lambda w: (load.get((u, w), 0), w))
                edges.append((u, w))
                load[(u, w)] = load.get((u, w), 0) + 1
                u = w
            paths[(src, dst)] = edges
        return paths

    def priority(self, src: int, dst: int, edges: list[Edge]) -> float:
        return -float(self._dist[src, dst])


def shortest_path_routes(topology: Topology, collective: str, root) -> Routes:
    """The shortest-path routing (module docstring) or an InputError saying why it does not apply."""
    if topology.num_ranks > MAX_RANKS:
        raise not_applicable(SHORTEST_PATH, f"it serves small sizes on machines of up to {MAX_RANKS} ranks; "
                             f"{topology.name} has {topology.num_ranks}")
    routes = None if _every_pair_direct(topology) else ShortestPathRoutes(topology)
    if routes is None or routes.all_direct:
        raise not_applicable(SHORTEST_PATH, f"every shortest path on {topology.name} is a direct link: it is the "
                             "all-pairs baseline")
    return routes


def _every_pair_direct(topology: Topology) -> bool:
    """Whether every pair of ranks is linked and no path is shorter than the link (with :data:`HOP_TIE_US` per
    hop, a longer path of equal alpha is longer): :attr:`ShortestPathRoutes.all_direct` told from distances alone
    (:meth:`~synth.model.topology.Topology.distances`), without the predecessor search that imports scipy on an
    NVSwitch machine, where it always holds."""
    n = topology.num_ranks
    if len(topology.links) < n * (n - 1):
        return False
    weights = topology.link_arrays().alpha_us + HOP_TIE_US
    dist = topology.distances(range(n), weights)
    for link, weight in zip(topology.links, weights.tolist()):
        if weight > dist[link.src, link.dst] + PATH_TOLERANCE_US:
            return False
    return len({(l.src, l.dst) for l in topology.links}) == n * (n - 1)
