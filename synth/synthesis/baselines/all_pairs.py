"""Direct baselines: every chunk goes straight to each rank that needs it (all-pairs), and the direct-exchange
Allreduce, which reduces whole buffers between peers so that the data crosses the machine once.

At small sizes an Allreduce costs its alphas. Reduce-scatter then allgather crosses the alpha-diameter twice;
the direct exchange crosses it once: every rank adds its peers' whole (tiny) buffers into its own.

A relay cannot forward a peer's buffer untouched (a rank holds one value per chunk), so where not every pair is
linked the exchange goes by groups whose members are all linked (cliques), one phase per *factor*: on a DGX-1
the pairs ``{r, r+4}`` exchange, then the two NVLink quads {0..3} and {4..7} exchange their pair sums, and
every rank holds the total after two hops, the alpha-diameter. Phases factor the ranks as a product (every
group of one phase meets every group of the other exactly once), so no contribution is added twice.

Across nodes each node first sums itself that way; then every rank linked from all other nodes adds their node
sums (one hop over the network), and the node's other ranks copy the total from the nearest such rank:
on TE-CCL's two-node NDv2, GPU 1 of each node sends its node's sum to GPU 0 of the other, which spreads the total
through its own node, 4.1 us of alphas in all, the alpha-diameter.

>>> from synth.model.topology import load_topology
>>> from synth.schedule.replay import verify
>>> from synth.synthesis.baselines import build_baseline
>>> s = build_baseline("direct-exchange", "allreduce", load_topology("dgx1"))
>>> s.notes["exchange_groups"]
[[[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]]
>>> round(verify(s, load_topology("dgx1"), 1024).time_us, 3)   # 2 hops of 0.7 us alpha, 1 KB over NVLink
1.446
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Iterator

from synth.model.collectives import Collective
from synth.model.topology import Topology
from synth.schedule.ir import COPY, REDUCE, Transfer
from synth.synthesis.baselines.plans import Routes, not_applicable


class AllPairsRoutes(Routes):
    """Every chunk goes straight from its source to each peer (needs a link between every pair).

    Point-to-point messages (Alltoall) take turns in which every rank receives from one peer of its node and one
    of another node: a rank's sends leave through its node's switch port and through its NIC, each in turn, and in
    plain rank rotation every GPU of a node would start its NIC's turns at the same GPU of the next node and queue
    there (2 x dgx-h100 on rails: 49.0 ms simulated for 20.8 ms planned). Turn ``t`` of the other nodes goes from
    ``(a, u)`` to node ``a + 1 + t // G``, GPU ``u + t % G``: a Latin rotation, one sender per receiver.
    """

    def __init__(self, n: int, gpus_per_node: int | None = None):
        self.n = n
        self.g = gpus_per_node or n

    def spread(self, origin, index):
        return [(origin, (origin + i) % self.n) for i in range(1, self.n)]

    def collect(self, root, index):
        return [((root + i) % self.n, root) for i in range(1, self.n)]

    def path(self, src, dst, index):
        return [(src, dst)]

    def priority(self, src, dst, edges):
        g = self.g
        (a, u), (b, v) = divmod(src, g), divmod(dst, g)
        if a == b:
            return (v - u) % g
        return ((b - a) % (self.n // g) - 1) * g + (v - u) % g + 1


def all_pairs_routes(topology: Topology, collective: str, root) -> Routes:
    n = topology.num_ranks
    for a in range(n):
        for b in range(n):
            if a != b and topology.link(a, b) is None:
                raise not_applicable("all-pairs", f"topology {topology.name} has no direct link {a}->{b}")
    g = topology.gpus_per_node
    return AllPairsRoutes(n, g if g and n % g == 0 else n)


# ----------------------------------------------------------------------------------------------- direct exchange

DIRECT_EXCHANGE = "direct-exchange"
# Whole-buffer messages times ranks (= transfers with one chunk per rank) beyond which the exchange is not built:
# it serves small sizes, and on hundreds of ranks its all-to-all messages would take minutes to replay.
MAX_EXCHANGE_TRANSFERS = 1 << 17
# Clique partitions tried per factorization of a node (the built-in nodes need one or two).
MAX_PARTITIONS_TRIED = 64
# Largest group of one phase. A rank's buffer is read by every peer of its group before its first reduction may
# write it; the MSCCL lowering that sends each message whole waits once per peer message (a ``nop`` each), so a
# threadblock holds about a group's steps, and a rank takes a send and a receive threadblock per peer (at most 32 of
# each per channel): one phase of 16 on a DGX-2 node (0.35 us) instead of two of 4 (dgx2 x2, dgx2-2node-tecc).
# A larger clique is exchanged in two phases (one more alpha).
MAX_EXCHANGE_GROUP = 16

Group = tuple[int, ...]


@dataclass(frozen=True)
class Message:
    """One whole-buffer message of the exchange: at ``step``, ``src`` adds (``reduce``) or copies its buffer
    into ``dst``'s."""

    step: int
    src: int
    dst: int
    op: str


