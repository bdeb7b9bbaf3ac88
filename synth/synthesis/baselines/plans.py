"""Routings and issue order shared by every baseline family: a Routes object says how each chunk spreads
(or is collected); plan_collective turns it into per-chunk plans and order_plans into ordered transfers."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from synth.errors import InputError, SynthError
from synth.model.collectives import Collective, make_collective
from synth.model.topology import Topology
from synth.schedule.costmodel import LinkClock
from synth.schedule.ir import COPY, REDUCE, Transfer

DEFAULT_ORDER_BYTES = 1 << 20
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

    def hops(self, src: int, dst: int, index: int) -> int:
        """Edges of :meth:`path` (routings that can count them without making the path override this)."""
        return len(self.path(src, dst, index))

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

    def explicit_count(self, collective_name: str, num_ranks: int, chunks_per_rank: int,
                       root: int | None = None) -> int | None:
        """Transfers :meth:`explicit` makes for that collective (None: it makes none, the routes decide). By
        default they are made and counted; routings that can count them without making them override this."""
        if type(self).explicit is Routes.explicit:
            return None
        made = self.explicit(make_collective(collective_name, num_ranks, chunks_per_rank, root))
        return None if made is None else len(made)

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


def count_transfers(collective_name: str, num_ranks: int, chunks_per_rank: int, routes: Routes,
                    root: int | None = None) -> int:
    """How many transfers the schedule of :func:`plan_collective` (or ``routes.explicit``) holds, without making
    any: what a baseline costs to build, replay and write is known before it is built.

    Exact for routings that keep the contract of :class:`Routes`: a spread (out-tree) reaches every rank but its
    root once and a collect (in-tree) hears from each of them once, so both have ``n - 1`` edges; a path has
    :meth:`Routes.hops` edges, and the chunk index picks a way modulo ``routes.ways``. The arguments are those of
    :func:`synth.model.collectives.make_collective` (``chunks_per_rank`` = C, not per way).

    >>> from synth.synthesis.baselines.all_pairs import AllPairsRoutes
    >>> count_transfers("alltoall", 4, 2, AllPairsRoutes(4)), count_transfers("allreduce", 4, 1, AllPairsRoutes(4))
    (24, 24)
    """
    explicit = routes.explicit_count(collective_name, num_ranks, chunks_per_rank, root)
    if explicit is not None:
        return explicit
    n, c = num_ranks, chunks_per_rank
    tree = n - 1
    if collective_name in ("allgather", "reducescatter"):
        return n * c * tree
    if collective_name == "allreduce":
        return n * c * 2 * tree
    if collective_name in ("broadcast", "reduce"):
        return c * tree
    root = 0 if root is None else root
    pairs = {"alltoall": ((s, d) for s in range(n) for d in range(n) if s != d),
             "gather": ((s, root) for s in range(n) if s != root),
             "scatter": ((root, d) for d in range(n) if d != root)}[collective_name]
    ways = min(routes.ways, c)
    uses = [c // ways + (w < c % ways) for w in range(ways)]   # chunk indices j < c with j % ways == w
    return sum(uses[w] * routes.hops(s, d, w) for s, d in pairs for w in range(ways))


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


def check_links(plans: list[ChunkPlan], topology: Topology, name: str) -> None:
    for p in plans:
        for u, v in p.reduce_edges + p.copy_edges:
            if topology.link(u, v) is None:
                raise InputError(f"baseline {name!r}", "", f"needs a link {u}->{v}, which topology "
                                 f"{topology.name} does not have")


# ----------------------------------------------------------------------------------------------- routings

def not_applicable(name: str, reason: str) -> InputError:
    return InputError(f"baseline {name!r}", "", reason)
