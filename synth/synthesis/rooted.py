"""Rooted collectives across nodes (Broadcast, Reduce): the root's node splits the buffer over its rails, every
rail carries its share to the other nodes, each node spreads what its rails bring, all pipelined in chunks.

Tree packing (:mod:`synth.synthesis.trees`) reaches the limit on single nodes but not across them: on 2 x dgx-h100
its packing MILP left Broadcast 1 GB at 46% of the limit (33% MIP gap after its time limit) and its programs did
not fit the runtime. The throughput-optimal structure there is known, so it is composed directly:

* **rails**: node-to-node links with disjoint NICs (:func:`synth.synthesis.baselines.hierarchical.hierarchical_routes`:
  GPU ``i`` to GPU ``i`` of the next node on a DGX H100, one per NIC pair on a DGX-2, the published models' odd-to-even
  links); chunk ``c`` takes rail ``c mod R``, so every NIC carries ``1/R`` of the buffer, which is what the bound
  (the node's NICs) allows. With more than two nodes a rail is a chain through the nodes.
* **root node**: on an NVSwitch (a node where every GPU reaches every other) the root hands each chunk once to its
  rail's sender, which passes it to the rest of the node (the root's own rail's chunks go to a helper taking
  turns), so the root's switch port sends the buffer once; elsewhere the node's fewest-hop tree from the root.
* **other nodes**: the rail's receiving GPU spreads the chunk through its node (a star on an NVSwitch, its turns
  rotated so that the senders meet different receivers, else the node's fewest-hop tree).

Every sender's sends through one port go in chunk order (:func:`synth.schedule.list_scheduler.list_schedule`
with ``rule="sequence"``, timed with the runtime's FIFOs), as the lowering keeps them, so the plan is what runs.
Reduce takes the same trees reversed (:func:`synth.schedule.list_scheduler.reverse_in_time`): partial sums
collect in each node to its rail, cross, and collect at the root; they are booked as they can meet.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from backends.msccl.limits import max_steps
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.model.collectives import make_collective, normalize_name
from synth.model.topology import Topology, reverse_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.ir import Schedule
from synth.schedule.list_scheduler import list_schedule, reverse_in_time
from synth.schedule.replay import ReplayReport, verify
from synth.synthesis.baselines.hierarchical import hierarchical_routes
from synth.synthesis.baselines.plans import Edge
from synth.synthesis.hierarchy import NodeTrees, node_trees, rank_share_GBps

COLLECTIVES = ("broadcast", "reduce")
# The pipeline's fill and drain (the root's first hand-outs, the last chunk's spread) should cost at most this
# share of the bound; more chunks only add messages.
PIPELINE_SHARE = 0.01
MAX_CHUNKS = 1024
ELEMENT_BYTES = 4
LABEL = "rooted/"    # the start of every candidate's label


@dataclass(frozen=True)
class RootedCandidate:
    """A composed, replayed schedule; ``seconds``: composing and replaying it (wall time)."""

    chunks: int
    schedule: Schedule
    report: ReplayReport
    seconds: float

    @property
    def label(self) -> str:
        return f"{LABEL}c{self.chunks}"


def applies(topology: Topology, collective: str) -> bool:
    """Whether the composition covers the request: Broadcast or Reduce on several nodes joined by rails."""
    if normalize_name(collective) not in COLLECTIVES or topology.num_nodes < 2:
        return False
    try:
        hierarchical_routes(topology, "broadcast", 0)
        node_trees(topology)
    except InputError:
        return False
    return True


class RootedRoutes:
    """Every Broadcast chunk's out-tree from ``root`` (edges parents first), see the module doc."""

    def __init__(self, topology: Topology, root: int):
        self.topology = topology
        self.root = root
        self.g = topology.gpus_per_node
        self.k = topology.num_nodes
        self.rails = hierarchical_routes(topology, "broadcast", root).rails   # rails[j][n]: node n -> n + 1
        self.nodes: NodeTrees = node_trees(topology)
        # GPUs where a rail enters each node (keyed by the node's first rank): they spread the chunks their rail
        # brings, so the partners are chosen among the others where there are any
        self._entries: dict[int, set[int]] = {}
        for rail in self.rails:
            for _, entry in rail:
                self._entries.setdefault(entry - entry % self.g, set()).add(entry)

    def tree(self, chunk: int) -> list[Edge]:
        """Chunk ``chunk``'s out-tree: its rail is ``chunk mod R``; helpers and partners take turns by chunk."""
        rail = self.rails[chunk % len(self.rails)]
        turn = chunk // len(self.rails)
        n0 = self.root // self.g
        edges = self._root_node(turn, rail[n0][0])
        for hop in range(self.k - 1):
            src, entry = rail[(n0 + hop) % self.k]    # beyond the root's node, its spread brought the chunk to src
            edges.append((src, entry))
            edges += self._spread(entry, {entry}, turn)
        return edges

    def _root_node(self, turn: int, sender: int) -> list[Edge]:
        """The root node's edges: the root hands the chunk to one GPU (the rail's sender, or a helper when the
        root sends on the rail itself), which spreads it with a partner; or the node's tree from the root."""
        g, root = self.g, self.root
        if self.nodes.kind != "star" or g < 3:
            return self._spread(root, {root}, turn)
        base = root - root % g
        others = [base + (root % g + k) % g for k in range(1, g)]
        helper = sender if sender != root else others[turn % len(others)]
        return [(root, helper)] + self._spread(helper, {root, helper}, turn)

    def _spread(self, entry: int, have: set[int], turn: int) -> list[Edge]:
        """From ``entry`` to every GPU of its node that is not in ``have``: the node's tree, or on an NVSwitch a
        star; where some GPUs are no rail's entry, split with one of them as a partner (the entry hands the chunk
        to it, then both send to half the rest), so that every GPU of the node sends a share (a DGX-2 has a NIC
        per two GPUs: its 8 entries alone would each send 15/8 of the buffer, 16.1 ms against the 10.7 ms
        bound). Where every GPU is an entry, a partner only adds a hop (2 x dgx-h100 Broadcast 1 GB simulated
        at 51% of the limit with partners, 85% without)."""
        g = self.g
        base = entry - entry % g
        if self.nodes.kind != "star":
            return [(base + u, base + v) for u, v in self.nodes.edges[entry % g]]
        targets = [base + (entry % g + k) % g for k in range(1, g) if base + (entry % g + k) % g not in have]
        spare = [v for v in targets if v not in self._entries.get(base, ())]
        if len(targets) < 3 or not spare:
            return [(entry, v) for v in targets]
        partner = spare[turn % len(spare)]
        rest = [v for v in targets if v != partner]
        return [(entry, partner)] + [(entry if k % 2 else partner, v) for k, v in enumerate(rest)]