class ExchangeRoutes(Routes):
    """A fixed list of whole-buffer messages; every chunk of the Allreduce follows all of them."""

    def __init__(self, messages: tuple[Message, ...], phases: tuple[tuple[tuple[Group, ...], ...], ...],
                 cross_node_messages: int):
        self.messages = messages
        self.phases = phases
        self.cross_node_messages = cross_node_messages

    def explicit(self, collective: Collective) -> list[Transfer]:
        return [Transfer(c.id, m.src, m.dst, m.step, m.op) for m in self.messages for c in collective.chunks]

    def describe(self) -> dict:
        # the first node's phases stand for every node's (composed nodes are copies)
        return {"exchange_groups": [[list(g) for g in phase] for phase in self.phases[0]],
                "cross_node_messages": self.cross_node_messages}


def _linked(topology: Topology) -> Callable[[int, int], bool]:
    """Whether two ranks are linked both ways (read from a set: the partition searches ask millions of times)."""
    pairs = {(l.src, l.dst) for l in topology.links}
    both = {(a, b) for a, b in pairs if (b, a) in pairs}
    return lambda a, b: (a, b) in both


def _partitions(ranks: Group, size: int, fits: Callable[[tuple[int, ...], int], bool]) -> Iterator[list[Group]]:
    """Partitions of ``ranks`` into groups of ``size`` where every member ``fits`` the group built so far."""
    def extend(left: tuple[int, ...], done: list[Group]) -> Iterator[list[Group]]:
        if not left:
            yield list(done)
            return

        def grow(group: tuple[int, ...], rest: tuple[int, ...]) -> Iterator[list[Group]]:
            if len(group) == size:
                yield from extend(tuple(r for r in left if r not in group), done + [group])
                return
            for i, r in enumerate(rest):
                if fits(group, r):
                    yield from grow(group + (r,), rest[i + 1:])

        yield from grow(left[:1], left[1:])
    return extend(ranks, [])


