"""Ring baselines: one ring over the fastest Hamiltonian cycle, both directions, and rings packed onto the
link lanes (NCCL's ring algorithm, with its chains for rooted collectives)."""

from __future__ import annotations

import networkx as nx

from synth.model.topology import Topology
from synth.synthesis.baselines.plans import Edge, Routes, not_applicable

_SEARCH_BUDGET = 50_000


# ----------------------------------------------------------------------------------------------- ring search

def link_resources(link) -> list[tuple]:
    """What one ring consumes when it uses a link: one lane, and one unit of each switch port it crosses."""
    return [("link", link.src, link.dst)] + [("port", *port) for port in link.ports]


def ring_links(topology: Topology) -> list:
    """The links a ring may take: every link of one node; across nodes, the links inside each node and from
    each node to the next (a multi-node ring crosses each boundary once, in node order). Looked up pair by pair:
    a composed cluster makes its links on demand, and 256 GPUs have 65k of them, which a ring never uses."""
    if topology.num_nodes == 1:
        return list(topology.links)
    links = []
    for k in range(topology.num_nodes):
        inside = _node_members(topology, k)
        ahead = inside + _node_members(topology, (k + 1) % topology.num_nodes)
        links += [l for l in (topology.link(u, v) for u in inside for v in ahead if u != v) if l is not None]
    return links


def _initial_units(links: list) -> dict:
    units = {}
    for link in links:
        for r in link_resources(link):
            units[r] = link.lanes if r[0] == "link" else 1
    return units


def _residual_caps(links: list, units: dict) -> dict[Edge, float]:
    """Bandwidth (GB/s) still free on each directed rank pair of ``links``, in whole lanes."""
    caps = {}
    for link in links:
        free = min(units[r] for r in link_resources(link))
        if free > 0:
            caps[(link.src, link.dst)] = free * link.bw_GBps
    return caps


def _hamiltonian(nodes: list[int], caps: dict[Edge, float], start: int, end: int,
                 prefer: dict[Edge, float] | None = None) -> list[int] | None:
    """A path through all ``nodes`` from ``start`` to ``end`` (``start == end``: a cycle back to start) that
    prefers high-bandwidth edges: the highest capacity threshold that admits one wins, ties go to edges
    ranked higher by ``prefer``. Depth-first search with a budget; None when none is found."""
    prefer = prefer or {}
    if len(nodes) == 1:
        return [start] if start == end else None
    node_set = set(nodes)
    for threshold in sorted({c for (u, v), c in caps.items() if u in node_set and v in node_set}, reverse=True):
        succ = {u: [] for u in nodes}
        for (u, v), c in caps.items():
            if c >= threshold and u in node_set and v in node_set:
                succ[u].append(v)
        g = nx.DiGraph((u, v) for u in succ for v in succ[u])
        g.add_nodes_from(nodes)
        if start == end and not nx.is_strongly_connected(g):
            continue
        for u in succ:
            succ[u].sort(key=lambda v, u=u: (-caps[(u, v)], -prefer.get((u, v), 0.0), len(succ[v]), v))
        found = _dfs_path(nodes, succ, start, end)
        if found:
            return found
    return None


def _dfs_path(nodes: list[int], succ: dict, start: int, end: int) -> list[int] | None:
    cycle = start == end
    total = len(nodes)
    path, visited = [start], {start}

    def options(u):
        return (v for v in succ[u] if v not in visited and (cycle or v != end or len(path) == total - 1))

    stack = [options(start)]
    budget = _SEARCH_BUDGET
    while stack:
        if len(path) == total:
            last = path[-1]
            if (cycle and start in succ[last]) or (not cycle and last == end):
                return path
            stack.pop()
            visited.discard(path.pop())
            continue
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            visited.discard(path.pop())
            continue
        budget -= 1
        if budget < 0:
            return None
        path.append(nxt)
        visited.add(nxt)
        stack.append(options(nxt))
    return None


def _node_members(topology: Topology, k: int) -> list[int]:
    g = topology.gpus_per_node
    return list(range(k * g, (k + 1) * g))