def compose(topology: Topology, collective: str, chunks: int, size_bytes: float, root: int | None = None
            ) -> Schedule:
    """The composed Broadcast (or Reduce, its trees reversed) with ``chunks`` chunks, ordered at ``size_bytes``.

    >>> from synth.model.topology import load_topology
    >>> topo = load_topology("dgx-h100", nodes=2)
    >>> s = compose(topo, "broadcast", 16, 1 << 30)
    >>> len(s.transfers) == 16 * 15
    True
    """
    name = normalize_name(collective)
    if not applies(topology, name):
        raise InputError("--method", "", f"the rooted composition covers {' and '.join(COLLECTIVES)} on several "
                         f"nodes joined by rails, not {name} on {topology.name}")
    root = root or 0
    if name == "reduce":
        reversed_topology = reverse_topology(topology)
        forward = _broadcast(reversed_topology, chunks, size_bytes, root)
        # booked greedily, least slack first by the reversal's times: partial sums meet as they come (2 x
        # dgx-h100 Reduce 1 GB, 128 chunks: 91% of the limit simulated; each port in the reversal's sequence, 82%)
        return reverse_in_time(forward, topology, make_collective(name, topology.num_ranks, chunks, root),
                               size_bytes, "rooted", rule="deadline")
    return _broadcast(topology, chunks, size_bytes, root)


