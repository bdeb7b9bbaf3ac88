"""Routes: which links each chunk travels over (a tree from its source), before any order or timing is fixed.

The alpha-beta formulations work in three stages: *route* every chunk (a constructive heuristic here, or the
routed MILP in :mod:`synth.formulations.routed`), *order* the transfers on every link (:mod:`synth.schedule.list_scheduler`), and
*time* the result exactly (the replay, :func:`synth.schedule.replay.verify`). This module holds the problem statement
they share (:class:`AlphaBetaProblem`), the route container (:class:`Routes`) and the constructive routing:
shortest-path trees under a load-aware weight, one orbit representative at a time, images by symmetry.

Units: times in microseconds, sizes in bytes, bandwidths in GB/s (1e3 bytes per microsecond).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from synth.model.collectives import Collective
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.errors import InfeasibleError
from synth.schedule.ir import Schedule
from synth.model.sketch import InterNode, IntraNode, Sketch, relay_mask, unrestricted
from synth.model.symmetry import SymmetryGroup, free_symmetry_group, group_closure, symmetry_for_collective
from synth.model.topology import Topology


@dataclass(frozen=True)
class AlphaBetaProblem:
    """One non-combining collective to synthesize under the alpha-beta model.

    ``mask[c, l]`` says whether chunk ``c`` may use link ``l`` (sketch and relays applied, links into the
    chunk's own sources removed). ``symmetry`` is a rank-permutation group acting freely on chunks that
    preserves topology, collective and mask (identity first); ``reps`` holds one chunk per orbit.
    """

    topology: Topology
    collective: Collective
    size_bytes: float
    sketch: Sketch
    mask: np.ndarray = field(repr=False)
    symmetry: SymmetryGroup
    reps: tuple[int, ...]

    @property
    def chunk_bytes(self) -> float:
        return self.collective.chunk_bytes(self.size_bytes)

    def beta_us(self) -> np.ndarray:
        """Time (us) one chunk occupies each link's bandwidth."""
        cap = np.array([l.capacity_GBps for l in self.topology.links])
        return self.chunk_bytes / (cap * BYTES_PER_US_PER_GBPS)

    def hop_us(self) -> np.ndarray:
        """Store-and-forward time (us) of one chunk over each link: alpha plus bytes over bandwidth."""
        return np.array([l.alpha_us for l in self.topology.links]) + self.beta_us()

    def active_chunks(self) -> list[int]:
        """Chunks that must move (some destination is not a source)."""
        return [c.id for c in self.collective.chunks if c.dest_ranks - c.sources]


def make_problem(topology: Topology, collective: Collective, size_bytes: float, sketch: Sketch | None = None,
                 use_symmetry: bool = True) -> AlphaBetaProblem:
    """Build the problem: apply the sketch, find a symmetry group compatible with it, pick orbit representatives.

    Raises
    ------
    InfeasibleError
        When the sketch leaves some destination unreachable for some chunk; the message names the sketch
        constraint whose removal restores reachability when one does.
    """
    sketch = sketch or unrestricted(topology)
    mask = sketch.chunk_link_mask(topology, collective)
    for c in collective.chunks:
        for i, link in enumerate(topology.links):
            if link.dst in c.sources:
                mask[c.id, i] = False
    _check_reachable(topology, collective, mask, sketch)
    if use_symmetry:
        # a declared group too large to enumerate (None) just means: no symmetry reduction
        candidates = (group_closure(list(sketch.symmetry)) or []) if sketch.symmetry else \
            free_symmetry_group(topology)
        symmetry = symmetry_for_collective(topology, collective, candidates, link_mask=mask)
    else:
        symmetry = SymmetryGroup.trivial(topology.num_ranks, len(collective.chunks))
    return AlphaBetaProblem(topology, collective, size_bytes, sketch, mask, symmetry, symmetry.chunk_orbit_reps())


def _reachable(topology: Topology, allowed: np.ndarray, sources) -> set[int]:
    adj: dict[int, list[int]] = {}
    for i in np.flatnonzero(allowed):
        link = topology.links[i]
        adj.setdefault(link.src, []).append(link.dst)
    seen = set(sources)
    stack = list(sources)
    while stack:
        u = stack.pop()
        for v in adj.get(u, ()):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def _check_reachable(topology: Topology, collective: Collective, mask: np.ndarray, sketch: Sketch) -> None:
    for c in collective.chunks:
        missing = c.dest_ranks - _reachable(topology, mask[c.id], c.sources)
        if not missing:
            continue
        culprit = _blame(topology, collective, sketch, c)
        where = f" (sketch {sketch.source})" if sketch.source != "<default>" else ""
        hint = f"; relax {culprit}" if culprit else ""
        raise InfeasibleError(f"chunk {c.id} (from rank(s) {sorted(c.sources)}) cannot reach rank(s) "
                              f"{sorted(missing)} over the links the sketch allows{where}{hint}")


def _blame(topology: Topology, collective: Collective, sketch: Sketch, chunk) -> str | None:
    """Name the sketch constraint whose removal makes ``chunk`` reachable, trying one at a time."""
    trials = [
        ("internode.relays", replace(sketch, internode=replace(sketch.internode, relays=None))),
        ("internode.connections", replace(sketch, internode=replace(sketch.internode, connections=None))),
        ("intranode", replace(sketch, intranode=IntraNode())),
        ("internode (connections and relays)", replace(sketch, internode=InterNode())),
    ]
    for label, relaxed in trials:
        if relaxed == sketch:
            continue
        m = relaxed.allowed_links(topology) & relay_mask(relaxed, topology, collective)[chunk.id]
        for i, link in enumerate(topology.links):
            if link.dst in chunk.sources:
                m[i] = False
        if not chunk.dest_ranks - _reachable(topology, m, chunk.sources):
            return label
    return None


# ----------------------------------------------------------------------------------------------- routes

@dataclass(frozen=True)
class Routes:
    """Per chunk, the links (indices into ``topology.links``) of its tree, parents before children."""

    links: tuple[tuple[int, ...], ...]

    def num_transfers(self) -> int:
        return sum(len(r) for r in self.links)

    def link_counts(self, num_links: int) -> np.ndarray:
        """Chunks carried by each link."""
        counts = np.zeros(num_links, dtype=np.int64)
        for r in self.links:
            for li in r:
                counts[li] += 1
        return counts


def expand_symmetric(problem: AlphaBetaProblem, rep_routes: dict[int, tuple[int, ...]]) -> Routes:
    """Routes for every chunk from the representatives' routes and the symmetry group."""
    return Routes(tuple(problem.symmetry.expand_routes(problem.topology, rep_routes)))


def tree_order(topology: Topology, sources, links) -> tuple[int, ...]:
    """Order a set of links so every link's source rank is a chunk source or reached by an earlier link;
    links that never become reachable, and second arrivals at a rank, are dropped."""
    have = set(sources)
    pending = list(links)
    ordered = []
    progress = True
    while pending and progress:
        progress = False
        rest = []
        for li in pending:
            link = topology.links[li]
            if link.src in have and link.dst not in have:
                ordered.append(li)
                have.add(link.dst)
                progress = True
            elif link.src not in have:
                rest.append(li)
        pending = rest
    return tuple(ordered)


def prune_routes(problem: AlphaBetaProblem, routes: Routes) -> Routes:
    """Drop links into ranks that neither need the chunk nor forward it (repeatedly)."""
    topo = problem.topology
    out = []
    for c, route in enumerate(routes.links):
        dests = problem.collective.chunks[c].dest_ranks
        route = list(route)
        while True:
            senders = {topo.links[li].src for li in route}
            keep = [li for li in route if topo.links[li].dst in dests or topo.links[li].dst in senders]
            if len(keep) == len(route):
                break
            route = keep
        out.append(tuple(route))
    return Routes(tuple(out))


def routes_from_schedule(problem: AlphaBetaProblem, schedule: Schedule) -> Routes | None:
    """The routes a (non-combining) schedule uses, or None if some chunk reaches a rank twice or uses a link the
    problem forbids (then the schedule is not a set of trees the formulations can start from)."""
    topo = problem.topology
    per_chunk: list[list[int]] = [[] for _ in problem.collective.chunks]
    for t in schedule.ordered():
        li = topo.link_index.get((t.src, t.dst))
        if li is None or not problem.mask[t.chunk, li]:
            return None
        per_chunk[t.chunk].append(li)
    out = []
    for c, route in enumerate(per_chunk):
        dsts = [topo.links[li].dst for li in route]
        if len(set(dsts)) != len(dsts):
            return None
        ordered = tree_order(topo, problem.collective.chunks[c].sources, route)
        if len(ordered) != len(route):
            return None
        out.append(ordered)
    return Routes(tuple(out))


def is_symmetric(problem: AlphaBetaProblem, routes: Routes) -> bool:
    """True if the routes are invariant under the problem's symmetry group."""
    return problem.symmetry.routes_invariant(problem.topology, routes.links)


# ----------------------------------------------------------------------------------------------- constructive

def resource_keys(topology: Topology) -> tuple[list[tuple], dict]:
    """Per link, the resources it occupies: itself and, through a switch, the two ports. Returns the list of
    resource ids per link and each resource's bandwidth (GB/s)."""
    bw = {}
    per_link = []
    ports = topology.port_capacity()
    for i, link in enumerate(topology.links):
        keys = [("link", i)]
        bw[("link", i)] = link.capacity_GBps
        for key in link.ports:
            keys.append(("port",) + key)
            bw[("port",) + key] = ports[key]
        per_link.append(keys)
    return per_link, bw


def shortest_path_routes(problem: AlphaBetaProblem, load_weight: float = 1.0, order: list[int] | None = None) -> Routes:
    """Load-aware shortest-path trees, one orbit representative at a time (images follow by symmetry).

    Each representative chunk gets a shortest-path tree from its sources over its allowed links under the
    weight ``alpha + beta + load_weight * (time already booked on the link and its switch ports)``; the tree
    is pruned to the chunk's destinations, and the time of the tree and of all its images is booked. With
    ``load_weight = 0`` these are plain latency-optimal (alpha + beta) trees.
    """
    topo = problem.topology
    coll = problem.collective
    hop = problem.hop_us()
    per_link, res_bw = resource_keys(topo)
    booked: dict = {k: 0.0 for k in res_bw}
    nbytes = problem.chunk_bytes
    res_time = {k: nbytes / (bw * BYTES_PER_US_PER_GBPS) for k, bw in res_bw.items()}
    out_links: dict[int, list[int]] = {}
    for i, link in enumerate(topo.links):
        out_links.setdefault(link.src, []).append(i)
    images = problem.symmetry.link_images(topo)
    rep_routes = {}
    active = set(problem.active_chunks())
    for c in (order or list(problem.reps)):
        if c not in active:
            rep_routes[c] = ()
            continue
        chunk = coll.chunks[c]
        weight = hop + load_weight * np.array([max(booked[k] for k in per_link[i]) for i in range(len(topo.links))])
        parent = _dijkstra(topo, out_links, problem.mask[c], weight, chunk.sources)
        tree = set()
        for d in chunk.dest_ranks - chunk.sources:
            v = d
            while v not in chunk.sources:
                li = parent[v]
                if li in tree:
                    break
                tree.add(li)
                v = topo.links[li].src
        route = tree_order(topo, chunk.sources, sorted(tree))
        rep_routes[c] = route
        for li in route:
            for img in images[:, li]:
                for k in per_link[img]:
                    booked[k] += res_time[k]
    return expand_symmetric(problem, rep_routes)


def _dijkstra(topology: Topology, out_links, allowed, weight, sources) -> dict[int, int]:
    dist = {s: 0.0 for s in sources}
    parent: dict[int, int] = {}
    heap = [(0.0, s) for s in sorted(sources)]
    done = set()
    while heap:
        d, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        for li in out_links.get(u, ()):
            if not allowed[li]:
                continue
            v = topology.links[li].dst
            nd = d + weight[li]
            if nd < dist.get(v, np.inf) - 1e-12:
                dist[v] = nd
                parent[v] = li
                heapq.heappush(heap, (nd, v))
    return parent


def route_loads(problem: AlphaBetaProblem, routes: Routes) -> tuple[float, float]:
    """(max busy time over links and switch ports, max contention-free store-and-forward arrival), both in us."""
    topo = problem.topology
    per_link, res_bw = resource_keys(topo)
    counts = routes.link_counts(len(topo.links))
    booked: dict = {}
    for i in np.flatnonzero(counts):
        for k in per_link[i]:
            booked[k] = booked.get(k, 0.0) + counts[i] * problem.chunk_bytes / (res_bw[k] * BYTES_PER_US_PER_GBPS)
    hop = problem.hop_us()
    worst = 0.0
    for c, route in enumerate(routes.links):
        arrive = {s: 0.0 for s in problem.collective.chunks[c].sources}
        for li in route:
            link = topo.links[li]
            arrive[link.dst] = arrive[link.src] + hop[li]
            worst = max(worst, arrive[link.dst])
    return max(booked.values(), default=0.0), worst