def exchange_phases(topology: Topology, ranks: Group, max_group: int = MAX_EXCHANGE_GROUP
                    ) -> tuple[tuple[Group, ...], ...] | None:
    """Phases of cliques of at most ``max_group`` ranks whose exchanges sum ``ranks`` in as few hops as possible
    (one phase if they are all linked, else two that factor them); None when neither exists.

    >>> from synth.model.topology import load_topology
    >>> exchange_phases(load_topology("fully-connected-4"), (0, 1, 2, 3))
    (((0, 1, 2, 3),),)
    >>> exchange_phases(load_topology("ring-8"), tuple(range(8))) is None
    True
    """
    linked = _linked(topology)
    m = len(ranks)
    if m <= 1:
        return ()
    if m <= max_group and all(linked(a, b) for i, a in enumerate(ranks) for b in ranks[i + 1:]):
        return ((ranks,),)
    clique = lambda group, r: all(linked(g, r) for g in group)     # noqa: E731
    for a in sorted((d for d in range(2, m) if m % d == 0 and max(d, m // d) <= max_group), reverse=True):
        for tried, first in enumerate(_partitions(ranks, a, clique)):
            if tried >= MAX_PARTITIONS_TRIED:
                break
            block = {r: i for i, g in enumerate(first) for r in g}
            # each group of the second phase takes one rank from every group of the first: a rank linked into
            # fewer of the other groups than that has none (and the search for one explores every order: 2.7 s
            # on TE-CCL's two DGX-2 nodes, whose GPUs are linked across only one way)
            if any(len({block[o] for o in ranks if block[o] != block[r] and linked(r, o)}) < len(first) - 1
                   for r in ranks):
                continue
            across = lambda group, r: clique(group, r) and all(block[g] != block[r] for g in group)  # noqa: E731
            second = next(_partitions(ranks, m // a, across), None)
            if second is not None:
                return tuple(first), tuple(second)
    return None


def _copy_tree(topology: Topology, node: Group, holders: set[int]) -> dict[int, tuple[int, int]] | None:
    """For every rank of ``node`` outside ``holders``: (parent, hops) on an alpha-shortest path from the nearest
    holder, over links inside the node; None when a rank cannot be reached.

    Among parents at the same distance, the one with the fewest children so far: a parent sends the whole buffer
    to each child through its one switch port (TE-CCL's two DGX-2 nodes: GPU 16 copied the total to all eight odd
    GPUs of its node while GPUs 18..30 held it too, 8 x 1 KB queued at one port)."""
    best = {r: (0.0, 0) for r in holders}
    heap = [(0.0, 0, r) for r in sorted(holders)]
    while heap:
        dist, hops, u = heapq.heappop(heap)
        if best[u] < (dist, hops):
            continue
        for v in node:
            link = topology.link(u, v)
            if v == u or v in holders or link is None:
                continue
            cand = (dist + link.alpha_us, hops + 1)
            if v not in best or cand < best[v]:
                best[v] = cand
                heapq.heappush(heap, (*cand, v))
    if len(best) < len(node):
        return None
    parent: dict[int, tuple[int, int]] = {}
    children = {r: 0 for r in node}
    for v in sorted((r for r in node if r not in holders), key=lambda r: (best[r], r)):
        dist, hops = best[v]
        u = min((u for u in node if u != v and best[u][1] == hops - 1 and topology.link(u, v) is not None
                 and best[u][0] + topology.link(u, v).alpha_us == dist), key=lambda u: (children[u], u))
        children[u] += 1
        parent[v] = (u, hops)
    return parent


def direct_exchange_routes(topology: Topology, collective: str, root) -> Routes:
    """The direct-exchange Allreduce (module docstring) or an InputError saying why it does not apply."""
    n, per_node = topology.num_ranks, topology.gpus_per_node
    nodes = [tuple(range(k * per_node, (k + 1) * per_node)) for k in range(topology.num_nodes)]
    messages: list[Message] = []
    all_phases = []
    max_group = MAX_EXCHANGE_GROUP
    whole = exchange_phases(topology, tuple(range(n)), max_group) if len(nodes) > 1 else None
    if whole is not None and len(whole) == 1:
        # every pair linked (each GPU its own NIC): one hop of the slowest alpha, the alpha-diameter, where
        # summing each node first adds its alpha (dgx-h100 x2: 2.0 us, node first 2.6 us)
        nodes = [tuple(range(n))]
    for node in nodes:
        phases = exchange_phases(topology, node, max_group)
        if phases is None:
            raise not_applicable(DIRECT_EXCHANGE, f"the ranks {node[0]}..{node[-1]} of topology {topology.name} "
                                 f"neither form one linked group of at most {max_group} nor factor into two "
                                 "phases of such groups")
        all_phases.append(phases)
        for step, phase in enumerate(phases):
            messages += [Message(step, a, b, REDUCE) for g in phase for a in g for b in g if a != b]
    cross_step = max(len(p) for p in all_phases)
    cross = 0
    if len(nodes) > 1:
        sends = {r: 0 for r in range(n)}
        for node in nodes:
            holders = set()
            for v in node:
                senders = []
                for other in nodes:
                    if other is node:
                        continue
                    linked = [u for u in other if topology.link(u, v) is not None]
                    if not linked:
                        break
                    senders.append(min(linked, key=lambda u: (u % per_node != v % per_node,
                                                              topology.link(u, v).alpha_us, sends[u], u)))
                else:
                    holders.add(v)
                    for u in senders:
                        sends[u] += 1
                        messages.append(Message(cross_step, u, v, REDUCE))
            tree = _copy_tree(topology, node, holders) if holders else None
            if tree is None:
                raise not_applicable(DIRECT_EXCHANGE, f"no rank of {node[0]}..{node[-1]} on topology "
                                     f"{topology.name} is linked from every other node, or one cannot be "
                                     "reached from such a rank inside its node")
            messages += [Message(cross_step + hops, u, v, COPY) for v, (u, hops) in tree.items()]
        cross = sum(sends.values())
    if len(messages) * n > MAX_EXCHANGE_TRANSFERS:
        raise not_applicable(DIRECT_EXCHANGE, f"{len(messages)} whole-buffer messages on {n} ranks is over "
                             f"{MAX_EXCHANGE_TRANSFERS} transfers (it serves small sizes on small machines)")
    return ExchangeRoutes(tuple(messages), tuple(all_phases), cross)
