"""Hierarchical synthesis for multi-node machines: solve one rail and one node, map them everywhere, pipeline.

A machine of ``K`` nodes of ``G`` GPUs (``rank = node * G + local``) splits into two small problems, each solved
once for a representative and mapped onto its isomorphic copies by the machine's symmetry (DESIGN section 6,
SyCCL-style):

* the **rail** problem: GPU ``i`` of every node, ``K`` ranks joined by their NICs (the link ``(n, i) -> (m, i)``:
  a NIC-to-NIC path of the network switch, or the rail's leaf switch). Solved for one origin node as an
  out-tree over nodes (:class:`RailShape`: ``direct``, every node straight from the origin, or ``ring``, a chain
  through the nodes) and rotated to every origin and every rail;
* the **node** problem: the ``G`` GPUs of one node. Solved once as an out-tree per local origin (a star where
  the node has a link from every GPU to every other, as on an NVSwitch; else fewest-hop trees over the widest
  links) and mapped to every node.

A chunk of Allgather that starts on ``(n, i)`` follows the rail tree of rail ``i`` from node ``n``, and every GPU
it reaches on that rail spreads it through its node with the node tree of local origin ``i``. ReduceScatter
collects along the same tree reversed (node first, then rail), booked greedily or as the Allgather's booking
run backwards (``HierarchyPlan.reversal``); Allreduce collects into the chunk's owner and spreads from there.
Where the node ports, not the NICs, bind (two nodes of an NVSwitch machine), some pieces also go NIC to NIC onto
another rail (:func:`cross_pieces`) so both finish together. Alltoall goes PXN-style:
from ``(n, i)`` to ``(m, j)`` first over the node to ``(n, j)``, then over rail ``j`` (or rail first, then
node), in Latin-square rounds that give every NIC one block per round (:meth:`HierarchyRoutes.explicit`).

**Pipelining.** Each rank's data is cut into ``C`` chunks (pieces); the transfers are ordered by a
first-come-first-served alpha-beta replay at the request's size
(:func:`synth.synthesis.baselines.plans.order_plans`), so the node phase of one piece overlaps the rail phase
of the next, and rail edges go first among transfers ready together (the NICs are the scarce resource). ``C``
is chosen from the size and from the runtime's budget of steps per threadblock (:func:`piece_options`): the
busiest connection carries about ``K * C`` messages, so a GPU needs only ``G - 1`` node peers and its rail
peers, and the program fits the runtime at scale.

The compositions are independent and may run on an executor (a process pool or Dask,
:func:`synthesize_hierarchy`). Each composed :class:`~synth.schedule.ir.Schedule` is replayed
(:func:`synth.schedule.replay.verify`) like any other candidate; ``synth solve`` then writes it through the
verified writer and the simulator decides."""

from __future__ import annotations

import math
import time
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from backends.msccl.fit import hopeless
from backends.msccl.limits import MAX_TBS_PER_CHANNEL_DIRECTION, max_steps
from synth.errors import BackendError, InputError
from synth.model.collectives import make_collective, normalize_name
from synth.model.topology import Topology, reverse_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.ir import Schedule, Transfer, collective_size
from synth.schedule.list_scheduler import PLAN_CHANNELS, list_schedule, retime
from synth.schedule.transforms import concatenate_schedules, reverse_schedule
from synth.schedule.replay import ReplayReport, verify
from synth.solver.deadline import UNBOUNDED, Deadline
from synth.synthesis.baselines.plans import Edge, Routes, check_links, order_plans, plan_collective
from synth.text_enum import TextEnum

COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
# Channels a connection may be spread over without running out of the GPU's SMs: the busiest connection's
# messages must fit this many threadblocks of the target's steps (backends.msccl.limits.max_steps).
SPREAD_CHANNELS = 4
# Transfers a composed program may hold beyond one piece per rank: writing and checking it costs about half a
# millisecond per transfer on one core, so 2 pieces per rank still fit 32 nodes of 8 GPUs (130,560 transfers for
# Allgather, 3% faster than one piece) in the command's default five minutes, and more are not worth their time.
MAX_TRANSFERS = 1 << 17
# The last piece's spread through its node (the pipeline's tail) should cost at most this share of the
# collective's pipelined time; more pieces only add messages.
PIPELINE_SHARE = 0.02
MAX_PIECES = 32


class RailShape(TextEnum):
    """How a chunk crosses the nodes on its rail."""

    DIRECT = "direct"    # the origin's GPU sends to the same GPU of every other node (K - 1 NIC sends)
    RING = "ring"        # a chain through the nodes: each GPU forwards to the next node's (1 NIC peer)


