"""The hierarchical baseline: intra-node ring, inter-node rails, intra-node ring."""

from __future__ import annotations

from synth.model.topology import Topology
from synth.synthesis.baselines.plans import Edge, Routes, not_applicable
from synth.synthesis.baselines.rings import chain_from, chain_to, link_resources, node_cycles


class HierarchicalRoutes(Routes):
    """Intra-node ring, then rails between nodes, then intra-node again.

    A chunk first goes around its node's ring; the rank where its rail leaves the node sends it to the next
    node, whose entry rank sends it around that node's ring, and so on through the nodes. Rails are disjoint
    inter-node channels (a direct link, or a pair of switch ports), used round robin by origin and index.
    """

    def __init__(self, topology: Topology, cycles: list[list[int]], rails: list[list[Edge]]):
        self.topology = topology
        self.cycles = cycles
        self.rails = rails  # rails[j][k]: link from node k to node k+1 on rail j

    def _rail(self, origin, index):
        return self.rails[(origin + index) % len(self.rails)]

    def spread(self, origin, index):
        rail, num_nodes = self._rail(origin, index), self.topology.num_nodes
        k0 = self.topology.node_of(origin)
        edges = chain_from(self.cycles[k0], origin)
        for v in range(num_nodes - 1):
            x, e = rail[(k0 + v) % num_nodes]
            edges.append((x, e))
            edges += chain_from(self.cycles[(k0 + v + 1) % num_nodes], e)
        return edges

    def collect(self, root, index):
        rail, num_nodes = self._rail(root, index), self.topology.num_nodes
        k0 = self.topology.node_of(root)
        edges = []
        for v in range(1, num_nodes):
            k = (k0 + v) % num_nodes
            x, e = rail[k]
            edges += chain_to(self.cycles[k], x) + [(x, e)]
        return edges + chain_to(self.cycles[k0], root)

    def describe(self):
        return {"node_rings": self.cycles, "rails": [[list(e) for e in rail] for rail in self.rails]}


def hierarchical_routes(topology: Topology, collective: str, root) -> Routes:
    name = "hierarchical"
    if topology.num_nodes < 2:
        raise not_applicable(name, f"needs several nodes; topology {topology.name} has one")
    cycles = node_cycles(topology, name)
    per_pair = []
    for k in range(topology.num_nodes):
        nxt = (k + 1) % topology.num_nodes
        gpn = topology.gpus_per_node
        # pair by pair: a cluster's fabric links are made on demand, and only these 64 of its 65k matter here
        links = [l for l in (topology.link(u, v) for u in range(k * gpn, (k + 1) * gpn)
                             for v in range(nxt * gpn, (nxt + 1) * gpn)) if l is not None]
        links.sort(key=lambda l: (-l.capacity_GBps, (l.src - l.dst) % gpn != 0, l.src, l.dst))
        chosen, used = [], set()
        for link in links:
            res = set(link_resources(link)) | {("src", link.src), ("dst", link.dst)}
            if not res & used:
                chosen.append((link.src, link.dst))
                used |= res
        if not chosen:
            raise not_applicable(name, f"no link from node {k} to node {nxt} in topology {topology.name}")
        per_pair.append(chosen)
    num_rails = min(len(c) for c in per_pair)
    rails = [[per_pair[k][j] for k in range(topology.num_nodes)] for j in range(num_rails)]
    return HierarchicalRoutes(topology, cycles, rails)