def _multinode_ring(topology: Topology, caps: dict[Edge, float], prefer: dict[Edge, float]) -> list[int] | None:
    """A ring that visits nodes 0, 1, ..., K-1 in turn: a Hamiltonian path inside each node from the rank a
    link from the previous node enters to the rank whose link leaves for the next node."""
    num_nodes = topology.num_nodes
    cross = []
    for k in range(num_nodes):
        nxt = (k + 1) % num_nodes
        links = [(u, v) for (u, v) in caps if topology.node_of(u) == k and topology.node_of(v) == nxt]
        gpn = topology.gpus_per_node
        links.sort(key=lambda e: (-caps[e], (e[0] - e[1]) % gpn != 0, e))
        if not links:
            return None
        cross.append(links[:16])
    paths: dict = {}

    def inner(k, entry, exit_):
        if (entry == exit_) != (topology.gpus_per_node == 1):
            return None
        if (entry, exit_) not in paths:
            paths[(entry, exit_)] = _hamiltonian(_node_members(topology, k), caps, entry, exit_, prefer)
        return paths[(entry, exit_)]

    budget = [_SEARCH_BUDGET // 100]

    def assemble(k, entry, closing):
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if k == num_nodes - 1:
            p = inner(k, entry, closing[0])
            return [p] if p else None
        for u, v in cross[k]:
            p = inner(k, entry, u)
            if p:
                rest = assemble(k + 1, v, closing)
                if rest:
                    return [p] + rest
        return None

    for closing in cross[-1]:
        parts = assemble(0, closing[1], closing)
        if parts:
            return [r for part in parts for r in part]
    return None


def find_ring(topology: Topology, caps: dict[Edge, float] | None = None) -> list[int] | None:
    """A Hamiltonian ring (rank order; the last rank links back to the first) preferring high-bandwidth links.

    ``caps`` restricts the search to the given free bandwidth per rank pair (GB/s; default: every link);
    among equally free links the ones with more bandwidth in the topology win. Multi-node topologies get a
    ring that crosses each node boundary once. None when the search finds none.

    >>> from synth.model.topology import load_topology
    >>> find_ring(load_topology("dgx1"))      # the NVLink pairs with two lanes
    [0, 1, 3, 2, 6, 7, 5, 4]
    """
    links = ring_links(topology)
    full = _residual_caps(links, _initial_units(links))
    caps = full if caps is None else caps
    if topology.num_nodes > 1:
        return _multinode_ring(topology, caps, full)
    return _hamiltonian(list(range(topology.num_ranks)), caps, 0, 0, full)


def pack_rings(topology: Topology, max_rings: int = 8) -> list[list[int]]:
    """Greedily pack rings that each take one lane of every link (and one unit of every switch port) they use.

    On DGX-1 this finds six rings, one per NVLink lane of each GPU.
    """
    links = ring_links(topology)
    units = _initial_units(links)
    rings = []
    while len(rings) < max_rings:
        ring = find_ring(topology, _residual_caps(links, units))
        if ring is None:
            break
        for u, v in _ring_edges(ring):
            for r in link_resources(topology.link(u, v)):
                units[r] -= 1
        rings.append(ring)
    return rings


def _ring_edges(ring: list[int]) -> list[Edge]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def chain_from(cycle: list[int], start: int) -> list[Edge]:
    """Edges along ``cycle`` from ``start`` through every other member."""
    p, n = cycle.index(start), len(cycle)
    return [(cycle[(p + i) % n], cycle[(p + i + 1) % n]) for i in range(n - 1)]


def chain_to(cycle: list[int], end: int) -> list[Edge]:
    """Edges along ``cycle`` that start after ``end`` and finish at ``end``."""
    p, n = cycle.index(end), len(cycle)
    return [(cycle[(p + 1 + i) % n], cycle[(p + 2 + i) % n]) for i in range(n - 1)]


class RingRoutes(Routes):
    """Chunks travel around rings; chunk ``index`` picks ring ``index % len(rings)``."""

    def __init__(self, rings: list[list[int]], shortest_paths: bool = False):
        self.rings = rings
        self.ways = len(rings)
        self.shortest_paths = shortest_paths
        self._positions = [{r: i for i, r in enumerate(ring)} for ring in rings]

    def _ring(self, index):
        return self.rings[index % self.ways]

    def spread(self, origin, index):
        return chain_from(self._ring(index), origin)

    def collect(self, root, index):
        return chain_to(self._ring(index), root)

    def _ahead(self, src, dst, index) -> dict[int, int]:
        """Hops from ``src`` to ``dst`` on each ring the chunk may take (every ring with shortest paths)."""
        ways = range(self.ways) if self.shortest_paths else (index % self.ways,)
        return {w: (self._positions[w][dst] - self._positions[w][src]) % len(self.rings[w]) for w in ways}

    def path(self, src, dst, index):
        ahead = self._ahead(src, dst, index)
        hops = min(ahead.values())
        ties = [w for w, a in ahead.items() if a == hops]
        way = ties[index % len(ties)]
        ring, p = self.rings[way], self._positions[way][src]
        n = len(ring)
        return [(ring[(p + i) % n], ring[(p + i + 1) % n]) for i in range(hops)]

    def hops(self, src, dst, index):
        return min(self._ahead(src, dst, index).values())

    def describe(self):
        return {"rings": [list(r) for r in self.rings]}


def ring_routes(topology: Topology, collective: str, root) -> Routes:
    ring = find_ring(topology)
    if ring is None:
        raise not_applicable("ring", f"no Hamiltonian ring found in topology {topology.name}")
    return RingRoutes([ring])


def bidir_ring_routes(topology: Topology, collective: str, root) -> Routes:
    ring = find_ring(topology)
    if ring is None:
        raise not_applicable("bidir-ring", f"no Hamiltonian ring found in topology {topology.name}")
    back = ring[::-1]
    missing = [e for e in _ring_edges(back) if topology.link(*e) is None]
    if missing:
        raise not_applicable("bidir-ring", f"the ring {ring} cannot run backwards: topology {topology.name} "
                              f"has no link {missing[0][0]}->{missing[0][1]}")
    return RingRoutes([ring, back], shortest_paths=True)


def multi_ring_routes(topology: Topology, collective: str, root) -> Routes:
    rings = pack_rings(topology)
    if len(rings) < 2:
        raise not_applicable("multi-ring", f"only {len(rings)} ring(s) fit in topology {topology.name} "
                              "(each ring takes a lane of every link and a unit of every switch port it uses); "
                              "use 'ring'")
    return RingRoutes(rings, shortest_paths=True)


def node_cycles(topology: Topology, name: str) -> list[list[int]]:
    """A ring inside each node over intra-node links."""
    caps = {}
    for k in range(topology.num_nodes):     # pair by pair: a cluster's fabric links are made on demand
        members = _node_members(topology, k)
        caps.update(((u, v), l.capacity_GBps) for u in members for v in members
                    if u != v and (l := topology.link(u, v)) is not None)
    cycles = []
    for k in range(topology.num_nodes):
        members = _node_members(topology, k)
        cycle = _hamiltonian(members, caps, members[0], members[0]) if len(members) > 1 else members
        if cycle is None:
            raise not_applicable(name, f"no ring inside node {k} of topology {topology.name}")
        cycles.append(cycle)
    return cycles