class AlltoallOrder(TextEnum):
    """Which hop a PXN-style Alltoall chunk takes first."""

    NODE_FIRST = "node-first"   # (n, i) -> (n, j) over the node, then rail j to (m, j)
    RAIL_FIRST = "rail-first"   # (n, i) -> (m, i) over rail i, then the node to (m, j)


@dataclass(frozen=True)
class HierarchyPlan:
    """One composition: the rail shape, the Alltoall hop order and the pieces per rank (chunks per rank)."""

    rail: RailShape
    pieces: int
    alltoall: AlltoallOrder = AlltoallOrder.NODE_FIRST
    cross: int = 0
    # ReduceScatter as the time-reversal of the Allgather composed on the reversed machine: its pieces pipeline
    # as the Allgather's do (32 x dgx-h100 on rails, ring, 2 pieces: 98.7% of the limit replayed, where the
    # greedy booking of the collecting trees gains nothing over one piece, 95.3%); where NICs are shared (4 x dgx2)
    # the greedy booking is the faster, so both are tried (which first at a tie: see hierarchy_plans)
    reversal: bool = False

    def label(self, collective: str) -> str:
        """How reports name the composition (the hop order for Alltoall, the rail shape otherwise)."""
        shape = self.alltoall if normalize_name(collective) == "alltoall" else self.rail
        return (f"hierarchy/{shape}/c{self.pieces}" + (f"/x{self.cross}" if self.cross else "")
                + ("/reversed" if self.reversal else ""))

    def crosses(self, index: int) -> bool:
        """Whether piece ``index`` of a shard also goes from its origin's NIC straight to one other-rail GPU of
        every other node (``cross`` of the ``pieces``, evenly spaced), which then takes no copy from its node."""
        return (index * self.cross) % self.pieces < self.cross


@dataclass(frozen=True)
class NodeTrees:
    """Out-trees of one node (local ranks ``0..G-1``), one per local origin, solved once for every node.

    ``edges[i]`` lists the tree's local edges from origin ``i``, parents before children.
    """

    edges: tuple[tuple[Edge, ...], ...]
    kind: str


def node_trees(topology: Topology) -> NodeTrees:
    """The node's out-tree per local origin, from node 0's own links (every node is a copy of it).

    A star when every GPU has a link to every other (an NVSwitch): the origin sends to each peer, the peers in
    rotated order so that origins start on different peers. Otherwise fewest hops over the widest links
    (a breadth-first tree that, among parents at the same depth, takes the highest-capacity link).
    """
    g = topology.gpus_per_node
    local = [[topology.link(u, v) for v in range(g)] for u in range(g)]
    if all(local[u][v] is not None for u in range(g) for v in range(g) if u != v):
        return NodeTrees(tuple(tuple((i, (i + k) % g) for k in range(1, g)) for i in range(g)), "star")
    trees = []
    for origin in range(g):
        depth, edges, frontier = {origin: 0}, [], [origin]
        while frontier:
            nxt = []
            for v in range(g):
                if v in depth:
                    continue
                parents = [u for u in frontier if local[u][v] is not None]
                if parents:
                    u = max(parents, key=lambda p: (local[p][v].capacity_GBps, -p))
                    depth[v] = depth[u] + 1
                    edges.append((u, v))
                    nxt.append(v)
            frontier = nxt
        if len(depth) != g:
            raise InputError(topology.source, "links", f"node 0 of {topology.name} is not connected inside "
                             "(local rank {origin} reaches {len(depth)} of {g}); hierarchy needs every node "
                             "connected")
        trees.append(tuple(edges))
    return NodeTrees(tuple(trees), "fewest-hop trees")


def rail_tree(shape: RailShape, origin: int, num_nodes: int) -> list[Edge]:
    """Node-level out-tree of one rail from ``origin`` (edges between node indices, parents first), the same
    for every origin up to the node rotation.

    >>> rail_tree(RailShape.DIRECT, 1, 4), rail_tree(RailShape.RING, 1, 4)
    ([(1, 2), (1, 3), (1, 0)], [(1, 2), (2, 3), (3, 0)])
    """
    others = [(origin + k) % num_nodes for k in range(1, num_nodes)]
    if shape == RailShape.DIRECT:
        return [(origin, m) for m in others]
    chain = [origin] + others
    return list(zip(chain, chain[1:]))


