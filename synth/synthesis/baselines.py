"""NCCL-style baseline algorithms as :class:`~synth.schedule.ir.Schedule` objects.

Each baseline is a *routing*: for every chunk it says over which links the chunk spreads from its origin to
everyone (an out-tree), how partial sums flow into a root (an in-tree, for combining collectives), or which
path a chunk takes to one peer. The collective then follows from the tables in :mod:`synth.model.collectives`:

========================  ==================================================================
Allgather / Broadcast     spread each chunk from its origin (the root for Broadcast)
ReduceScatter / Reduce    collect each chunk into its owner (the root for Reduce), op=reduce
Allreduce                 collect each chunk into a hub, then spread it from there (RS + AG)
Alltoall / Gather/Scatter one path per chunk from its source to its destination
========================  ==================================================================

Steps give the issue order. They are found by replaying the routing with the alpha-beta cost model at a
nominal size (``order_bytes``): every transfer starts as soon as its data is there and its link is free, links
serve transfers first come first served (ties broken by a priority, e.g. round k of a star), and ``step`` is
the rank of the transfer's (ready time, priority). So a transfer's step is always larger than the steps that
deliver its data, and :func:`synth.schedule.replay.verify` at that size reproduces exactly the time of the replay.

``chunks_per_rank`` is per ring or tree: a baseline that spreads data over ``w`` rings or trees builds the
collective with ``w * chunks_per_rank`` chunks per rank. More chunks pipeline better and cost more alphas.

>>> from synth.model.topology import load_topology
>>> from synth.schedule.replay import verify
>>> topo = load_topology("ring-4")
>>> s = build_baseline("ring", "allgather", topo)
>>> round(verify(s, topo, 4_000_000).time_us, 1)   # 3 * (0.7 us + 1 MB / 25 GB/s)
122.1
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import networkx as nx

from synth.model.collectives import Collective, make_collective, normalize_name
from synth.schedule.costmodel import LinkClock
from synth.errors import InputError, SynthError
from synth.schedule.replay import ReplayReport, verify
from synth.schedule.ir import COPY, REDUCE, Schedule, Transfer
from synth.model.topology import Topology

DEFAULT_ORDER_BYTES = 1 << 20
_SEARCH_BUDGET = 50_000
Edge = tuple[int, int]


# ----------------------------------------------------------------------------------------------- plans

@dataclass(frozen=True)
class ChunkPlan:
    """How one chunk moves: ``reduce_edges`` (an in-tree, partial sums flow to its root) then ``copy_edges``
    (an out-tree or a path, copies flow from its root)."""

    chunk: int
    reduce_edges: tuple[Edge, ...] = ()
    copy_edges: tuple[Edge, ...] = ()
    priority: int = 0


class Routes:
    """A baseline's routing on one topology; subclasses override what they support.

    ``ways`` is how many rings or trees the data is split over; chunk ``index`` (its position among the
    chunks of one origin) picks one of them.
    """

    ways = 1

    def spread(self, origin: int, index: int) -> list[Edge]:
        """Out-tree edges that bring a chunk from ``origin`` to every other rank."""
        raise NotImplementedError

    def collect(self, root: int, index: int) -> list[Edge]:
        """In-tree edges that bring every rank's contribution to ``root``."""
        raise NotImplementedError

    def path(self, src: int, dst: int, index: int) -> list[Edge]:
        """Edges of a path from ``src`` to ``dst``."""
        raise NotImplementedError

    def priority(self, src: int, dst: int, edges: list[Edge]) -> int:
        """Issue priority of a point-to-point chunk among transfers ready at the same time (lower first):
        by default the longest path goes first."""
        return -len(edges)

    def hub(self, owner: int, index: int) -> int:
        """Rank where an Allreduce chunk owned by ``owner`` is fully reduced before it is spread."""
        return owner

    def explicit(self, collective: Collective) -> list[Transfer] | None:
        """A schedule with fixed steps, for algorithms whose steps are not an issue order (None: use routes)."""
        return None

    def describe(self) -> dict:
        """JSON-ready description of the structure (rings, trees, rails) for the schedule's notes."""
        return {}