def _broadcast(topology: Topology, chunks: int, size_bytes: float, root: int) -> Schedule:
    """Broadcast booked in sequence: every sender's sends through one port go chunk by chunk, and within a chunk
    in its tree's order."""
    routes = RootedRoutes(topology, root)
    trees = [routes.tree(c) for c in range(chunks)]
    route_links = [tuple(topology.link_index[e] for e in tree) for tree in trees]
    depth = max(len(t) for t in trees)
    rank = np.array([c * depth + h for c, tree in enumerate(trees) for h in range(len(tree))], dtype=float)
    return list_schedule(topology, make_collective("broadcast", topology.num_ranks, chunks, root), route_links,
                         size_bytes, "rooted", rank=rank, rule="sequence",
                         notes={"plan": f"{LABEL}c{chunks}", "rails": len(routes.rails),
                                "node_trees": routes.nodes.kind})


def chunk_options(topology: Topology, collective: str, size_bytes: float, root: int | None = None,
                  target: str = "executor") -> tuple[int, ...]:
    """Chunk counts worth trying (powers of two, at most :data:`MAX_CHUNKS`).

    On NVSwitch nodes: the most for which the root's busiest hand-out connection holds at most half the target's
    steps per threadblock (a send and its dependency ``nop`` each), so the program fits one channel, which keeps
    every connection's order (spread over channels, 2 x dgx-h100 Broadcast 1 GB with 256 chunks simulated at
    77% of the limit, on one channel 89%, which does not fit the executor), and half of it. Elsewhere (a node
    tree, whose connections are chains the lowering spreads over channels without races): the fewest for which
    a chunk's trip (down the root's tree, across a rail, down the other node's tree) costs at most
    :data:`PIPELINE_SHARE` of the bound (2 x ndv2 Broadcast 1 GB: 99.0% of the limit with 128 chunks, 99.8%
    with 1024), and a quarter of it."""
    name = normalize_name(collective)
    root = root or 0
    routes = RootedRoutes(topology, root)
    g = topology.gpus_per_node
    star = routes.nodes.kind == "star"
    # a star's sends leave one port one after the other; a fewest-hop tree's edges bound its depth
    depth = g - 1 if star else max(len(edges) for edges in routes.nodes.edges)
    node_GBps = min(topology.link(u, v).capacity_GBps for u, v in routes.nodes.edges[root % g])
    rail_GBps = min(rank_share_GBps(topology, topology.link(*rail[0])) for rail in routes.rails)
    trip_us = size_bytes * (2 * depth / node_GBps + 1 / rail_GBps) / BYTES_PER_US_PER_GBPS
    bound = lower_bound(name, topology, size_bytes, root=root).bandwidth_us
    c = 1
    # (no more chunks than 4-byte elements: the runtime selects the program only where they divide the count)
    while 2 * c <= min(MAX_CHUNKS, size_bytes // ELEMENT_BYTES) and trip_us / c > PIPELINE_SHARE * bound:
        c *= 2
    if not star:
        return tuple(sorted({c, max(1, c // 4)}))
    while c > 1 and _busiest_hand_out(routes, c) > max_steps(target) // 2:
        c //= 2
    return tuple(sorted({c, max(1, c // 2)}))


def _busiest_hand_out(routes: RootedRoutes, chunks: int) -> int:
    """Messages on the root's busiest connection with ``chunks`` chunks."""
    return max(Counter((u, v) for c in range(chunks) for u, v in routes.tree(c) if u == routes.root).values())


def synthesize_rooted(topology: Topology, collective: str, size_bytes: float, root: int | None = None,
                      target: str = "executor", chunks: int | None = None) -> list[RootedCandidate]:
    """Every composition of :func:`chunk_options` (or the user's ``chunks``), replayed, fastest first."""
    found = []
    for c in ((chunks,) if chunks else chunk_options(topology, collective, size_bytes, root, target)):
        t0 = time.perf_counter()
        schedule = compose(topology, collective, c, size_bytes, root)
        report = verify(schedule, topology, size_bytes)
        found.append(RootedCandidate(c, schedule, report, time.perf_counter() - t0))
    return sorted(found, key=lambda r: r.report.time_us)


def busiest_connection(schedule: Schedule) -> int:
    """Messages on the schedule's busiest connection (what one threadblock must hold on one channel)."""
    return max(Counter((t.src, t.dst) for t in schedule.transfers).values())