class HierarchyRoutes(Routes):
    """Routes of a composed machine from one rail tree and one node tree per origin (see the module doc)."""

    def __init__(self, topology: Topology, plan: HierarchyPlan, nodes: NodeTrees):
        self.topology = topology
        self.plan = plan
        self.nodes = nodes
        self.g = topology.gpus_per_node
        self.k = topology.num_nodes

    def rank(self, node: int, local: int) -> int:
        return node * self.g + local

    def _node_edges(self, node: int, local: int) -> list[Edge]:
        base = node * self.g
        return [(base + u, base + v) for u, v in self.nodes.edges[local]]

    def spread(self, origin, index):
        node, local = divmod(origin, self.g)
        rail = rail_tree(self.plan.rail, node, self.k)
        edges = [(self.rank(a, local), self.rank(b, local)) for a, b in rail]
        skip = {}
        if self.plan.crosses(index):       # a second NIC copy to GPU j of node m spares one node edge there
            turn = (index * self.plan.cross) // self.plan.pieces
            for _, m in rail:
                skip[m] = self.rank(m, (local + 1 + (turn + m) % (self.g - 1)) % self.g)
                edges.append((origin, skip[m]))
        for m in [node] + [b for _, b in rail]:
            edges += [e for e in self._node_edges(m, local) if e[1] != skip.get(m)]
        return edges

    def collect(self, root, index):
        return [(v, u) for u, v in reversed(self.spread(root, index))]

    def path(self, src, dst, index):
        (n, i), (m, j) = divmod(src, self.g), divmod(dst, self.g)
        if n == m:
            return self._local_path(n, i, j)
        if i == j:
            return [(src, dst)]
        if self.plan.alltoall == AlltoallOrder.NODE_FIRST:
            return self._local_path(n, i, j) + [(self.rank(n, j), dst)]
        return [(src, self.rank(m, i))] + self._local_path(m, i, j)

    def explicit(self, collective):
        """Alltoall in rounds ``(d, e, piece)``: every GPU ``(n, i)`` sends to ``(n + d, i + e)`` (nodes and
        local ranks modulo K and G), so in each round every NIC sends exactly one block and receives exactly one
        (a Latin square: the ports never wait on each other, where first-come-first-served booking of a NIC's
        egress and the receiver's ingress leaves holes, 73% of the limit on 4 nodes). Each hop of a path takes
        the next step. Other collectives: None (ordered by :func:`order_plans`)."""
        if collective.name != "alltoall":
            return None
        k, g, c, n_ranks = self.k, self.g, collective.chunks_per_rank, collective.num_ranks
        transfers, step = [], 0
        for d in range(k):
            for e in range(g):
                if d == e == 0:
                    continue
                for piece in range(c):
                    depth = 0
                    for src in range(n_ranks):
                        (n, i) = divmod(src, g)
                        dst = self.rank((n + d) % k, (i + e) % g)
                        chunk = (src * n_ranks + dst) * c + piece
                        edges = self.path(src, dst, piece)
                        transfers += [Transfer(chunk, u, v, step + h) for h, (u, v) in enumerate(edges)]
                        depth = max(depth, len(edges))
                    step += depth
        return transfers

    def _local_path(self, node: int, i: int, j: int) -> list[Edge]:
        """The node tree of origin ``i`` down to ``j``, in node ``node``."""
        parent = {v: u for u, v in self.nodes.edges[i]}
        hops = [j]
        while hops[-1] != i:
            hops.append(parent[hops[-1]])
        hops.reverse()
        base = node * self.g
        return [(base + u, base + v) for u, v in zip(hops, hops[1:])]

    def describe(self):
        return {"rail": str(self.plan.rail), "node_trees": self.nodes.kind, "pieces": self.plan.pieces,
                "alltoall": str(self.plan.alltoall)}


def check_applicable(topology: Topology, collective: str) -> None:
    """Raise InputError unless the machine has several nodes and every rail has its NIC-to-NIC links."""
    name = normalize_name(collective)
    if name not in COLLECTIVES:
        raise InputError("--method", "", f"hierarchy covers {', '.join(COLLECTIVES)}, not {name}")
    if topology.num_nodes < 2:
        raise InputError("--method", "", f"hierarchy composes nodes; topology {topology.name} has one (use "
                         "--nodes K)")
    g, k = topology.gpus_per_node, topology.num_nodes
    for m in range(1, k):
        for i in range(g):
            if topology.link(i, m * g + i) is None or topology.link(m * g + i, i) is None:
                raise InputError("--method", "", f"hierarchy needs rail links between GPU {i} of every node; "
                                 f"topology {topology.name} has no link {i}<->{m * g + i}")


