"""Rooted collectives across nodes (Broadcast, Reduce, Scatter, Gather): the root's node splits the buffer over
its rails, every rail carries its share to the other nodes, each node spreads what its rails bring, all pipelined
in chunks.

Tree packing (:mod:`synth.synthesis.trees`) reaches the limit on single nodes but not across them: on 2 x dgx-h100
its packing MILP left Broadcast 1 GB at 46% of the limit (33% MIP gap after its time limit) and its programs did
not fit the runtime. The throughput-optimal structure there is known, so it is composed directly:

* **rails**: node-to-node links with disjoint NICs (:func:`synth.synthesis.baselines.hierarchical.hierarchical_routes`:
  GPU ``i`` to GPU ``i`` of the next node on a DGX H100, one per NIC pair on a DGX-2, the published models' odd-to-even
  links); every NIC carries ``1/R`` of the chunks, which is what the bound (the node's NICs) allows. With more than
  two nodes a rail is a chain through the nodes.
* **root node**: on an NVSwitch with an odd number of peers (8 or 16 GPUs), a Latin square (:func:`latin_trees`):
  the root hands chunk ``c`` to peer ``c mod m``, which forwards it to the others one slot after another, so that
  no switch port is ever asked for twice at once and the root's port runs back to back; each NIC takes the chunk
  its sender has first (the root's own NIC the last ones). Otherwise the root hands each chunk once to its rail's
  sender, which passes it to the rest of the node (the root's own rail's chunks go to a helper taking turns), or
  the node's fewest-hop tree from the root.
* **other nodes**: with two nodes of a Latin square, a square too (:func:`_far_squares`: the rails arrive each at
  its own phase, and the entries' sends are placed so that no GPU receives twice in a slot); else the rail's
  receiving GPU spreads the chunk through its node (a star on an NVSwitch, with a partner where some GPUs carry no
  rail, else the node's fewest-hop tree).

Every sender's sends through one port go in the order of their slots
(:func:`synth.schedule.list_scheduler.list_schedule` with ``rule="sequence"``, timed with the runtime's FIFOs), as
the lowering keeps them, so the plan is what runs (2 x dgx-h100 Broadcast 1 GB: 98.4% of the limit simulated with
1024 chunks, the plan within 0.3% of it).
Reduce takes the same trees reversed (:func:`synth.schedule.list_scheduler.reverse_in_time`): partial sums
collect in each node to its rail, cross, and collect at the root; they are booked as they can meet.

**Chains** (:func:`chain_paths`), on two NVSwitch nodes where some GPUs carry no rail (a DGX-2: a NIC per two GPUs),
in long pipelines: each chunk goes round each node's ring, crossing on its rail in between, so every GPU takes a
chunk (a partial sum) once and passes it on once. A tree's receiver reduces several partial sums of one chunk in
turn, and at the runtime's FIFO depth that stalled the rails (2 x dgx2 Reduce 1 GB: reversed Latin squares 77.6% of
the limit simulated). Reduce's partial sums go round the far node to the rail, and in the root's node round one
ring to the root that each rail's partial sum joins at its entry (98.5% of the limit simulated with 2048 chunks,
timed as their fused lowering runs them). Broadcast's chains cross at once (the rail's sender passes the chunk on
across and round its node) and are timed as the runtime relays them, as they come (98.2% of the limit, planned
and simulated); with 2048 chunks, fused, they go round one ring of the root's node, each rail's sender sending
across as the chunk passes (98.7%).

**One NVSwitch node** (:func:`one_node_square`): Broadcast and Reduce as the root's Latin square alone, where the
tree packing's chain fills over too many alphas (dgx-a100 1 MB: 5.62 us against the packing's 6.25 us).

Scatter (Gather backwards, on the reversed machine) sends each chunk on a path: straight to the root node's GPUs,
and to other nodes over the root's own NIC or handed to another rail's sender, in the proportion that makes the
root's switch port and NIC finish together (:func:`own_rail_chunks`; that is Scatter's bound on 2 x dgx-h100).
The greedy booking (:func:`synth.schedule.list_scheduler.list_schedule`) is tried with a few rules and chunk
counts, the fastest replays compete (:func:`synthesize_rooted`).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from backends.msccl.limits import MAX_CHANNELS, max_steps
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.model.collectives import make_collective, normalize_name
from synth.model.topology import Topology, reverse_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS, load_bound_us
from synth.schedule.ir import Schedule
from synth.schedule.list_scheduler import PLAN_CHANNELS, RUNTIME_FIFO_DEPTH, list_schedule, reverse_in_time
from synth.schedule.replay import ReplayReport, verify
from synth.synthesis.baselines.hierarchical import hierarchical_routes
from synth.synthesis.baselines.plans import Edge
from synth.synthesis.hierarchy import NodeTrees, node_trees, rank_share_GBps
from synth.units import format_size

COLLECTIVES = ("broadcast", "reduce", "scatter", "gather")
PERSONALISED = ("scatter", "gather")    # a path per chunk, on NVSwitch nodes
REVERSED = ("reduce", "gather")         # composed on the reversed topology
# Where the composition replaces the flat searches across nodes (tree packing took 8 minutes on 2 x dgx-h100
# Broadcast 1 GB for 46% of the limit); for Scatter and Gather they still compete
SEARCHED_ALONE = ("broadcast", "reduce")
# The pipeline's fill and drain (the root's first hand-outs, the last chunk's spread) should cost at most this
# share of the bound; more chunks only add messages.
PIPELINE_SHARE = 0.01
MAX_CHUNKS = 1024
# Chains with more chunks than MAX_CHUNKS, as their fused lowering holds them (a relay's 2048 ``rcs``/``rrs`` steps
# are 32 channels of 64; 2 x dgx2 1 GB with 2048 chunks: Reduce 98.5% of the limit simulated, 97.1% with 1024;
# Broadcast 98.7%, 98.2%), only where a chunk through a switch port still takes CHAIN_FINER_ALPHAS times a hop's
# latency: below, every relay adds more latency than the finer pipeline saves (2 x dgx2 Reduce 256 MB: 98.3% with
# 2048 chunks, 96.8% with 1024; 64 MB, a chunk through a port in 0.27 us against 0.35 us of latency: 93.3% against
# 95.6%).
CHAIN_MOST_CHUNKS = 2048
CHAIN_FINER_ALPHAS = 2.0
LATENCY_BOUND_CHUNKS = 16    # Latin squares: chunks kept however small they are (below them latency rules anyway)
ELEMENT_BYTES = 4
LABEL = "rooted/"    # the start of every candidate's label
# Scatter and Gather: chunks per rank and booking rules tried, and how many of them (fastest by replay) compete;
# with more chunks the greedy booking leaves more holes (2 x dgx-h100 Scatter 1 GB: 98.1% of the limit with 16,
# 94.2% with 32, 89.7% with 64, simulated)
PERSONALISED_CHUNKS = (8, 16, 32)
PERSONALISED_RULES = ("work", "tail")
PERSONALISED_KEPT = 2
REDUCE_RULES = ("deadline", "work")      # list_schedule rules Reduce's reversed trees are booked by
# shares of the balanced count of chunks on the root's own rail; the greedy booking is erratic in them (2 x dgx2
# Gather 1 GB, 16 chunks by "tail": 97.4% of the limit simulated with 3/4, 98.0% with 13/16, 57.8% with 0.84)
OWN_RAIL_SCALES = (1.0, 0.8125, 0.75)
# Chains: channels per connection their plan is timed on (each rank takes one partial sum of a chunk, so channels
# do not race at a reduction; Broadcast's and Reduce's second timing: those that hold the busiest connection,
# :func:`_fitting_channels`), and the most their fill and drain may cost of the rails' time
CHAIN_CHANNELS = (1, 2, 4, 8, 16)
CHAIN_FILL_SHARE = 0.05
# Chains as composed (:func:`compose`): timed in each port's order (Broadcast: as its plain lowering relays them),
# or as their fused lowering runs them (Broadcast: round one ring of the root's node, :func:`_broadcast_chains`)
CHAIN_DESIGNS = ("chain", "chain/fused")
# One chunk in the fewest alphas (:func:`star_tree`): the latency regime's design, tried beside the pipelines
STAR = "star"
# One NVSwitch node: the root's Latin square alone (:func:`one_node_square`), with these chunk counts
SQUARE = "square"
SQUARE_CHUNKS = (16, 32, 64)
# How chains are booked (list_schedule's rules). Reduce: least slack first (dgx2-2node-tecc 1 GB, 1024 chunks:
# 93.4% of the limit simulated, each port in the due order 88.6%; timed as fused, 95.4% against 88.3%). Broadcast: the root's hand-outs in the due
# order, the relays as their chunks come (2 x dgx2 1 GB: 98.2% planned and simulated; booked greedily by least
# slack, 96.0% planned, 93.4% simulated)
CHAIN_RULES = {"broadcast": "sequence", "reduce": "deadline"}


@dataclass(frozen=True)
class RootedCandidate:
    """A composed, replayed schedule; ``seconds``: composing and replaying it (wall time)."""

    chunks: int
    schedule: Schedule
    report: ReplayReport
    seconds: float
    rule: str = "sequence"
    own_scale: float = 1.0
    design: str = "trees"     # or one of CHAIN_DESIGNS (:func:`chain_paths`)

    @property
    def label(self) -> str:
        personal = "" if self.rule == "sequence" else f"/{self.rule}/o{self.own_scale:g}"
        design = "" if self.design == "trees" else f"{self.design}/"
        return f"{LABEL}{design}c{self.chunks}{personal}"


def one_node_square(topology: Topology, collective: str, size_bytes: float, root: int = 0) -> list[int] | None:
    """The root's peers in hand-out order where a Broadcast or Reduce on one NVSwitch node is worth composing as the
    root's Latin square alone (:func:`latin_steps`; every GPU linked to every other, an odd number of peers), else
    None.

    The tree packing's optimum on a switch is a chain, which fills over ``n - 1`` hops of an alpha each, and its
    relay stars hand a relay's chunk to the others one after another, through ingress ports that the other relays
    ask for at the same time: dgx-a100 Broadcast 1 MB ran at 6.25 us (67% of the limit) either way. As a square
    every peer receives one chunk per slot, and the pipeline fills over two hops: 5.62 us with 32 chunks, planned
    and simulated (Reduce, its reversal, the same). Worth it while the chain's extra ``n - 3`` alphas cost more
    than the square's drain, ``m - 1`` chunk slots with the most chunks of :data:`SQUARE_CHUNKS` (64 MB: a slot
    takes 3.5 us there, and the chain is at the limit).

    >>> from synth.model.topology import load_topology
    >>> one_node_square(load_topology("dgx-a100"), "broadcast", 1 << 20)
    [1, 2, 3, 4, 5, 6, 7]
    >>> one_node_square(load_topology("dgx-a100"), "broadcast", 64 << 20), one_node_square(load_topology("dgx1"),
    ...                                                                                       "reduce", 1 << 20)
    (None, None)
    """
    name = normalize_name(collective)
    n = topology.num_ranks
    if name not in SEARCHED_ALONE or topology.num_nodes != 1 or not topology.switches or \
            latin_steps(n - 1) is None or n < 4:
        return None
    if any(topology.link(u, v) is None for u in range(n) for v in range(n) if u != v):
        return None
    peers = [(root + k) % n for k in range(1, n)]
    link = topology.link(root, peers[0])
    slot_us = size_bytes / max(SQUARE_CHUNKS) / (link.capacity_GBps * BYTES_PER_US_PER_GBPS)
    return peers if (n - 3) * link.alpha_us > (n - 2) * slot_us else None


def applies(topology: Topology, collective: str) -> bool:
    """Whether the composition covers the request: a rooted collective on several nodes joined by rails (Scatter
    and Gather on NVSwitch nodes). Reduce and Gather are composed on the reversed topology, so its rails are the
    ones that must go round the nodes: TE-CCL's NDv2 x4 model joins them one way only (node k to k + 1), and
    its Reduce stopped every `synth solve` with "no link from node 0 to node 1" instead of leaving this out."""
    name = normalize_name(collective)
    if name not in COLLECTIVES or topology.num_nodes < 2:
        return False
    try:
        hierarchical_routes(reverse_topology(topology) if name in REVERSED else topology, "broadcast", 0)
        nodes = node_trees(topology)
    except InputError:
        return False
    return name not in PERSONALISED or nodes.kind == "star"


class RootedRoutes:
    """Every Broadcast chunk's out-tree from ``root`` (edges parents first), see the module doc."""

    def __init__(self, topology: Topology, root: int):
        self.topology = topology
        self.root = root
        self.g = topology.gpus_per_node
        self.k = topology.num_nodes
        self.rails = hierarchical_routes(topology, "broadcast", root).rails   # rails[j][n]: node n -> n + 1
        self.nodes: NodeTrees = node_trees(topology)
        # GPUs that carry a rail in each node (keyed by the node's first rank), on the chains from the root's
        # node: they send and spread what crosses, so the partners are chosen among the others where there are any
        self._on_rails: dict[int, set[int]] = {}
        n0 = root // self.g
        for rail in self.rails:
            for hop in range(self.k - 1):
                for rank in rail[(n0 + hop) % self.k]:
                    self._on_rails.setdefault(rank - rank % self.g, set()).add(rank)

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
        star; where some GPUs carry no rail, split with one of them as a partner (the entry hands the chunk
        to it, then both send to half the rest), so that every GPU of the node sends a share (a DGX-2 has a NIC
        per two GPUs: its 8 entries alone would each send 15/8 of the buffer, 16.1 ms against the 10.7 ms
        bound). Where every GPU carries a rail, a partner only adds a hop (2 x dgx-h100 Broadcast 1 GB simulated
        at 51% of the limit with partners, 85% without)."""
        g = self.g
        base = entry - entry % g
        if self.nodes.kind != "star":
            return [(base + u, base + v) for u, v in self.nodes.edges[entry % g]]
        targets = [base + (entry % g + k) % g for k in range(1, g) if base + (entry % g + k) % g not in have]
        spare = [v for v in targets if v not in self._on_rails.get(base, ())]
        if len(targets) < 3 or not spare:
            return [(entry, v) for v in targets]
        partner = spare[turn % len(spare)]
        rest = [v for v in targets if v != partner]
        return [(entry, partner)] + [(entry if k % 2 else partner, v) for k, v in enumerate(rest)]

    def path(self, dst: int, rail: int) -> list[Edge]:
        """Edges from the root to ``dst``: straight inside the root's node; to another node along rail ``rail``
        (the root hands the chunk to the rail's sender first), and from the rail straight to ``dst`` where the
        network reaches it (a NIC reaches every GPU of the other node through the switch), else through the
        entry's node."""
        g, root = self.g, self.root
        if dst // g == root // g:
            return [(root, dst)]
        edges, holder, node = [], root, root // g
        while node != dst // g:
            sender, entry = self.rails[rail][node]
            if holder != sender:
                edges.append((holder, sender))
            if self.topology.link(sender, dst) is not None:
                return edges + [(sender, dst)]
            edges.append((sender, entry))
            holder, node = entry, entry // g
        return edges + ([(holder, dst)] if holder != dst else [])


def latin_steps(m: int) -> tuple[int, ...] | None:
    """Where a GPU forwards a block ``k`` blocks after it got it (``k = 1..m-1``): to the GPU ``steps[k - 1]``
    places after it among the root's ``m`` peers. ``2k mod m``: the step and the step minus ``k`` each take every
    nonzero value once, so in every block each peer receives exactly one block (from the root or from one
    forwarder) and sends at most one: no switch port is ever asked for twice at once. None for even ``m``
    (no such steps exist on a cyclic group of even order).

    >>> latin_steps(7)
    (2, 4, 6, 1, 3, 5)
    """
    if m < 2 or m % 2 == 0:
        return None
    return tuple(2 * k % m for k in range(1, m))


@dataclass(frozen=True)
class TimedTree:
    """A chunk's out-tree (edges parents first) and each edge's place in its sender's sequence (``rank``)."""

    edges: tuple[Edge, ...]
    rank: tuple[float, ...]


def latin_peers(routes: RootedRoutes) -> list[int] | None:
    """The root's peers in the order it hands them chunks (the rails' senders first, so the rails start early), or
    None where the root's node is no Latin square (:func:`latin_trees`)."""
    g, root = routes.g, routes.root
    if routes.nodes.kind != "star" or g < 4 or latin_steps(g - 1) is None:
        return None
    base = root - root % g
    senders = [rail[root // g][0] for rail in routes.rails]
    peers = [v for v in senders if v != root]
    return peers + [base + (root % g + j) % g for j in range(1, g) if base + (root % g + j) % g not in peers]


def latin_trees(topology: Topology, routes: RootedRoutes, chunks: int, chunk_bytes: float,
                far_squares: bool = True) -> list[TimedTree] | None:
    """Every chunk's tree with the root's node as a Latin square (None where it does not apply: a node that is
    not an NVSwitch, or an even number of peers).

    The root hands chunk ``c`` to peer ``c mod m``, which forwards it in the next ``m - 1`` chunk slots to the
    others (:func:`latin_steps`), so the root's port and every peer's ingress are busy back to back, each with one
    transfer at a time (the old star-per-rail hand-outs met the rail senders' spreads at their ingress ports: the
    root's port, 450 GB/s against the NICs' 400 on 2 x dgx-h100, waited there and fell behind the NICs, 84.5% of
    the limit simulated at 1 GB; as a Latin square 93.8% with 256 chunks, 96.5% with 512). Each chunk crosses on
    the rail that can have it across first (earliest finish, counting the NIC's backlog; the root's own rail
    takes any chunk), at most its share of the chunks per rail (a rail's connections then hold the fewest
    messages). Ranks are times in chunk slots (one chunk through a switch port), so each sender's sequence
    follows them. Beyond the root's node, the rail's entry spreads the chunk as :meth:`RootedRoutes.tree` does,
    or, on two nodes whose chunk slots are long enough (and ``far_squares``), as a Latin square too.

    >>> from synth.model.topology import load_topology
    >>> topo = load_topology("dgx-h100", nodes=2)
    >>> trees = latin_trees(topo, RootedRoutes(topo, 0), 16, (1 << 30) / 16)
    >>> trees[0].edges[:3], trees[1].edges[:2]
    (((0, 1), (1, 3), (1, 5)), ((0, 2), (2, 4)))
    """
    peers = latin_peers(routes)
    if peers is None:
        return None
    root, k, n0, m = routes.root, routes.k, routes.root // routes.g, len(peers)
    senders = [rail[n0][0] for rail in routes.rails]
    steps = latin_steps(m)
    switch_GBps = topology.link(root, peers[0]).capacity_GBps
    port_GBps = topology.port_capacity()
    nic_slots = [switch_GBps / min([topology.link(*rail[n0]).capacity_GBps]
                               + [port_GBps[p] for p in topology.link(*rail[n0]).ports])
                 for rail in routes.rails]
    # the rails' senders first, or every other place (on a DGX-2 half the peers carry no rail): whichever lets
    # the NICs cross without waiting (a NIC that waits changes its phase, and the other node's square no longer
    # holds: 2 x dgx2 Broadcast 1 GB, every rail waited once for its second chunk, plan 9% slower than simulated)
    orders = [peers]
    rest = peers[len(senders) - (root in senders):]
    if rest:
        ranked = peers[:len(peers) - len(rest)]
        orders.append([v for pair in itertools.zip_longest(ranked, rest) for v in pair if v is not None])
    steady = far_squares and _squares_hold(topology, routes, peers, chunk_bytes)
    best = None
    for order in orders:
        node_trees, have = _latin_node(root, order, steps, chunks)
        crossing = _rails_by_pull(routes, have, nic_slots)
        squares = _far_squares(routes, crossing, nic_slots) if steady else None
        key = (squares is None, _nic_waits(crossing, nic_slots))
        if best is None or key < best[0]:
            best = (key, node_trees, crossing, squares)
    _, node_trees, crossing, squares = best
    # the i-th chunk of every rail takes the i-th partner after its entry (the rails cross alike, so the partners
    # of chunks that arrive together differ)
    place = {c: i for rail in range(len(senders))
             for i, c in enumerate(sorted((c for c in range(chunks) if crossing[c][0] == rail),
                                          key=lambda c: crossing[c][1]))}
    trees = []
    for c, (edges, rank) in enumerate(node_trees):
        rail, start = crossing[c]
        turn = place[c]
        for hop in range(k - 1):
            src, entry = routes.rails[rail][(n0 + hop) % k]
            edges.append((src, entry))
            rank.append(start + hop * nic_slots[rail])
            arrival = start + (hop + 1) * nic_slots[rail]
            if squares is not None:
                edges += [edge for edge, _ in squares[rail]]
                rank += [arrival + offset - 1 for _, offset in squares[rail]]
                continue
            spread = routes._spread(entry, {entry}, turn)
            edges += spread
            rank += _expected_starts(spread, entry, arrival)
        trees.append(TimedTree(tuple(edges), tuple(rank)))
    return trees


def _squares_hold(topology: Topology, routes: RootedRoutes, peers: list[int], chunk_bytes: float) -> bool:
    """Whether the far node takes a Latin square too (:func:`latin_trees`): on two nodes, while a forward's
    latency, once per peer as the rails start, stays under half a chunk slot (the NICs' phases drift by it:
    2 x dgx-h100 Broadcast 1 GB with 1024 chunks planned 5.8% slower with squares)."""
    link = topology.link(routes.root, peers[0])
    slot_us = chunk_bytes / (link.capacity_GBps * BYTES_PER_US_PER_GBPS)
    return routes.k == 2 and len(peers) * link.alpha_us <= slot_us / 2


def _expected_starts(spread: list[Edge], entry: int, arrival: float) -> list[float]:
    """When each edge of a spread (parents first) from ``entry`` may start, in slots after ``arrival``: each sender
    sends one chunk per slot once it has the chunk."""
    have, busy, starts = {entry: arrival}, {}, []
    for u, v in spread:
        start = max(have[u], busy.get(u, arrival))
        busy[u] = have[v] = start + 1.0
        starts.append(start)
    return starts


def _latin_node(root: int, peers: list[int], steps: tuple[int, ...], chunks: int):
    """The root's node's edges and ranks per chunk, and when each chunk is at each GPU there (slots)."""
    m = len(peers)
    node_trees, have = [], []
    for c in range(chunks):
        a = c % m
        edges, rank, at = [(root, peers[a])], [float(c)], {root: 0.0, peers[a]: c + 1.0}
        for step in range(1, m):
            b = peers[(a + steps[step - 1]) % m]
            edges.append((peers[a], b))
            rank.append(float(c + step))
            at[b] = c + step + 1.0
        node_trees.append((edges, rank))
        have.append(at)
    return node_trees, have


def _nic_waits(crossing: list[tuple[int, float]], nic_slots: list[float]) -> int:
    """How often a NIC waits between two of its chunks."""
    starts: dict[int, list[float]] = {}
    for rail, start in crossing:
        starts.setdefault(rail, []).append(start)
    return sum(1 for rail, s in starts.items() for a, b in zip(sorted(s), sorted(s)[1:])
               if b > a + nic_slots[rail] + 1e-9)


def _far_squares(routes: RootedRoutes, crossing: list[tuple[int, float]], nic_slots: list[float]
                 ) -> list[list[tuple[Edge, int]]] | None:
    """The other node's spread per rail as (edge, slot after the chunk's arrival) with no two transfers into one
    GPU in the same slot, or None where no such spread is found (then :meth:`RootedRoutes._spread`).

    Every rail delivers a chunk every ``q`` slots (its NIC time in switch-port slots), rail ``j`` at its own phase.
    Where every GPU is an entry (2 x dgx-h100), the entry sends to the others in ``q`` slots; where there are as
    many other GPUs as entries (2 x dgx2: a NIC per two GPUs), entry ``j`` hands the chunk to GPU ``j`` of the
    others first and each then sends to its own kind (entries to entries, the others to the others). The order
    of the peers (a list edge colouring, :func:`_square`) is searched so that GPUs receive one chunk at a time
    whatever the phases (greedy spreads met at the ingress ports, and which of two transfers that met went first
    decided the plan: 2 x dgx2 Broadcast 1 GB planned 9% slower than it simulated)."""
    g, n0 = routes.g, routes.root // routes.g
    q = nic_slots[0]
    if any(abs(x - q) > 1e-9 for x in nic_slots) or abs(q - round(q)) > 1e-9:
        return None
    q = int(round(q))
    entries = [rail[n0][1] for rail in routes.rails]
    r = len(entries)
    base = entries[0] - entries[0] % g
    others = [v for v in range(base, base + g) if v not in entries]
    # each rail's phase: where most of its chunks cross (a rail may wait once for its second chunk, early on)
    phases = tuple(Counter(int(round(start)) % q for rail, start in crossing if rail == j).most_common(1)[0][0]
                   for j in range(r))
    if not others:
        first, square = 1, _square(r, q, phases, 1)
        if square is None:
            return None
        return [[((entries[j], entries[b]), t) for t, b in enumerate(square[j], first)] for j in range(r)]
    if len(others) == r and q >= r + 1:
        # each sends as soon as it has the chunk (a program sends when it can): the others once handed it
        to_entries, to_others, first = _square(r, q, phases, 2), _square(r, q, phases, 2, (1,)), 2
        if to_entries is None or to_others is None:
            return None
        return [[((entries[j], others[j]), 1)]
                + [((entries[j], entries[b]), t) for t, b in enumerate(to_entries[j], 2)]
                + [((others[j], others[b]), t) for t, b in enumerate(to_others[j], first)]
                for j in range(r)]
    return None


# Nodes a square's search may visit before it gives up (a square of 8 takes a few hundred)
SQUARE_SEARCH_NODES = 20_000


@functools.lru_cache(maxsize=64)
def _square(r: int, q: int, phases: tuple[int, ...], first: int, own: tuple[int, ...] = ()
            ) -> tuple[tuple[int, ...], ...] | None:
    """``targets[j][i]``: the member of a group of ``r`` that member ``j`` sends to at slot ``first + i`` after
    its chunk's arrival (slot ``phases[j]`` mod ``q``), every other member once, and no member receiving twice in
    a slot, nor at the slots ``own`` after its own arrival (where it gets its chunk from elsewhere). A list edge
    colouring of the complete digraph (each sender's slots are its list), found depth first, fewest choices
    first; None when there is none or the search gives up."""
    if first < 1 or first + r - 2 > q:
        return None
    slots = [[(phases[j] + first + i) % q for i in range(r - 1)] for j in range(r)]
    busy = [{(phases[b] + o) % q for o in own} for b in range(r)]
    todo = {(j, i) for j in range(r) for i in range(r - 1)}
    sent = [set() for _ in range(r)]
    chosen: dict = {}
    visits = [0]

    def options(j: int, i: int) -> list[int]:
        return [b for b in range(r) if b != j and b not in sent[j] and slots[j][i] not in busy[b]]

    def search() -> bool:
        if not todo:
            return True
        visits[0] += 1
        if visits[0] > SQUARE_SEARCH_NODES:
            return False
        j, i = min(todo, key=lambda ji: (len(options(*ji)), ji))
        todo.discard((j, i))
        for b in options(j, i):
            sent[j].add(b)
            busy[b].add(slots[j][i])
            chosen[(j, i)] = b
            if search():
                return True
            sent[j].discard(b)
            busy[b].discard(slots[j][i])
        todo.add((j, i))
        return False

    if not search():
        return None
    return tuple(tuple(chosen[(j, i)] for i in range(r - 1)) for j in range(r))


def _rails_by_pull(routes: RootedRoutes, have: list[dict[int, float]], nic_slots: list[float]
                   ) -> list[tuple[int, float]]:
    """Each chunk's rail and the start of its crossing (slots): whenever a NIC is free it takes the chunk its
    sender has first, up to its share of the chunks; the root's own NIC takes the last chunks first (the root
    has every chunk from the start, the other senders have the last ones only at the end)."""
    chunks, n0 = len(have), routes.root // routes.g
    senders = [rail[n0][0] for rail in routes.rails]
    most = -(-chunks // len(senders))     # every rail carries its share, no more (a message each)
    # popped from the end: the root's last chunk first, the others' first chunk there first
    queues = [sorted(range(chunks)) if s == routes.root else
              sorted(range(chunks), key=lambda c, s=s: (have[c][s], c), reverse=True) for s in senders]
    crossing: dict[int, tuple[int, float]] = {}
    free = [(0.0, j) for j in range(len(senders))]
    count = [0] * len(senders)
    while len(crossing) < chunks:
        at, j = heapq.heappop(free)
        queue = queues[j]
        while queue and queue[-1] in crossing:
            queue.pop()
        if not queue or count[j] == most:
            continue
        c = queue.pop()
        start = max(at, have[c][senders[j]])
        crossing[c] = (j, start)
        count[j] += 1
        heapq.heappush(free, (start + nic_slots[j], j))
    return [crossing[c] for c in range(chunks)]


def own_rail_chunks(topology: Topology, routes: RootedRoutes, chunks: int) -> int:
    """How many of the chunks bound for other nodes should cross on the root's own rail (its NIC) rather than be
    handed to another rail's sender, so that the root's switch port (its own node's chunks and the hand-outs)
    and its NIC finish together with the other rails (Scatter's bound is the root's egress: switch port and
    NIC together)."""
    g, root = topology.gpus_per_node, routes.root
    n0 = root // g
    own = [j for j, rail in enumerate(routes.rails) if rail[n0][0] == root]
    if not own:
        return 0
    others = len(routes.rails) - len(own)
    port_GBps = topology.link(root, routes.rails[0][n0][0] if routes.rails[0][n0][0] != root
                              else root - root % g + (root + 1) % g).capacity_GBps
    # rails have NICs of their own (hierarchical_routes picks them so): each rail sender has its NIC's bandwidth
    ports = topology.port_capacity()

    def rail_bw(j: int) -> float:
        link = topology.link(*routes.rails[j][n0])
        return min([link.capacity_GBps] + [ports[p] for p in link.ports])

    nic_GBps = rail_bw(own[0])
    rail_GBps = min((rail_bw(j) for j in range(len(routes.rails)) if j not in own), default=nic_GBps)
    local, remote = (g - 1) * chunks, (topology.num_ranks - g) * chunks

    def busiest(a: int) -> float:
        return max((local + remote - a) / port_GBps, a / nic_GBps,
                   (remote - a) / max(1, others) / rail_GBps if others else (0.0 if a == remote else math.inf))

    return min(range(remote + 1), key=busiest)


def compose(topology: Topology, collective: str, chunks: int, size_bytes: float, root: int | None = None,
            rule: str = "work", own_scale: float = 1.0, design: str = "trees") -> Schedule:
    """The composed Broadcast (or Reduce, its trees reversed) with ``chunks`` chunks, ordered at ``size_bytes``.

    >>> from synth.model.topology import load_topology
    >>> topo = load_topology("dgx-h100", nodes=2)
    >>> s = compose(topo, "broadcast", 16, 1 << 30)
    >>> len(s.transfers) == 16 * 15
    True
    """
    name = normalize_name(collective)
    if design != SQUARE and not applies(topology, name):
        raise InputError("--method", "", f"the rooted composition covers {' and '.join(COLLECTIVES)} on several "
                         f"nodes joined by rails, not {name} on {topology.name}")
    root = root or 0
    if name in PERSONALISED:
        return _personalised(topology, name, chunks, size_bytes, root, rule, own_scale)
    if design in CHAIN_DESIGNS:
        chained = _chain(topology, name, chunks, size_bytes, root, fused=design == "chain/fused")
        if chained is None:
            raise InputError("--method", "", f"rooted chains cover Broadcast and Reduce on two NVSwitch nodes, not "
                             f"{topology.name}")
        return chained
    broadcast = {STAR: _star_broadcast, SQUARE: _square_broadcast}.get(design, _broadcast)
    if name == "reduce":
        reversed_topology = reverse_topology(topology)
        forwards = [broadcast(reversed_topology, chunks, size_bytes, root)]
        routes = RootedRoutes(reversed_topology, root) if broadcast is _broadcast else None
        peers = latin_peers(routes) if routes is not None else None
        if peers is not None and _squares_hold(reversed_topology, routes, peers, size_bytes / chunks):
            # the far node's Latin squares (chunks of 4 MB on 2 x dgx-h100) speed the Broadcast, but their reversal
            # was booked 23% slower than the trees' (4 GB: 13383 us planned, its file 11344 us; by the trees'
            # 10871 us, 98.8% of the limit, and its file as planned)
            forwards.append(_broadcast(reversed_topology, chunks, size_bytes, root, far_squares=False))
        # booked greedily, partial sums meet as they come: least slack first by the reversal's times (2 x dgx-h100
        # Reduce 1 GB, 512 chunks: 97.5% of the limit simulated, by the busiest resource first 90.2%), or the
        # busiest resource first (with 1024 chunks 98.7%, least slack first 86.7%), whichever plan is faster
        booked = [reverse_in_time(forward, topology, make_collective(name, topology.num_ranks, chunks, root),
                                  size_bytes, "rooted", rule=rule) for forward in forwards for rule in REDUCE_RULES]
        return min(booked, key=lambda s: max((t.end_us for t in s.transfers), default=0.0))
    return broadcast(topology, chunks, size_bytes, root)


def star_tree(topology: Topology, root: int) -> list[Edge] | None:
    """One chunk's out-tree in the fewest alphas on NVSwitch nodes, or None where the network does not reach
    every node's entry from the root: the root sends across first, to the GPU at its own place in each other
    node, then straight to every GPU of its node, and each entry straight to the rest of its node. Two alphas of
    any route, against a Latin square's three (2 x dgx2 Broadcast 1 KB: 3.155 us against 3.447, the direct
    bound 2.950: below 2.95 us every far GPU would need its own copy through the root's NIC, 3.911 us)."""
    g = topology.gpus_per_node
    if node_trees(topology).kind != "star" or g < 2:
        return None
    base = root - root % g
    entries = [n * g + root % g for n in range(topology.num_nodes) if n * g != base]
    if any(topology.link(root, e) is None for e in entries):
        return None
    tree = [(root, e) for e in entries]
    for head in [root] + entries:
        first = head - head % g
        tree += [(head, first + u) for u in range(g) if first + u != head]
    return tree


def _latency_regime(topology: Topology, tree: list[Edge], size_bytes: float) -> bool:
    """Whether a one-chunk ``tree`` keeps its busiest link or port busy for no longer than the alphas of its
    deepest path (two hops): where the star is worth trying (2 x dgx2 at 1 KB: 0.2 us of bytes against 2.95 us of
    alphas; at 64 KB 13 us, where pipelines win)."""
    busy_us = load_bound_us(tree, topology, size_bytes, latency=False)
    return busy_us <= sum(topology.link(*edge).alpha_us for edge in tree[:1] + [tree[-1]])


def _square_broadcast(topology: Topology, chunks: int, size_bytes: float, root: int) -> Schedule:
    """Broadcast on one NVSwitch node as the root's Latin square (:func:`one_node_square`), every sender's sends
    in the order of their slots."""
    peers = one_node_square(topology, "broadcast", size_bytes, root)
    if peers is None:
        raise InputError("--method", "", f"the rooted Latin square covers Broadcast and Reduce on one NVSwitch node "
                         f"with an odd number of peers, at sizes where a chain's alphas outweigh the square's drain; "
                         f"not {topology.name} at {format_size(size_bytes)}")
    node_trees, _ = _latin_node(root, peers, latin_steps(len(peers)), chunks)
    return list_schedule(topology, make_collective("broadcast", topology.num_ranks, chunks, root),
                         [tuple(topology.link_index[e] for e in edges) for edges, _ in node_trees], size_bytes,
                         "rooted", rank=np.array([r for _, rank in node_trees for r in rank]), rule="sequence",
                         channels=PLAN_CHANNELS, notes={"plan": f"{LABEL}{SQUARE}/c{chunks}"})


def _star_broadcast(topology: Topology, chunks: int, size_bytes: float, root: int) -> Schedule:
    """Broadcast of one chunk down :func:`star_tree`, every sender's sends in the tree's order."""
    tree = star_tree(topology, root)
    if tree is None or chunks != 1:
        raise InputError("--method", "", f"the rooted star covers one chunk on NVSwitch nodes the network joins "
                         f"GPU to GPU, not {chunks} chunk(s) on {topology.name}")
    return list_schedule(topology, make_collective("broadcast", topology.num_ranks, 1, root),
                         [tuple(topology.link_index[e] for e in tree)], size_bytes, "rooted",
                         rank=np.arange(len(tree), dtype=float), rule="sequence",
                         notes={"plan": f"{LABEL}{STAR}"})


def chain_paths(topology: Topology, collective: str, chunks: int, root: int, fused: bool = False
                ) -> list[list[Edge]] | None:
    """Broadcast or Reduce on two NVSwitch nodes as chains, the edges of each chunk (Reduce: a path towards the
    root; Broadcast: a tree from it, parents first), or None where the machine is not two NVSwitch nodes.
    ``fused``: Broadcast's chains as their fused lowering holds them (:func:`_broadcast_chains`).

    Reduce (:func:`_reduce_chains`): chunk ``c`` takes rail ``c mod R``; in the far node its partial sum goes round
    the node's ring (GPU ``u`` to ``u + 1``) from the GPU after the rail's sender to the sender and crosses; the
    root's node sends every chunk round one ring to the root, which the rail's partial sum joins at its entry. Every
    GPU but the entries and the root receives one partial sum of a chunk and sends one, so no receiver waits for
    one partial sum before it may take another, which a tree's reductions do (the reversed Latin squares and spreads
    ran 4-13% faster than they planned and stalled their NICs: 2 x dgx2 Reduce 1 GB, 77.6-82.9% of the limit); an
    entry takes the rail's partial sum from its NIC, not through its switch port. Broadcast:
    :func:`_broadcast_chains`."""
    if normalize_name(collective) == "broadcast":
        return _broadcast_chains(topology, chunks, root, one_ring=fused)
    return _reduce_chains(topology, chunks, root)


def _broadcast_chains(topology: Topology, chunks: int, root: int, one_ring: bool = False
                      ) -> list[list[Edge]] | None:
    """Broadcast's chains (:func:`chain_paths`): the root hands chunk ``c`` to the sender of rail ``c mod R``,
    which sends it across at once and round the rest of the root's node (GPU ``u`` to ``u - 1``, skipping the
    root); the rail's entry sends it round its node. Every GPU takes a chunk once and passes it on through its
    switch port at most once (the sender also through its NIC), so every port serves one chunk per chunk, and
    a rail's first chunk waits for one hop, not fifteen: when each chunk went round the root's node before it
    crossed, 2 x dgx2 Broadcast 1 GB simulated at 96.3% of the limit; crossing at once, 98.2%.

    ``one_ring``: every chunk goes round one ring of the root's node from the root (GPU ``u`` to ``u - 1``), and
    the rail's sender sends it across as it passes. The root then sends through its switch port to one peer only:
    handing out to eight, each send waits for the one before it through the port and for the root's own copy, a
    ``nop`` step each, and 2048 chunks overflow the XML reader (4,450 elements); round one ring they fit fused,
    98.7% of the limit simulated (1024 chunks crossing at once: 98.2%)."""
    routes = RootedRoutes(topology, root)
    g, n0 = routes.g, root // routes.g
    if routes.k != 2 or routes.nodes.kind != "star" or g < 3:
        return None

    def ring(start: int, skip: int) -> list[Edge]:
        """Round ``start``'s node downwards from ``start``, leaving out ``skip``."""
        others = [v for v in (start - start % g + (start % g - k) % g for k in range(1, g)) if v != skip]
        return list(zip([start] + others, others))

    paths = []
    for c in range(chunks):
        sender, entry = routes.rails[c % len(routes.rails)][n0]
        if one_ring:
            paths.append(ring(root, root) + [(sender, entry)] + ring(entry, entry))
            continue
        path = [] if sender == root else [(root, sender)]
        paths.append(path + [(sender, entry)] + ring(sender, root) + ring(entry, entry))
    return paths


def _reduce_chains(topology: Topology, chunks: int, root: int) -> list[list[Edge]] | None:
    """Reduce's chains (:func:`chain_paths`): in the far node chunk ``c``'s partial sum goes round the node's ring
    from the GPU after the sender of rail ``c mod R`` to the sender and crosses; in the root's node every chunk goes
    round one ring, from the GPU after the root to the root, and the rail's partial sum joins it at the rail's
    entry (the root's own rail: at the root). Edges: the far node's, the crossing, then the root node's ring.

    Every GPU of the root's node then sends to one peer and receives from one (and from its NIC), so no switch
    port waits for another: when each rail's partial sum went round the root's node from its entry, eight GPUs
    took turns at the root's port, and a send waiting there held its GPU's port too (2 x dgx2 Reduce 1 GB, 2048
    chunks: 89.5% of the limit planned, 98.5% this way); and the ring's partial sums come from the start, not
    after the crossing."""
    routes = RootedRoutes(reverse_topology(topology), root)
    g, n0 = routes.g, root // routes.g
    if routes.k != 2 or routes.nodes.kind != "star" or g < 3:
        return None

    def after(u: int) -> int:
        return u - u % g + (u % g + 1) % g

    ring = [root - root % g + (root % g + k) % g for k in range(1, g)] + [root]
    near = list(zip(ring, ring[1:]))
    paths = []
    for c in range(chunks):
        entry, sender = routes.rails[c % len(routes.rails)][n0]     # on the reversed machine: root side, far side
        u, path = after(sender), []
        while u != sender:
            path.append((u, after(u)))
            u = after(u)
        paths.append(path + [(sender, entry)] + near)
    return paths


def _rail_last(schedule: Schedule, topology: Topology) -> Schedule:
    """``schedule`` with every transfer over a rail numbered after the others of its chunk where they meet: a
    Reduce's receive over the rail after the node's partial sum at the rail's entry, a Broadcast's send over the rail
    after the node's send at the rail's sender.

    The fused lowering forwards a chunk from its last receive to its first send after it (in step order), and the
    chunks of one channel share their threadblocks only where they are forwarded alike: along the node's ring. The
    booking numbers them the other way now and then (2 of 2048 chunks of 2 x dgx2 Reduce 1 GB; Broadcast 256 MB),
    and such a chain cannot share its channel: the lowering unfused it, and the rest one by one, to plain steps that
    did not fit. Times are kept; the step is the one after the others'; where the chunk's next transfer leaves
    before that, a Broadcast's chunk goes on in the far node that much later, a Reduce's rail takes the others'
    latest step if it can."""
    transfers = list(schedule.transfers)
    leaves: dict[tuple[int, int], int] = {}     # (rank, chunk) -> the first step a transfer of it leaves there
    meets: dict[tuple[str, int, int], list[int]] = {}
    of_chunk: dict[int, list[int]] = {}
    for k, t in enumerate(transfers):
        leaves[(t.src, t.chunk)] = min(leaves.get((t.src, t.chunk), t.step), t.step)
        of_chunk.setdefault(t.chunk, []).append(k)
        meets.setdefault(("into", t.dst, t.chunk), []).append(k)
        meets.setdefault(("from", t.src, t.chunk), []).append(k)
    for (way, rank, chunk), ks in meets.items():
        rail = [k for k in ks if topology.node_of(transfers[k].src) != topology.node_of(transfers[k].dst)]
        if len(ks) < 2 or len(rail) != 1:
            continue
        t = transfers[rail[0]]
        others = [k for k in ks if k != rail[0]]
        latest = max(transfers[k].step for k in others)
        after = leaves.get((t.dst, chunk), latest + 2)    # the chunk's next transfer must stay after it
        if t.step > latest:
            continue
        if latest + 1 < after:
            transfers[rail[0]] = replace(t, step=latest + 1)
        elif way == "from":
            # a Broadcast's chunk goes on in the far node a step later, all of it (so after the rail still)
            shift = latest + 2 - after
            far = topology.node_of(t.dst)
            for k in of_chunk[chunk]:
                if topology.node_of(transfers[k].src) == far:
                    transfers[k] = replace(transfers[k], step=transfers[k].step + shift)
            transfers[rail[0]] = replace(t, step=latest + 1)
        elif latest < after:
            transfers[rail[0]] = replace(t, step=latest)
    return replace(schedule, transfers=tuple(transfers), steps=max(u.step for u in transfers) + 1)


def _chain_slots(topology: Topology, paths: list[list[Edge]]) -> tuple[list[int], int, float]:
    """Where each path crosses between the nodes, how many rails the paths cross on, and a rail's time per chunk
    in slots (a chunk through a switch port)."""
    cross = [next(h for h, (u, v) in enumerate(path) if topology.node_of(u) != topology.node_of(v))
             for path in paths]
    link, node_link = topology.link(*paths[0][cross[0]]), _node_link(topology, paths[0])
    port_GBps = topology.port_capacity()
    nic_slots = node_link.capacity_GBps / min([link.capacity_GBps] + [port_GBps[p] for p in link.ports])
    return cross, len({path[h] for path, h in zip(paths, cross)}), nic_slots


def _node_link(topology: Topology, path: list[Edge]):
    """The first link of ``path`` inside a node (an NVSwitch's: a chunk through a switch port is a slot)."""
    return topology.link(*next(e for e in path if topology.node_of(e[0]) == topology.node_of(e[1])))


def _fitting_channels(paths: list[list[Edge]], counts: tuple[int, ...]) -> tuple[int, ...]:
    """Those of ``counts`` whose threadblocks hold the busiest connection of ``paths`` (the executor's steps per
    threadblock; the largest count where none does): the channels the lowering cuts it into."""
    longest = max(Counter(e for path in paths for e in path).values())
    return tuple(k for k in counts if k * max_steps("executor") >= longest) or counts[-1:]


def _chain(topology: Topology, collective: str, chunks: int, size_bytes: float, root: int,
           fused: bool = False) -> Schedule | None:
    """Broadcast or Reduce along :func:`chain_paths`, ranked by when each hop is due if every rail crosses back to
    back (the rail's k-th chunk after k rail times, each hop in a node a slot) and booked by
    :data:`CHAIN_RULES`. Broadcast is timed as its plain lowering runs on the channels its long connections need
    (:func:`synth.schedule.list_scheduler.list_schedule` with ``cut="position"``): the relays go as their chunks
    come, and the plan is what runs (2 x dgx2 Broadcast 1 GB: planned and simulated 98.2% of the limit; timed in
    each port's order, 83.7% planned)."""
    name = normalize_name(collective)
    paths = chain_paths(topology, name, chunks, root, fused)
    if paths is None:
        return None
    cross, rails, nic_slots = _chain_slots(topology, paths)
    g = topology.gpus_per_node
    slot_us = size_bytes / chunks / (_node_link(topology, paths[0]).capacity_GBps * BYTES_PER_US_PER_GBPS)
    coll = make_collective(name, topology.num_ranks, chunks, root)
    route_links = [tuple(topology.link_index[e] for e in path) for path in paths]
    notes = {"plan": f"{LABEL}chain/c{chunks}", "rails": rails}
    if name == "broadcast":
        # the root hands out a chunk per rail time and rail, each rail's in turn; a hop is due when its sender has
        # the chunk
        rank = []
        for c, path in enumerate(paths):
            have = {root: (c // rails + c % rails / rails) * nic_slots}
            for u, v in path:
                rank.append(have[u])
                have[v] = have[u] + (nic_slots if topology.node_of(u) != topology.node_of(v) else 1.0)
        channels = _fitting_channels(paths, CHAIN_CHANNELS + (MAX_CHANNELS,))
        if fused:
            notes["plan"] += "/fused"
        booked = list_schedule(topology, coll, route_links, size_bytes, "rooted", rank=slot_us * np.array(rank),
                               rule=CHAIN_RULES[name], channels=channels[:1] if fused else channels,
                               cut="fused" if fused else "position", notes=notes)
        return _rail_last(booked, topology) if fused else booked
    # the far node's hops are due one slot apart up to the rail's crossing, the rail's c-th chunk after c rail
    # times; in the root's node the hop into the entry is due as the rail's partial sum arrives there, the others a
    # slot apart before and after it
    rank = []
    for c, (path, x) in enumerate(zip(paths, cross)):
        crossing = c // rails * nic_slots + g - 1
        ring = [path[x + 1][0]] + [v for _, v in path[x + 1:]]
        at = ring.index(path[x][1])
        rank += [crossing - x + h for h in range(x + 1)]
        rank += [crossing + nic_slots + k - at for k in range(len(path) - x - 1)]
    timing = dict(channels=_fitting_channels(paths, CHAIN_CHANNELS + (MAX_CHANNELS,))[:1], cut="fused") if fused \
        else dict(channels=CHAIN_CHANNELS)
    if fused:
        notes["plan"] += "/fused"
    booked = list_schedule(topology, coll, route_links, size_bytes, "rooted", rank=slot_us * np.array(rank),
                           rule=CHAIN_RULES[name], notes=notes, **timing)
    return _rail_last(booked, topology)


def _broadcast(topology: Topology, chunks: int, size_bytes: float, root: int, far_squares: bool = True
               ) -> Schedule:
    """Broadcast booked in sequence: every sender's sends through one port go chunk by chunk, and within a chunk
    in its tree's order (``far_squares``: see :func:`latin_trees`)."""
    routes = RootedRoutes(topology, root)
    timed = latin_trees(topology, routes, chunks, size_bytes / chunks, far_squares)
    if timed is not None:
        trees = [t.edges for t in timed]
        rank = np.array([r for t in timed for r in t.rank])
    else:
        trees = [routes.tree(c) for c in range(chunks)]
        depth = max(len(t) for t in trees)
        rank = np.array([c * depth + h for c, tree in enumerate(trees) for h in range(len(tree))], dtype=float)
    route_links = [tuple(topology.link_index[e] for e in tree) for tree in trees]
    return list_schedule(topology, make_collective("broadcast", topology.num_ranks, chunks, root), route_links,
                         size_bytes, "rooted", rank=rank, rule="sequence", channels=PLAN_CHANNELS,
                         notes={"plan": f"{LABEL}c{chunks}", "rails": len(routes.rails),
                                "node_trees": routes.nodes.kind})


def _personalised(topology: Topology, name: str, chunks: int, size_bytes: float, root: int, rule: str,
                  own_scale: float = 1.0) -> Schedule:
    """Scatter (Gather: the same paths reversed) booked greedily by ``rule`` (:func:`list_schedule`): the chunks
    for other nodes take turns over the rails, ``own_scale`` x :func:`own_rail_chunks` of them (evenly spaced) over
    the root's."""
    # Gather's paths are Scatter's on the reversed machine (its rails and port bandwidths), taken backwards
    routes = RootedRoutes(reverse_topology(topology) if name == "gather" else topology, root)
    coll = make_collective(name, topology.num_ranks, chunks, root)
    g, n0 = routes.g, root // routes.g
    own = [j for j, rail in enumerate(routes.rails) if rail[n0][0] == root]
    others = [j for j in range(len(routes.rails)) if j not in own] or own
    remote = [r for r in range(topology.num_ranks) if r // g != n0]
    share = math.floor(own_rail_chunks(routes.topology, routes, chunks) * own_scale)
    handed = 0
    route_links, ties = [], []
    for c in coll.chunks:
        (rank,) = c.sources if name == "gather" else c.dest_ranks
        if rank == root:
            route_links.append(())
            continue
        if rank // g == n0:
            rail = others[0]
        else:
            i = remote.index(rank) * chunks + c.id % chunks
            if own and (i * share) % (len(remote) * chunks) < share:
                rail = own[0]
            else:
                rail, handed = others[handed % len(others)], handed + 1
        edges = routes.path(rank, rail)
        # ties go piece by piece, each piece to (from) the ranks in turn, hop by hop
        turn = [c.id % chunks * topology.num_ranks + rank + h / 2 for h in range(len(edges))]
        if name == "gather":
            edges = [(v, u) for u, v in reversed(edges)]
            turn = [-t for t in reversed(turn)]
        route_links.append(tuple(topology.link_index[e] for e in edges))
        ties += turn
    return list_schedule(topology, coll, route_links, size_bytes, "rooted", rank=np.array(ties), rule=rule,
                         notes={"plan": f"{LABEL}c{chunks}/{rule}/o{own_scale:g}", "rails": len(routes.rails),
                                "own_rail_chunks": share})


def chunk_options(topology: Topology, collective: str, size_bytes: float, root: int | None = None,
                  target: str = "executor") -> tuple[int, ...]:
    """Chunk counts worth trying (powers of two, at most :data:`MAX_CHUNKS`).

    A chunk's trip (down the root's node, across a rail, down the other node) should cost at most
    :data:`PIPELINE_SHARE` of the bound. As a Latin square (:func:`latin_trees`) the fewest chunks for that, half and
    a quarter of them: its connections keep their order over channels (2 x dgx-h100 Broadcast 1 GB: 95.2% of the
    limit simulated with 256 chunks, 97.4% with 512, 98.4% with 1024; 2 x dgx2: 93.3% with 256, 91.5% with 512).
    On other NVSwitch nodes: the most for which the root's busiest hand-out connection holds at most half the
    target's steps per threadblock (a send and its dependency ``nop`` each), so the program fits one channel, which
    keeps every connection's order (spread over channels, 2 x dgx-h100 Broadcast 1 GB with 256 chunks simulated at
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
    most = most_chunks(topology, routes, size_bytes, rail_channels=1)
    while 2 * c <= most and trip_us / c > PIPELINE_SHARE * bound:
        c *= 2
    if not star:
        return tuple(sorted({c, max(1, c // 4)}))
    peers = latin_peers(routes)
    if peers is not None:     # its connections keep their order over channels
        # down to 16 chunks, a chunk through a switch port takes at least 1.5 times a forward's latency, which
        # each forward adds (2 x dgx-h100 Broadcast 64 MB: 86.0% of the limit simulated with 128 chunks, 72.9%
        # with 256; 1 MB: 8.0 us with 16 chunks, 23.6 us with 2)
        link = topology.link(root, peers[0])
        sms = topology.sms_per_gpu or math.inf
        while c > LATENCY_BOUND_CHUNKS and \
                (size_bytes / c < 1.5 * link.alpha_us * link.capacity_GBps * BYTES_PER_US_PER_GBPS
                 or latin_threadblocks(len(peers), c, target) > sms):
            c //= 2
        options = {c, max(1, c // 2), max(1, c // 4)}
        if c == LATENCY_BOUND_CHUNKS:
            # where latency trims it to its floor, 2 and 4 times as many chunks too, as many as the FIFOs of a rail
            # connection spread over max(PLAN_CHANNELS) channels hold (the writer lowers on such spreads, and a
            # Broadcast is timed on them): the rails stay busy, and the simulator picks (2 x dgx-h100 1 MB:
            # Broadcast 8.01 us with 16 chunks, 6.60 us with 64, planned at 6.44; Reduce 7.86 us, 6.33 us as
            # planned; 2 x dgx2 Reduce 22.17 us, 18.24 with 32 as planned, 20.32 with 64, planned at 17.76)
            wide = most_chunks(topology, routes, size_bytes, rail_channels=max(PLAN_CHANNELS))
            options |= {k for k in (2 * c, 4 * c) if k <= wide and latin_threadblocks(len(peers), k, target) <= sms}
        return tuple(sorted(options))
    while c > 1 and _busiest_hand_out(routes, c) > max_steps(target) // 2:
        c //= 2
    return tuple(sorted({c, max(1, c // 2)}))


def latin_threadblocks(peers: int, chunks: int, target: str) -> int:
    """Threadblocks a GPU of a Latin square (:func:`latin_trees`) needs at least, roughly: each peer connection
    carries about ``chunks / peers`` messages each way, a step and its port-order dependency ``nop`` each, and a
    threadblock holds the target's steps per threadblock (2 x dgx2, 80 SMs: 1024 chunks, 90 by this count, were
    refused at 229 after half a minute of lowering; 512, 60 by it, fit)."""
    per_connection = math.ceil(2 * math.ceil(chunks / peers) / max_steps(target))
    return 2 * peers * per_connection


def most_chunks(topology: Topology, routes: RootedRoutes, size_bytes: float, cap: int = MAX_CHUNKS,
                rail_channels: int = 0) -> int:
    """The most chunks worth making at ``size_bytes``: no more than 4-byte elements (the runtime selects the
    program only where the chunks divide the count), at most ``cap``, and few enough that the
    runtime's FIFO of messages on a rail covers its latency (a connection holds :data:`RUNTIME_FIFO_DEPTH`
    messages, so smaller ones leave the NIC waiting for the receiver; when this was written, 2 x dgx-h100 Reduce
    1 MB with 64 chunks planned 6.3 us and simulated 11.4 us, and with 16, 7.9 us both; spread over channels, as
    ``rail_channels`` counts, 64 chunks now run as planned, 6.33 us). ``rail_channels`` (0: not counted): chunk ``c``
    crosses on rail ``c mod R`` (the compositions' trees and Latin squares), so a rail carries ``1 / R`` of them,
    spread over this many channels (a FIFO each), and while that is no more than its FIFOs hold none waits,
    however small: up to ``R`` times the depth times the channels (2 x dgx-h100 Broadcast 64 KB: 4.93 us with one
    chunk, 3.49 us with 16)."""
    n0 = routes.root // routes.g
    rail_bytes = max(link.alpha_us * link.capacity_GBps * BYTES_PER_US_PER_GBPS
                     for link in (topology.link(*rail[n0]) for rail in routes.rails))
    in_flight = RUNTIME_FIFO_DEPTH * size_bytes / rail_bytes
    if rail_channels:
        in_flight = max(in_flight, RUNTIME_FIFO_DEPTH * len(routes.rails) * rail_channels)
    most = min(cap, size_bytes // ELEMENT_BYTES, in_flight)
    c = 1
    while 2 * c <= most:
        c *= 2
    return c


def chain_chunk_options(topology: Topology, collective: str, size_bytes: float, root: int | None = None,
                        chunks: int | None = None) -> tuple[int, ...]:
    """Chunk counts for chains (:func:`chain_paths`), or none: they are offered where some GPUs carry no rail
    (2 x dgx2 1 GB: Reduce 95.4% of the limit simulated as chains of 1024 chunks, at most 79.6% as reversed Latin
    squares; Broadcast 98.2% against 93.3%; 2 x dgx-h100, a NIC per GPU: Reduce 81.3% against 98.7%), and only as
    long pipelines: the fewest chunks for which the chain's fill and drain (round both nodes, and one crossing)
    cost at most :data:`CHAIN_FILL_SHARE` of the rails' time (the user's ``chunks``: that count), and twice as many
    where :data:`CHAIN_MOST_CHUNKS` allows (fused; 2 x dgx2 Reduce 1 GB: 98.5% of the limit simulated with 2048
    chunks, 97.1% with 1024). Half of them simulated slower everywhere measured (2 x dgx2 64 MB: Broadcast 95.2% against
    97.0%, Reduce 91.1% against 94.2%; 1 GB: Broadcast 96.3% against 98.2%)."""
    root = root or 0
    g = topology.gpus_per_node
    paths = chain_paths(topology, collective, g, root)     # a chunk on every rail
    if paths is None:
        return ()
    _, rails, nic_slots = _chain_slots(topology, paths)
    if rails >= g:
        return ()
    if chunks:
        return (chunks,)
    fill_slots = 2 * (g - 1) + nic_slots
    routes = RootedRoutes(topology, root)
    most = most_chunks(topology, routes, size_bytes)
    c = 1
    while 2 * c <= most and fill_slots > CHAIN_FILL_SHARE * c / rails * nic_slots:
        c *= 2
    if fill_slots > CHAIN_FILL_SHARE * c / rails * nic_slots:
        return ()
    node_link = _node_link(topology, paths[0])
    slot_us = size_bytes / (2 * c) / (node_link.capacity_GBps * BYTES_PER_US_PER_GBPS)
    finer = slot_us >= CHAIN_FINER_ALPHAS * node_link.alpha_us and \
        2 * c <= most_chunks(topology, routes, size_bytes, CHAIN_MOST_CHUNKS)
    return (c, 2 * c) if finer else (c,)


def _busiest_hand_out(routes: RootedRoutes, chunks: int) -> int:
    """Messages on the root's busiest connection with ``chunks`` chunks."""
    return max(Counter((u, v) for c in range(chunks) for u, v in routes.tree(c) if u == routes.root).values())


def synthesize_rooted(topology: Topology, collective: str, size_bytes: float, root: int | None = None,
                      target: str = "executor", chunks: int | None = None) -> list[RootedCandidate]:
    """Every composition of :func:`chunk_options` (Reduce: chains of :func:`chain_chunk_options` instead where it
    offers any; the user's ``chunks``: both), replayed, fastest first. Scatter and
    Gather: :data:`PERSONALISED_CHUNKS` booked by each of :data:`PERSONALISED_RULES` with each of
    :data:`OWN_RAIL_SCALES`, the :data:`PERSONALISED_KEPT` fastest by replay (the greedy booking is erratic: 2 x
    dgx2 Gather 1 GB with 16 chunks replays at 75% of the limit by ``work`` with the balanced share on the root's
    rail, at 97% by ``tail`` with 3/4 of it)."""
    name = normalize_name(collective)
    if topology.num_nodes == 1:
        square = one_node_square(topology, name, size_bytes, root or 0) is not None
        plans = [(c, "sequence", 1.0, SQUARE) for c in ((chunks,) if chunks else SQUARE_CHUNKS) if square]
    elif name in PERSONALISED:
        # (a rail carries chunks for several ranks, one connection each: the FIFO bound is on the whole size)
        most = most_chunks(topology, RootedRoutes(topology, root or 0), size_bytes)
        counts = (chunks,) if chunks else tuple(sorted({min(c, most) for c in PERSONALISED_CHUNKS}))
        plans = [(c, rule, f, "trees") for c in counts for rule in PERSONALISED_RULES for f in OWN_RAIL_SCALES]
    else:
        # where chains are offered the trees lost everywhere measured (2 x dgx2 Reduce 64 MB: chains 94.2% of the
        # limit simulated, trees at most 90.0%; 1 GB: 93.4% against 79.6%), so they are not composed (a user's
        # chunk count gets both)
        # Reduce's chains timed both ways (each port in order, or as the fused lowering runs them): neither plan is
        # the faster file everywhere (2 x dgx2 1 GB: 93.4% of the limit simulated against 95.4%; 64 MB: 94.2%
        # against 92.1%)
        # (more chunks than MAX_CHUNKS fit only fused)
        chained = chain_chunk_options(topology, name, size_bytes, root, chunks)
        designs = CHAIN_DESIGNS if name == "reduce" else CHAIN_DESIGNS[:1]
        plans = [(c, "sequence", 1.0, design) for c in chained
                 for design in (designs if c <= MAX_CHUNKS else CHAIN_DESIGNS[1:])]
        if chunks or not chained:
            plans += [(c, "sequence", 1.0, "trees") for c in ((chunks,) if chunks else
                                                              chunk_options(topology, name, size_bytes, root, target))]
        star = star_tree(topology, root or 0)
        if star is not None and (chunks == 1 or (chunks is None and _latency_regime(topology, star, size_bytes))):
            plans.append((1, "sequence", 1.0, STAR))
    found = []
    for c, rule, f, design in plans:
        t0 = time.perf_counter()
        schedule = compose(topology, name, c, size_bytes, root, rule, f, design)
        report = verify(schedule, topology, size_bytes)
        found.append(RootedCandidate(c, schedule, report, time.perf_counter() - t0, rule, f, design))
    found.sort(key=lambda r: r.report.time_us)
    return found[:PERSONALISED_KEPT] if name in PERSONALISED else found