def plan_collective(collective: Collective, routes: Routes) -> list[ChunkPlan]:
    """Chunk plans of a collective from a routing (reads the collective's tables, see the module docstring)."""
    plans = []
    name = collective.name
    per_origin = collective.chunks_per_rank
    n = collective.num_ranks
    for c in collective.chunks:
        index = c.id % per_origin
        rounds = index * n  # a chunk's edges come after every edge of the origin's earlier chunks
        if name in ("allgather", "broadcast"):
            (origin,) = c.sources
            plans.append(ChunkPlan(c.id, (), tuple(routes.spread(origin, index)), rounds))
        elif name in ("reducescatter", "reduce"):
            (root,) = c.dest_ranks
            plans.append(ChunkPlan(c.id, tuple(routes.collect(root, index)), (), rounds))
        elif name == "allreduce":
            hub = routes.hub(c.id // per_origin, index)
            plans.append(ChunkPlan(c.id, tuple(routes.collect(hub, index)), tuple(routes.spread(hub, index)),
                                   rounds))
        else:  # alltoall, gather, scatter: one source, one destination
            (src,) = c.sources
            (dst,) = c.dest_ranks
            edges = routes.path(src, dst, index) if src != dst else []
            plans.append(ChunkPlan(c.id, (), tuple(edges), routes.priority(src, dst, edges)))
    return plans


def order_plans(plans: list[ChunkPlan], topology: Topology, chunk_bytes: float) -> list[Transfer]:
    """Turn chunk plans into transfers whose steps follow a first-come-first-served alpha-beta replay.

    A reduce edge ``u -> v`` waits for every reduce edge into ``u``; a copy edge out of ``u`` waits for the
    copy into ``u`` or, at the out-tree's root, for every reduce edge into it. Transfers ready at the same
    time go in priority order (the plan's priority plus the edge's position in its list, so a star's k-th
    edges form round k), then by chunk.
    """
    nodes, prereqs = _transfer_graph(plans)
    dependents = [[] for _ in nodes]
    pending = [len(p) for p in prereqs]
    for i, pre in enumerate(prereqs):
        for j in pre:
            dependents[j].append(i)
    ready = [0.0] * len(nodes)

    def entry(i):
        chunk, src, dst, _, prio = nodes[i]
        return (ready[i], prio, chunk, src, dst, i)

    heap = [entry(i) for i in range(len(nodes)) if not pending[i]]
    heapq.heapify(heap)
    clock = LinkClock(topology)
    done = 0
    while heap:
        start, _, _, src, dst, i = heapq.heappop(heap)
        arrival = clock.reserve(topology.link_index[(src, dst)], start, chunk_bytes).arrival_us
        done += 1
        for j in dependents[i]:
            ready[j] = max(ready[j], arrival)
            pending[j] -= 1
            if not pending[j]:
                heapq.heappush(heap, entry(j))
    if done != len(nodes):
        raise SynthError("internal error: a baseline's routing has a dependency cycle")
    keys = [(ready[i], nodes[i][4]) for i in range(len(nodes))]
    step_of = {k: s for s, k in enumerate(sorted(set(keys)))}
    return [Transfer(chunk, src, dst, step_of[keys[i]], op) for i, (chunk, src, dst, op, _) in enumerate(nodes)]


def _transfer_graph(plans: list[ChunkPlan]):
    """``(chunk, src, dst, op, priority)`` per transfer and the indices of the transfers each one waits for."""
    nodes, prereqs = [], []
    for p in plans:
        base = len(nodes)
        reduce_in: dict[int, list[int]] = {}
        for k, (_, v) in enumerate(p.reduce_edges):
            reduce_in.setdefault(v, []).append(base + k)
        for k, (u, v) in enumerate(p.reduce_edges):
            nodes.append((p.chunk, u, v, REDUCE, p.priority + k))
            prereqs.append(list(reduce_in.get(u, [])))
        base = len(nodes)
        copy_in: dict[int, int] = {}
        for k, (_, v) in enumerate(p.copy_edges):
            if v in copy_in:
                raise SynthError(f"internal error: chunk {p.chunk} is copied into rank {v} twice")
            copy_in[v] = base + k
        for k, (u, v) in enumerate(p.copy_edges):
            nodes.append((p.chunk, u, v, COPY, p.priority + k))
            prereqs.append([copy_in[u]] if u in copy_in else list(reduce_in.get(u, [])))
    return nodes, prereqs


def _check_links(plans: list[ChunkPlan], topology: Topology, name: str) -> None:
    for p in plans:
        for u, v in p.reduce_edges + p.copy_edges:
            if topology.link(u, v) is None:
                raise InputError(f"baseline {name!r}", "", f"needs a link {u}->{v}, which topology "
                                 f"{topology.name} does not have")


# ----------------------------------------------------------------------------------------------- ring search

def _resources(link) -> list[tuple]:
    """What one ring consumes when it uses a link: one lane, and one unit of each switch port it crosses."""
    res = [("link", link.src, link.dst)]
    if link.switch is not None:
        res += [("port", link.switch, link.egress_port, "egress"), ("port", link.switch, link.ingress_port,
                                                                      "ingress")]
    return res


def _initial_units(topology: Topology) -> dict:
    units = {}
    for link in topology.links:
        for r in _resources(link):
            units[r] = link.lanes if r[0] == "link" else 1
    return units


def _residual_caps(topology: Topology, units: dict) -> dict[Edge, float]:
    """Bandwidth (GB/s) still free on each directed rank pair, in whole lanes."""
    caps = {}
    for link in topology.links:
        free = min(units[r] for r in _resources(link))
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
    full = _residual_caps(topology, _initial_units(topology))
    caps = full if caps is None else caps
    if topology.num_nodes > 1:
        return _multinode_ring(topology, caps, full)
    return _hamiltonian(list(range(topology.num_ranks)), caps, 0, 0, full)


def pack_rings(topology: Topology, max_rings: int = 8) -> list[list[int]]:
    """Greedily pack rings that each take one lane of every link (and one unit of every switch port) they use.

    On DGX-1 this finds six rings, one per NVLink lane of each GPU.
    """
    units = _initial_units(topology)
    rings = []
    while len(rings) < max_rings:
        ring = find_ring(topology, _residual_caps(topology, units))
        if ring is None:
            break
        for u, v in _ring_edges(ring):
            for r in _resources(topology.link(u, v)):
                units[r] -= 1
        rings.append(ring)
    return rings


def _ring_edges(ring: list[int]) -> list[Edge]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def _chain_from(cycle: list[int], start: int) -> list[Edge]:
    """Edges along ``cycle`` from ``start`` through every other member."""
    p, n = cycle.index(start), len(cycle)
    return [(cycle[(p + i) % n], cycle[(p + i + 1) % n]) for i in range(n - 1)]


def _chain_to(cycle: list[int], end: int) -> list[Edge]:
    """Edges along ``cycle`` that start after ``end`` and finish at ``end``."""
    p, n = cycle.index(end), len(cycle)
    return [(cycle[(p + 1 + i) % n], cycle[(p + 2 + i) % n]) for i in range(n - 1)]


# ----------------------------------------------------------------------------------------------- routings

def _not_applicable(name: str, reason: str) -> InputError:
    return InputError(f"baseline {name!r}", "", reason)


class RingRoutes(Routes):
    """Chunks travel around rings; chunk ``index`` picks ring ``index % len(rings)``."""

    def __init__(self, rings: list[list[int]], shortest_paths: bool = False):
        self.rings = rings
        self.ways = len(rings)
        self.shortest_paths = shortest_paths

    def _ring(self, index):
        return self.rings[index % self.ways]

    def spread(self, origin, index):
        return _chain_from(self._ring(index), origin)

    def collect(self, root, index):
        return _chain_to(self._ring(index), root)

    def path(self, src, dst, index):
        ring = self._ring(index)
        if self.shortest_paths:
            n = len(ring)
            ahead = [(r.index(dst) - r.index(src)) % n for r in self.rings]
            best = min(ahead)
            ties = [r for r, a in zip(self.rings, ahead) if a == best]
            ring = ties[index % len(ties)]
        edges = _chain_from(ring, src)
        hops = (ring.index(dst) - ring.index(src)) % len(ring)
        return edges[:hops]

    def describe(self):
        return {"rings": [list(r) for r in self.rings]}


def _ring_routes(topology: Topology, collective: str, root) -> Routes:
    ring = find_ring(topology)
    if ring is None:
        raise _not_applicable("ring", f"no Hamiltonian ring found in topology {topology.name}")
    return RingRoutes([ring])


def _bidir_ring_routes(topology: Topology, collective: str, root) -> Routes:
    ring = find_ring(topology)
    if ring is None:
        raise _not_applicable("bidir-ring", f"no Hamiltonian ring found in topology {topology.name}")
    back = ring[::-1]
    missing = [e for e in _ring_edges(back) if topology.link(*e) is None]
    if missing:
        raise _not_applicable("bidir-ring", f"the ring {ring} cannot run backwards: topology {topology.name} "
                              f"has no link {missing[0][0]}->{missing[0][1]}")
    return RingRoutes([ring, back], shortest_paths=True)


def _multi_ring_routes(topology: Topology, collective: str, root) -> Routes:
    rings = pack_rings(topology)
    if len(rings) < 2:
        raise _not_applicable("multi-ring", f"only {len(rings)} ring(s) fit in topology {topology.name} "
                              "(each ring takes a lane of every link and a unit of every switch port it uses); "
                              "use 'ring'")
    return RingRoutes(rings, shortest_paths=True)


class AllPairsRoutes(Routes):
    """Every chunk goes straight from its source to each peer (needs a link between every pair)."""

    def __init__(self, n: int):
        self.n = n

    def spread(self, origin, index):
        return [(origin, (origin + i) % self.n) for i in range(1, self.n)]

    def collect(self, root, index):
        return [((root + i) % self.n, root) for i in range(1, self.n)]

    def path(self, src, dst, index):
        return [(src, dst)]

    def priority(self, src, dst, edges):
        return (dst - src) % self.n


def _all_pairs_routes(topology: Topology, collective: str, root) -> Routes:
    n = topology.num_ranks
    for a in range(n):
        for b in range(n):
            if a != b and topology.link(a, b) is None:
                raise _not_applicable("all-pairs", f"topology {topology.name} has no direct link {a}->{b}")
    return AllPairsRoutes(n)


class DoublingRoutes(Routes):
    """Recursive doubling between partners ``r ^ 2**k`` (rank ids); the in-tree is the out-tree reversed.

    With ``butterfly`` set, Allreduce is the full-vector exchange: in round k every rank adds its partner's
    whole buffer (log2 n steps, each moving everything).
    """

    def __init__(self, n: int, butterfly: bool):
        self.n = n
        self.rounds = n.bit_length() - 1
        self.butterfly = butterfly

    def spread(self, origin, index):
        holders, edges = [origin], []
        for k in range(self.rounds):
            new = [h ^ (1 << k) for h in holders]
            edges += list(zip(holders, new))
            holders += new
        return edges

    def collect(self, root, index):
        return [(v, u) for u, v in reversed(self.spread(root, index))]

    def explicit(self, collective):
        if not (self.butterfly and collective.name == "allreduce"):
            return None
        return [Transfer(c.id, r, r ^ (1 << k), k, REDUCE) for k in range(self.rounds)
                for r in range(self.n) for c in collective.chunks]


def _doubling(name: str, butterfly: bool):
    def make(topology: Topology, collective: str, root) -> Routes:
        n = topology.num_ranks
        if n & (n - 1):
            raise _not_applicable(name, f"needs a power-of-two rank count, topology {topology.name} has {n}")
        for r in range(n):
            for k in range(n.bit_length() - 1):
                if topology.link(r, r ^ (1 << k)) is None:
                    raise _not_applicable(name, f"needs links between ranks that differ in one bit; topology "
                                          f"{topology.name} has no link {r}->{r ^ (1 << k)}")
        return DoublingRoutes(n, butterfly)
    return make


@dataclass(frozen=True)
class Tree:
    """A rooted tree as parent -> child edges in breadth-first order."""

    root: int
    edges: tuple[Edge, ...]

    def interior(self) -> set[int]:
        return {u for u, _ in self.edges}


class TreeRoutes(Routes):
    """Two trees, chunk ``index`` uses tree ``index % 2`` (NCCL's double binary tree)."""

    ways = 2

    def __init__(self, trees: list[Tree]):
        self.trees = trees

    def _tree(self, root, index) -> Tree:
        tree = self.trees[index % 2]
        if tree.root != root:
            raise SynthError(f"internal error: tree rooted at {tree.root}, not {root}")
        return tree

    def spread(self, origin, index):
        return list(self._tree(origin, index).edges)

    def collect(self, root, index):
        return [(v, u) for u, v in reversed(self._tree(root, index).edges)]

    def hub(self, owner, index):
        return self.trees[index % 2].root

    def describe(self):
        return {"trees": [{"root": t.root, "edges": [list(e) for e in t.edges]} for t in self.trees]}


def _midpoint_tree(units: list[list[int]]) -> tuple[int, list[Edge]]:
    """Binary tree over a sequence of chains: the middle chain's head is the root, each half recurses; a
    chain hangs below its head. Returns the root rank and the edges (parent, child)."""
    edges: list[Edge] = []

    def build(lo, hi):
        if lo > hi:
            return None
        mid = (lo + hi) // 2
        chain = units[mid]
        edges.extend(zip(chain, chain[1:]))
        for child in (build(lo, mid - 1), build(mid + 1, hi)):
            if child is not None:
                edges.append((chain[0], child))
        return chain[0]

    root = build(0, len(units) - 1)
    return root, edges


def _bfs(root: int, edges: list[Edge]) -> Tree:
    children: dict[int, list[int]] = {}
    for u, v in edges:
        children.setdefault(u, []).append(v)
    order, frontier = [], [root]
    while frontier:
        nxt = []
        for u in frontier:
            for v in children.get(u, []):
                order.append((u, v))
                nxt.append(v)
        frontier = nxt
    return Tree(root, tuple(order))


def _unit_orders(topology: Topology) -> list[list[list[int]]]:
    """Candidate sequences of chains: the ring order (single node, each rank a chain) or the nodes with their
    intra-node ring (multi-node), every rotation, forwards and backwards, with every chain rotation."""
    if topology.num_nodes == 1:
        ring = find_ring(topology) or list(range(topology.num_ranks))
        bases = [[[r] for r in ring]]
        rotations = [0]
    else:
        cycles = _node_cycles(topology, "double-binary-tree")
        bases = [cycles]
        rotations = range(topology.gpus_per_node)
    out = []
    for base in bases:
        for seq in (base, base[::-1]):
            for shift in range(len(seq)):
                for c in rotations:
                    out.append([chain[c:] + chain[:c] for chain in seq[shift:] + seq[:shift]])
    return out


def _tree_candidates(topology: Topology, root: int | None):
    for units in _unit_orders(topology):
        if root is None:
            top, edges = _midpoint_tree(units)
            yield _bfs(top, edges)
            continue
        k = next(i for i, u in enumerate(units) if root in u)
        chain = units[k]
        p = chain.index(root)
        if topology.num_nodes > 1:
            chain = chain[p:] + chain[:p]
        elif p:
            continue
        others = units[k + 1:] + units[:k]
        edges = list(zip(chain, chain[1:]))
        if others:
            sub, sub_edges = _midpoint_tree(others)
            edges += sub_edges + [(root, sub)]
        yield _bfs(root, edges)


def _greedy_tree(topology: Topology, root: int, usable: Callable[[int, int], bool],
                 avoid: set[int]) -> Tree | None:
    """Breadth-first binary tree from ``root``: each rank adopts up to two unreached ranks over usable links,
    ranks outside ``avoid`` adopting first, faster links first. None if some rank stays unreached."""
    reached, frontier, edges = {root}, [root], []
    caps = {(l.src, l.dst): l.capacity_GBps for l in topology.links}
    while frontier:
        nxt = []
        for u in sorted(frontier, key=lambda r: (r in avoid, r)):
            options = sorted((v for v in range(topology.num_ranks) if v not in reached and usable(u, v)),
                             key=lambda v, u=u: (-caps[(u, v)], v))
            for v in options[:2]:
                reached.add(v)
                edges.append((u, v))
                nxt.append(v)
        frontier = nxt
    return _bfs(root, edges) if len(reached) == topology.num_ranks else None


def _greedy_pair(topology: Topology, root: int | None, usable) -> list[Tree] | None:
    """Two greedy trees; the second prefers the first one's leaves as its inner ranks."""
    roots = [root] if root is not None else list(range(topology.num_ranks))
    first = next((t for t in (_greedy_tree(topology, r, usable, set()) for r in roots) if t), None)
    if first is None:
        return None
    inner = first.interior() - {first.root}
    seconds = [t for t in (_greedy_tree(topology, r, usable, inner) for r in roots) if t]
    second = min(seconds, key=lambda t: len(t.interior() & inner))
    return [first, second]


def _double_tree_routes(topology: Topology, collective: str, root) -> Routes:
    need_down = collective in ("broadcast", "allreduce")
    need_up = collective in ("reduce", "allreduce")
    root = (0 if root is None else root) if collective in ("broadcast", "reduce") else None

    def usable(u, v):
        return (not need_down or topology.link(u, v) is not None) and \
            (not need_up or topology.link(v, u) is not None)

    valid = []
    for tree in _tree_candidates(topology, root):
        if tree not in valid and all(usable(u, v) for u, v in tree.edges):
            valid.append(tree)
    if valid:
        first = valid[0]
        second = max(valid, key=lambda t: (len(first.interior() - t.interior()), -valid.index(t)))
        return TreeRoutes([first, second])
    pair = _greedy_pair(topology, root, usable)
    if pair is None:
        direction = "both ways" if need_up and need_down else ("to the root" if need_up else "from the root")
        raise _not_applicable("double-binary-tree", f"no binary tree spans topology {topology.name} over links "
                              f"{direction}")
    return TreeRoutes(pair)


def _node_cycles(topology: Topology, name: str) -> list[list[int]]:
    """A ring inside each node over intra-node links."""
    caps = {(l.src, l.dst): l.capacity_GBps for l in topology.links
            if topology.node_of(l.src) == topology.node_of(l.dst)}
    cycles = []
    for k in range(topology.num_nodes):
        members = _node_members(topology, k)
        cycle = _hamiltonian(members, caps, members[0], members[0]) if len(members) > 1 else members
        if cycle is None:
            raise _not_applicable(name, f"no ring inside node {k} of topology {topology.name}")
        cycles.append(cycle)
    return cycles


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
        edges = _chain_from(self.cycles[k0], origin)
        for v in range(num_nodes - 1):
            x, e = rail[(k0 + v) % num_nodes]
            edges.append((x, e))
            edges += _chain_from(self.cycles[(k0 + v + 1) % num_nodes], e)
        return edges

    def collect(self, root, index):
        rail, num_nodes = self._rail(root, index), self.topology.num_nodes
        k0 = self.topology.node_of(root)
        edges = []
        for v in range(1, num_nodes):
            k = (k0 + v) % num_nodes
            x, e = rail[k]
            edges += _chain_to(self.cycles[k], x) + [(x, e)]
        return edges + _chain_to(self.cycles[k0], root)

    def describe(self):
        return {"node_rings": self.cycles, "rails": [[list(e) for e in rail] for rail in self.rails]}


def _hierarchical_routes(topology: Topology, collective: str, root) -> Routes:
    name = "hierarchical"
    if topology.num_nodes < 2:
        raise _not_applicable(name, f"needs several nodes; topology {topology.name} has one")
    cycles = _node_cycles(topology, name)
    per_pair = []
    for k in range(topology.num_nodes):
        nxt = (k + 1) % topology.num_nodes
        links = [l for l in topology.links if topology.node_of(l.src) == k and topology.node_of(l.dst) == nxt]
        gpn = topology.gpus_per_node
        links.sort(key=lambda l: (-l.capacity_GBps, (l.src - l.dst) % gpn != 0, l.src, l.dst))
        chosen, used = [], set()
        for link in links:
            res = set(_resources(link)) | {("src", link.src), ("dst", link.dst)}
            if not res & used:
                chosen.append((link.src, link.dst))
                used |= res
        if not chosen:
            raise _not_applicable(name, f"no link from node {k} to node {nxt} in topology {topology.name}")
        per_pair.append(chosen)
    num_rails = min(len(c) for c in per_pair)
    rails = [[per_pair[k][j] for k in range(topology.num_nodes)] for j in range(num_rails)]
    return HierarchicalRoutes(topology, cycles, rails)


# ----------------------------------------------------------------------------------------------- registry

_ALL = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall", "gather", "scatter")


@dataclass(frozen=True)
class Baseline:
    """A registered baseline: which collectives it implements and how it routes them on a topology."""

    name: str
    description: str
    collectives: tuple[str, ...]
    routes: Callable[[Topology, str, int | None], Routes]


BASELINES = MappingProxyType({b.name: b for b in (
    Baseline("ring", "one ring over the fastest Hamiltonian cycle; pipelined chain for rooted collectives",
             _ALL, _ring_routes),
    Baseline("bidir-ring", "the ring in both directions, half the data each way", _ALL, _bidir_ring_routes),
    Baseline("multi-ring", "several rings packed onto the link lanes, data split evenly", _ALL,
             _multi_ring_routes),
    Baseline("double-binary-tree", "two complementary binary trees (over nodes with intra-node chains)",
             ("allreduce", "broadcast", "reduce"), _double_tree_routes),
    Baseline("recursive-doubling", "exchange with partner r^2^k; Allreduce exchanges the whole buffer",
             ("allgather", "allreduce"), _doubling("recursive-doubling", butterfly=True)),
    Baseline("recursive-halving-doubling", "recursive halving reduce-scatter (then doubling allgather)",
             ("reducescatter", "allreduce"), _doubling("recursive-halving-doubling", butterfly=False)),
    Baseline("hierarchical", "intra-node ring, inter-node rails, intra-node ring",
             ("allgather", "reducescatter", "allreduce", "broadcast", "reduce"), _hierarchical_routes),
    Baseline("all-pairs", "direct sends to every peer", ("allgather", "reducescatter", "allreduce", "alltoall",
                                                          "gather", "scatter"), _all_pairs_routes),
)})


def build_baseline(name: str, collective_name: str, topology: Topology, chunks_per_rank: int = 1,
                   root: int | None = None, order_bytes: float = DEFAULT_ORDER_BYTES) -> Schedule:
    """Build a baseline schedule.

    Parameters
    ----------
    name : str
        A key of :data:`BASELINES`.
    collective_name : str
    topology : Topology
    chunks_per_rank : int
        Chunks per rank *per ring or tree* (pipelining depth).
    root : int, optional
        Root of rooted collectives (default 0).
    order_bytes : float
        Size (nccl-tests' convention, bytes) at which the issue order is tuned; any size verifies.

    Raises
    ------
    InputError
        Unknown baseline, unsupported collective, or a topology without the links the baseline needs.
    """
    spec = BASELINES.get(name)
    if spec is None:
        raise InputError("NAME", "", f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
    cname = normalize_name(collective_name)
    if cname not in spec.collectives:
        raise _not_applicable(name, f"does not implement {cname}; it implements {', '.join(spec.collectives)}")
    if chunks_per_rank < 1:
        raise InputError("--chunks", "", f"must be at least 1, got {chunks_per_rank}")
    routes = spec.routes(topology, cname, root)
    coll = make_collective(cname, topology.num_ranks, chunks_per_rank * routes.ways, root)
    transfers = routes.explicit(coll)
    if transfers is None:
        plans = plan_collective(coll, routes)
        _check_links(plans, topology, name)
        transfers = order_plans(plans, topology, coll.chunk_bytes(order_bytes))
    steps = 1 + max((t.step for t in transfers), default=-1)
    notes = {"baseline": name, "chunks_per_way": chunks_per_rank, **routes.describe()}
    return Schedule(coll, topology.name, tuple(transfers), steps, method=f"baseline:{name}", notes=notes)


def baseline_status(collective_name: str, topology: Topology, root: int | None = None) -> dict[str, str | None]:
    """For every baseline, None if it applies to the collective on the topology, else the reason it does not."""
    cname = normalize_name(collective_name)
    status = {}
    for name, spec in BASELINES.items():
        if cname not in spec.collectives:
            status[name] = f"does not implement {cname}"
            continue
        try:
            spec.routes(topology, cname, root)
            status[name] = None
        except InputError as exc:
            status[name] = exc.problem
    return status


@dataclass(frozen=True)
class BaselineRun:
    """One baseline schedule built for a size, with its replayed time."""

    name: str
    chunks_per_way: int
    schedule: Schedule
    report: ReplayReport

    @property
    def runnable(self) -> bool:
        """Whether the MSCCL runtimes select it at power-of-two sizes (power-of-two ``nchunksperloop``)."""
        return self.schedule.collective.runs_at_power_of_two_sizes


@dataclass(frozen=True)
class BaselineTable:
    """Every applicable baseline at one size (each chunk option), built and replayed once per request.

    ``reasons`` says why each baseline that is missing does not apply.
    """

    collective: str
    topology: str
    size_bytes: float
    runs: tuple[BaselineRun, ...]
    reasons: tuple[str, ...]

    def best(self, runnable_only: bool = False) -> BaselineRun:
        """The fastest run (the first built among equals); raises InputError when none qualifies.

        ``runnable_only`` keeps only schedules the MSCCL runtimes select at power-of-two sizes
        (see :attr:`synth.model.collectives.Collective.runs_at_power_of_two_sizes`).
        """
        best = None
        for run in self.runs:
            if runnable_only and not run.runnable:
                continue
            if best is None or run.report.time_us < best.report.time_us:
                best = run
        if best is None:
            reasons = list(self.reasons)
            if runnable_only:
                reasons += [f"{r.name} with {r.chunks_per_way} chunk(s): nchunksperloop "
                            f"{r.schedule.collective.loop_chunks} is not a power of two" for r in self.runs]
            raise InputError("COLLECTIVE", "", f"no baseline applies to {self.collective} on {self.topology}: "
                             + "; ".join(reasons))
        return best


def evaluate_baselines(collective_name: str, topology: Topology, size_bytes: float, root: int | None = None,
                       chunk_options: tuple[int, ...] = (1, 2, 4)) -> BaselineTable:
    """Build and replay every applicable baseline for each of ``chunk_options`` at ``size_bytes``.

    >>> from synth.model.topology import load_topology
    >>> table = evaluate_baselines("allgather", load_topology("ring-4"), 1 << 20)
    >>> table.best().name, table.best().report.time_us > 0
    ('bidir-ring', True)
    """
    runs, reasons = [], []
    for name, reason in baseline_status(collective_name, topology, root).items():
        if reason is not None:
            reasons.append(f"{name}: {reason}")
            continue
        for chunks in chunk_options:
            schedule = build_baseline(name, collective_name, topology, chunks, root, order_bytes=size_bytes)
            runs.append(BaselineRun(name, chunks, schedule, verify(schedule, topology, size_bytes)))
    return BaselineTable(normalize_name(collective_name), topology.name, size_bytes, tuple(runs), tuple(reasons))


def best_baseline(collective_name: str, topology: Topology, size_bytes: float, root: int | None = None,
                  chunk_options: tuple[int, ...] = (1, 2, 4), runnable_only: bool = False) -> BaselineRun:
    """The fastest applicable baseline at ``size_bytes``; raises InputError when none applies.

    Builds every baseline: a request that needs baselines more than once keeps the :class:`BaselineTable`
    (:attr:`synth.synthesis.request.SynthesisRequest.baselines`).
    """
    return evaluate_baselines(collective_name, topology, size_bytes, root, chunk_options).best(runnable_only)