def compose(topology: Topology, collective: str, plan: HierarchyPlan, size_bytes: float,
            root: int | None = None, nodes: NodeTrees | None = None) -> Schedule:
    """The composed schedule for ``plan``: chunk routes from the rail and node trees, ordered at ``size_bytes``.

    >>> from synth.model.topology import load_topology
    >>> topo = load_topology("dgx-h100", nodes=2)
    >>> s = compose(topo, "allgather", HierarchyPlan(RailShape.DIRECT, 1), 1 << 20)
    >>> s.collective.num_ranks, len(s.transfers) == 16 * 15
    (16, True)
    """
    name = normalize_name(collective)
    check_applicable(topology, name)
    if plan.reversal:
        return _reversed_allgather(topology, name, plan, size_bytes)
    routes = HierarchyRoutes(topology, plan, nodes or node_trees(topology))
    if runs_in_step(topology, name, routes.nodes):
        return lockstep(topology, name, routes, size_bytes)
    coll = make_collective(name, topology.num_ranks, plan.pieces, root)
    transfers = routes.explicit(coll)
    if transfers is None:
        plans = plan_collective(coll, routes)
        check_links(plans, topology, "hierarchy")
        transfers = order_plans(plans, topology, coll.chunk_bytes(size_bytes))
    steps = 1 + max((t.step for t in transfers), default=-1)
    return Schedule(coll, topology.name, tuple(transfers), steps, method="hierarchy",
                    notes={"hierarchy": routes.describe(), "plan": plan.label(name)})


def _reversed_allgather(topology: Topology, name: str, plan: HierarchyPlan, size_bytes: float) -> Schedule:
    """ReduceScatter as the time-reversal of the Allgather composition on the reversed machine
    (:func:`synth.schedule.transforms.reverse_schedule`): partial sums collect along the Allgather's trees in its
    order backwards, so the rail phase of one piece overlaps the node phase of the next as in the Allgather."""
    if name != "reducescatter":
        raise ValueError(f"a reversed composition is a ReduceScatter, not {name}")
    mirror = reverse_topology(topology)
    dual = compose(mirror, "allgather", replace(plan, reversal=False), size_bytes, None, node_trees(mirror))
    schedule = reverse_schedule(dual, make_collective(name, topology.num_ranks, plan.pieces), topology.name)
    return replace(schedule, method="hierarchy", notes={**dual.notes, "plan": plan.label(name)})


LOCKSTEP = ("allgather", "reducescatter", "allreduce")


def runs_in_step(topology: Topology, collective: str, nodes: NodeTrees) -> bool:
    """Whether a composition is booked in step (:func:`lockstep`): two nodes of an NVSwitch machine, where it was
    measured (2 x dgx2 Allgather 99.7% of the limit, simulated). On more nodes its order is not yet right (4 x
    dgx-h100 on rails: ReduceScatter by ring replayed 2.2x slower than the greedy booking), so there the greedy
    booking stays and the simulator judges it."""
    return nodes.kind == "star" and normalize_name(collective) in LOCKSTEP and topology.num_nodes == 2


# Rounds a GPU's relay of a piece from another node follows its own piece: the piece crosses the NIC meanwhile
# (two GPUs share a NIC on a DGX-2), so the relay never waits for it and the node's GPUs stay in step.
RELAY_LAG = 2


def lockstep_rank(routes: HierarchyRoutes, chunk: int, src: int, dst: int) -> int:
    """Position of the Allgather transfer ``src -> dst`` of ``chunk`` in its sender's sequence of sends through
    one port (its NVSwitch port, or its NIC), the same clock for every GPU.

    Round ``r`` of a GPU's switch port sends its own piece ``r`` and then, for each other node, the piece
    ``r - RELAY_LAG`` its rail brought from there; a star goes to ``i + 1, i + 2, ...`` (local ranks modulo
    ``G``), so in each turn of a round the node's GPUs send to distinct GPUs and no switch port waits for
    another. Its NIC sends piece by piece: the rail copies, then the crossing copies (:meth:`HierarchyPlan.crosses`),
    each its own piece first and then the pieces it relays, in the order the rail brings them (a ring's: the
    nearest node's first; ordered the other way round, or by origin, 32 x dgx-h100 Allgather replayed at 9.9 ms
    for 2.7 ms).
    """
    g, k, c = routes.g, routes.k, routes.plan.pieces
    origin, piece = divmod(chunk, c)
    (n, i), (a, u), (b, v) = divmod(origin, g), divmod(src, g), divmod(dst, g)
    come = (a - n) % k          # rail hops the piece has come (a ring's relays arrive in this order)
    if a != b:                                       # a rail or crossing copy through the NIC
        return ((piece * 2 + (v != i)) * k + come) * k + (b - a) % k
    turn = (v - u) % g
    if a == n:                                       # the origin's own star
        return ((piece * k) * g + turn)
    return ((piece + RELAY_LAG) * k + come) * g + turn


def lockstep(topology: Topology, name: str, routes: HierarchyRoutes, size_bytes: float) -> Schedule:
    """A composition on NVSwitch nodes booked in :func:`lockstep_rank` order, as the runtime runs it
    (:func:`synth.schedule.list_scheduler.list_schedule` with ``rule="sequence"``, the runtime's FIFOs).

    The planned order must be the one the runtime follows, or the plan is not what runs: the runtime serves a
    shared port (a GPU's NVSwitch ingress, a NIC two GPUs share) in the order sends arrive there, and greedy
    booking there left 2 x dgx2 Allgather at 12.5 ms simulated for 8.05 ms planned. In step, the node's
    GPUs never meet at a port. ReduceScatter runs the Allgather's order backwards (partial sums collect along the
    reversed trees); Allreduce is ReduceScatter, then Allgather.
    """
    if name == "allreduce":
        parts = [lockstep(topology, part, routes, size_bytes) for part in ("reducescatter", "allgather")]
        schedule = concatenate_schedules(parts, make_collective(name, topology.num_ranks, routes.plan.pieces),
                                         topology.name)
        # timed as the runtime serves the parts' sends together (2 x dgx2 1 MB: planned 18.7 us, ran 19.4 us)
        return replace(retime(schedule, topology, size_bytes), method="hierarchy", notes=parts[-1].notes)
    coll = make_collective(name, topology.num_ranks, routes.plan.pieces)
    c = routes.plan.pieces
    route_links, ranks = [], []
    for chunk in range(len(coll.chunks)):
        origin, index = divmod(chunk, c)
        edges = routes.spread(origin, index)
        if name == "reducescatter":
            route_links.append(tuple(topology.link_index[(v, u)] for u, v in edges))
            ranks += [-lockstep_rank(routes, chunk, u, v) for u, v in edges]
        else:
            route_links.append(tuple(topology.link_index[e] for e in edges))
            ranks += [lockstep_rank(routes, chunk, u, v) for u, v in edges]
    # timed on the channels the writer lowers on (copies only: 2 x dgx2 Allgather 1 MB planned 11.7 us on one, ran
    # 10.7 us on two, planned so 10.8 us)
    return list_schedule(topology, coll, route_links, size_bytes, "hierarchy", rank=np.array(ranks, dtype=float),
                         rule="sequence", notes={"hierarchy": routes.describe(), "plan": routes.plan.label(name)},
                         channels=PLAN_CHANNELS if name == "allgather" else (1,))


@dataclass(frozen=True)
class HierarchyCandidate:
    """A composed, replayed schedule, the plan it came from and how long composing and replaying took (s).

    ``symmetry_order`` counts the images each sub-solution is mapped to: node rotations x rails.
    """

    plan: HierarchyPlan
    schedule: Schedule
    report: ReplayReport
    seconds: float
    symmetry_order: int


def connection_messages(topology: Topology, collective: str, pieces: int) -> int:
    """Messages on the busiest connection of a composition, about: a node tree edge carries the pieces of every
    node on its rail (``K x C``), twice for Allreduce (collect, then spread)."""
    return topology.num_nodes * pieces * (2 if normalize_name(collective) == "allreduce" else 1)


@dataclass(frozen=True)
class Volumes:
    """Bytes the busiest NIC and the busiest GPU's node port carry in a composition (Allgather: ``K - 1`` shards
    out of each NIC, ``(G - 1) x K`` shards out of each GPU into its node), and their bandwidths (GB/s)."""

    nic_bytes: float
    node_bytes: float
    nic_GBps: float
    node_GBps: float

    @property
    def time_us(self) -> float:
        """The composition's time when the rail and node phases overlap perfectly."""
        return max(self.nic_bytes / self.nic_GBps, self.node_bytes / self.node_GBps) / BYTES_PER_US_PER_GBPS


def rank_share_GBps(topology: Topology, link) -> float:
    """What one rank gets of ``link`` when every rank on its ports sends at once (GB/s): a NIC two GPUs share
    gives each half its bandwidth (a DGX-2's 12.5 GB/s NIC per GPU pair: 6.25)."""
    switches = {sw.name: sw for sw in topology.switches}
    port_bw = topology.port_capacity()
    share = link.capacity_GBps
    for p in link.ports:
        ranks = switches[p.switch].ports[p.port].ranks
        if ranks:
            share = min(share, port_bw[p] / len(ranks))
    return share


def volumes(topology: Topology, collective: str, size_bytes: float) -> Volumes:
    """The :class:`Volumes` of a composition of ``collective`` at ``size_bytes`` (nccl-tests' size)."""
    name = normalize_name(collective)
    k, g = topology.num_nodes, topology.gpus_per_node
    # rail links of node 0 to node 1 and node 0's own links: every node and rail is a copy (links through a
    # fabric are made on demand, so the others are not looked at)
    cross = [rank_share_GBps(topology, topology.link(i, g + i)) for i in range(g)]
    inside = [topology.link(u, v).capacity_GBps for u in range(g) for v in range(g)
              if u != v and topology.link(u, v) is not None]
    shard = size_bytes / topology.num_ranks   # one rank's part (a pair's block for Alltoall), DESIGN section 4
    rail, node = k - 1, (g - 1) * k
    if name == "alltoall":
        rail, node = (k - 1) * g, (g - 1) * k
    if name == "allreduce":
        rail, node = 2 * rail, 2 * node
    return Volumes(rail * shard, node * shard, min(cross), min(inside, default=min(cross)))


def piece_options(topology: Topology, collective: str, size_bytes: float, target: str = "executor"
                  ) -> tuple[int, ...]:
    """Pieces per rank worth trying: one (fewest messages: best at small sizes), and the fewest power of two for
    which the last piece's trip through its node (``G - 1`` sends from one GPU) costs at most
    :data:`PIPELINE_SHARE` of the pipelined time (:class:`Volumes`), capped so that the
    busiest connection's messages (with a dependency step each) fit :data:`SPREAD_CHANNELS` threadblocks of the
    target's steps (one for a composition in step, :func:`lockstep`, and half its pieces are tried too) and the
    program holds at most :data:`MAX_TRANSFERS` transfers."""
    name = normalize_name(collective)
    g = topology.gpus_per_node
    load = volumes(topology, name, size_bytes)
    # a composition in step keeps its order on one channel (spread over several, a connection's messages race)
    channels = 1 if runs_in_step(topology, name, node_trees(topology)) else SPREAD_CHANNELS

    def fits(c: int) -> bool:
        chunks, _ = collective_size(name, topology.num_ranks, c)
        hops = 2 if name == "alltoall" else topology.num_ranks - 1
        transfers = chunks * hops * (2 if name == "allreduce" else 1)
        return (2 * connection_messages(topology, name, c) <= max_steps(target) * channels
                and transfers <= MAX_TRANSFERS and c <= MAX_PIECES)

    def tail_us(c: int) -> float:
        piece = size_bytes / (topology.num_ranks * c)
        return (g - 1) * piece / load.node_GBps / BYTES_PER_US_PER_GBPS

    c = 1
    while fits(2 * c) and tail_us(c) > PIPELINE_SHARE * load.time_us:
        c *= 2
    # in step, half as many pieces too: where some cross to other rails, fewer may split the NIC share better
    return tuple(sorted({1, c} | ({max(1, c // 2)} if channels == 1 else set())))


def cross_pieces(topology: Topology, collective: str, pieces: int, nodes: NodeTrees) -> int:
    """How many of a shard's ``pieces`` should also go straight to another rail (:meth:`HierarchyPlan.crosses`),
    so that NICs and node ports finish together: where the node ports are the bottleneck (two nodes of an
    NVSwitch machine: each GPU passes on 7/8 of the buffer at 450 GB/s but its NIC only 1/16 at 50 GB/s), a
    NIC copy to another rail takes one node send off. Balancing ``(K-1)(1+x)/nic = ((G-1)K - (K-1)x)/node``
    gives the share ``x``; zero where the NICs already bind, where the node is not a star (only a leaf can
    be skipped) or where the origin has no link to other rails."""
    name = normalize_name(collective)
    k, g = topology.num_nodes, topology.gpus_per_node
    if name == "alltoall" or nodes.kind != "star" or g < 2 or topology.link(0, g + 1) is None:
        return 0
    load = volumes(topology, name, 1.0)
    per_nic, per_node = 1 / load.nic_GBps, 1 / load.node_GBps
    x = ((g - 1) * k * per_node - (k - 1) * per_nic) / ((k - 1) * (per_nic + per_node))

    def busiest(count: int) -> float:
        """The slower of NIC and node port with ``count`` pieces crossing; the last piece still goes through its
        node after the NIC (``G - 1`` sends of a piece), so the NIC should finish that much earlier."""
        share = count / pieces
        return max((k - 1) * (1 + share) * per_nic + (g - 1) / pieces * per_node,
                   ((g - 1) * k - (k - 1) * share) * per_node)

    near = {max(0, min(pieces, math.floor(x * pieces) + d)) for d in (0, 1)}
    return min(sorted(near), key=busiest)


def hierarchy_plans(topology: Topology, collective: str, size_bytes: float, target: str = "executor",
                    pieces: int | None = None) -> list[HierarchyPlan]:
    """The compositions ``auto`` tries: each rail shape (Alltoall: each hop order instead) at each piece count of
    :func:`piece_options` (or the user's ``--chunks``)."""
    name = normalize_name(collective)
    counts = (pieces,) if pieces else piece_options(topology, name, size_bytes, target)
    if name == "alltoall":
        return [HierarchyPlan(RailShape.DIRECT, c, order) for order in AlltoallOrder for c in counts]
    shapes = list(RailShape) if topology.num_nodes > 2 else [RailShape.DIRECT]   # on two nodes they agree
    if topology.num_nodes - 1 + topology.gpus_per_node - 1 > MAX_TBS_PER_CHANNEL_DIRECTION:
        # a direct rail sends to every other node: with the node's peers that is more sending threadblocks than
        # one channel holds (32 on 32 nodes of 8 GPUs: 38), and the writer's fused fallback simulates at 59%
        shapes = [RailShape.RING]
    plans = [HierarchyPlan(shape, c) for shape in shapes for c in counts]
    trees = node_trees(topology)
    if name == "reducescatter" and not runs_in_step(topology, name, trees):
        # at equal replayed time the first is written first (and often alone). With one piece, the reversal:
        # its chains lower as the Allgather's do, where the greedy booking's fused lowering on several channels
        # falls far behind its plan (32 x dgx-h100 on rails, ring: both 2728 us planned, 2728 against 4336 us
        # simulated; at 128 nodes, where only the first is written, 50% of the limit). With several pieces, the
        # greedy booking (8 x dgx-h100, 8 pieces, direct: both 2384 us planned, the greedy file runs as planned
        # and the reversed one 3624 us, ring 2561: two writes, 20 s of CPU, for nothing)
        # With one piece on GPUs with a NIC each, the greedy booking is not composed at all: it replayed no faster
        # than the reversal wherever measured, and its file was the slower (32 nodes above; 128 nodes: 50% of the
        # limit), while composing it took 2 of the 7 minutes before any writing at 128 nodes
        own_nics = bool(topology.nics) and all(len(nic.ranks) == 1 for nic in topology.nics)
        plans = [q for p in plans for q in ((replace(p, reversal=True),) if p.pieces == 1 and own_nics else
                                            (replace(p, reversal=True), p) if p.pieces == 1
                                            else (p, replace(p, reversal=True)))]
    return plans + [HierarchyPlan(RailShape.DIRECT, c, cross=x) for c in counts
                    if (x := cross_pieces(topology, name, c, trees))]


def synthesize_hierarchy(topology: Topology, collective: str, size_bytes: float, root: int | None = None,
                         target: str = "executor", pieces: int | None = None,
                         progress: Callable[[str], None] = lambda message: None,
                         executor: Executor | None = None, deadline: Deadline = UNBOUNDED
                         ) -> list[HierarchyCandidate]:
    """Every composition of :func:`hierarchy_plans`, composed and replayed, fastest first (ties: plan order).

    The compositions are independent: with an ``executor`` (a process pool, or a Dask cluster's
    ``client.get_executor()``) they run there, and the result is the same as in this process. Once ``deadline``
    has passed, the compositions done so far (at least one) are the answer.
    """
    nodes, plans = composable_plans(topology, collective, size_bytes, target, pieces, progress)
    progress(f"  hierarchy: composing {len(plans)} plan(s) of one rail and one node over {topology.num_nodes} x "
             f"{topology.gpus_per_node} GPUs ({', '.join(p.label(collective) for p in plans)}), each replayed")
    if executor is None:
        results = (_compose_and_replay(topology, collective, p, size_bytes, root, nodes) for p in plans)
    else:
        futures = [executor.submit(_compose_and_replay, topology, collective, p, size_bytes, root, nodes)
                   for p in plans]
        results = (f.result() for f in futures)
    out = []
    for k, c in enumerate(results, 1):
        progress(f"  [{k}/{len(plans)}] {c.plan.label(collective)}: {c.report.time_us:.2f} us "
                 f"({len(c.schedule.transfers)} transfers)")
        out.append(c)
        if deadline.expired and k < len(plans):
            progress(f"  time limit reached: {len(plans) - k} composition(s) not tried")
            break
    return worth_writing(out)


def check_composable(topology: Topology, collective: str) -> NodeTrees:
    """Refuse a composition that cannot apply or cannot run (:func:`check_applicable`,
    :func:`check_threadblocks`) before any work; returns the node's trees the composition uses."""
    check_applicable(topology, collective)
    nodes = node_trees(topology)
    check_threadblocks(topology, collective, nodes)
    return nodes


def composable_plans(topology: Topology, collective: str, size_bytes: float, target: str = "executor",
                     pieces: int | None = None, progress: Callable[[str], None] = lambda message: None
                     ) -> tuple[NodeTrees, list[HierarchyPlan]]:
    """The node's trees and the plans of :func:`hierarchy_plans` whose programs can load on ``target``, refusing
    before any composing when none can (:func:`check_composable`, :func:`unloadable`)."""
    nodes = check_composable(topology, collective)
    kept, refused = [], []
    for plan in hierarchy_plans(topology, collective, size_bytes, target, pieces):
        reason = unloadable(topology, collective, plan, nodes, target)
        if reason is None:
            kept.append(plan)
        else:
            progress(f"  hierarchy: {plan.label(collective)} cannot load, not composed ({reason})")
            refused.append((plan, reason))
    if not kept:
        raise BackendError(f"no composition of {normalize_name(collective)} over {topology.num_nodes} x "
                           f"{topology.gpus_per_node} GPUs can load on the {target} runtime: " + "; ".join(
                               f"{plan.label(collective)}: {reason}" for plan, reason in refused))
    return nodes, kept


def unloadable(topology: Topology, collective: str, plan: HierarchyPlan, nodes: NodeTrees, target: str
               ) -> str | None:
    """Why no lowering of ``plan``'s composition can load (:func:`backends.msccl.fit.hopeless` on
    :func:`node_share`), or None. At 128 x 8 GPUs an Allreduce composition has 2,095,104 transfers: composing them
    took a minute (and their lowerings, before the floor, an hour), node 0's share two seconds; every node is a
    rotation of node 0, and the writer checks every rank anyway."""
    return hopeless(node_share(topology, collective, plan, nodes), topology, target,
                    ranks=range(topology.gpus_per_node))


def node_share(topology: Topology, collective: str, plan: HierarchyPlan, nodes: NodeTrees) -> Schedule:
    """The transfers of ``plan``'s composition that node 0's GPUs send or receive, from the routes alone (no
    ordering): each chunk's edges numbered in route order (collecting edges, then spreading ones), which orders a
    GPU's receives and sends of a chunk as the composed schedule does."""
    name = normalize_name(collective)
    routes = HierarchyRoutes(topology, plan, nodes)
    coll = make_collective(name, topology.num_ranks, plan.pieces)
    mine = range(topology.gpus_per_node)
    transfers = routes.explicit(coll)
    if transfers is None:
        transfers = [Transfer(p.chunk, u, v, k) for p in plan_collective(coll, routes)
                     for k, (u, v) in enumerate(p.reduce_edges + p.copy_edges) if u in mine or v in mine]
    else:
        transfers = [t for t in transfers if t.src in mine or t.dst in mine]
    return Schedule(coll, topology.name, tuple(transfers), 1 + max((t.step for t in transfers), default=0))


def check_threadblocks(topology: Topology, collective: str, nodes: NodeTrees) -> None:
    """Refuse, before composing, an Alltoall whose every GPU receives from more peers than its SMs run
    threadblocks (one per peer, :func:`backends.msccl.fit.hopeless`): on NVSwitch nodes a GPU receives from every
    other node on its rail and from every other GPU of its node, whichever hop comes first (128 x dgx-h100:
    127 + 7 = 134 peers for 132 SMs, found after four minutes of composing)."""
    sms = topology.sms_per_gpu
    if normalize_name(collective) != "alltoall" or nodes.kind != "star" or sms is None:
        return
    k, g = topology.num_nodes, topology.gpus_per_node
    if k - 1 + g - 1 > sms:
        raise BackendError(f"the PXN composition of an Alltoall over {k} nodes of {g} GPUs has every GPU receive "
                           f"from {k - 1} rail peers and {g - 1} peers in its node, a threadblock each, and the GPU "
                           f"runs at most {sms} threadblocks (one per SM); use at most {sms - g + 2} nodes")


def worth_writing(candidates: list[HierarchyCandidate]) -> list[HierarchyCandidate]:
    """The candidates, fastest first, without those whose extra transfers buy less than :data:`PIPELINE_SHARE`
    over a candidate with fewer (writing and checking a program costs time per transfer: on ndv2 x 8 at 1 MB,
    8 pieces per rank replay 1.1% faster than one, with 8 times the transfers)."""
    kept = []
    for c in sorted(candidates, key=lambda c: len(c.schedule.transfers)):
        if all(c.report.time_us < k.report.time_us * (1 - PIPELINE_SHARE) for k in kept
               if len(k.schedule.transfers) < len(c.schedule.transfers)):
            kept.append(c)
    return sorted(kept, key=lambda c: c.report.time_us)


def _compose_and_replay(topology: Topology, collective: str, plan: HierarchyPlan, size_bytes: float,
                        root: int | None, nodes: NodeTrees) -> HierarchyCandidate:
    """One composition, replayed (a module-level function, so process pools and Dask can run it)."""
    t0 = time.perf_counter()
    schedule = compose(topology, collective, plan, size_bytes, root, nodes)
    report = verify(schedule, topology, size_bytes)
    return HierarchyCandidate(plan, schedule, report, time.perf_counter() - t0,
                              topology.num_nodes * topology.gpus_per_node)
