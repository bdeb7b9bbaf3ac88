"""The sharded exchange Allreduce across nodes: each node reduces every shard into its owner GPU, the owners of a
shard (GPU ``i`` of every node, one rail) add each other's node sums in one exchange over the rail, and each
owner copies the total back through its node.

The hierarchical composition (:mod:`synth.synthesis.hierarchy`) collects a shard into one owner of the whole
machine and spreads it back: the shard crosses the network twice (reduce, then broadcast), four phases of
alphas. Here it crosses once, and every node's owner holds the total at the same time: three phases. On two
nodes each rail still carries one shard each way, as much as reduce-scatter then allgather; on ``K`` nodes it
carries ``K - 1`` (a rail exchange is all to all), so the simulator decides where that pays. 2 x dgx-h100
Allreduce 64 KB: 0.6 + 2.0 + 0.6 us of alphas, where the composition takes 5.4 us and the best baseline 4.96 us.

On two nodes joined by one-way rails that do not meet at the same GPUs (TE-CCL's DGX-2 pair: ``2k + 1 -> 16 + 2k``,
``17 + 2k -> 2k``) each shard has a sender and a receiver per node (:func:`crossed_rails`): the sender copies its
node's sum to the receiver while the sum crosses, so the receivers add what crossed to a copy that landed first,
still four hops: dgx2-2node-tecc Allreduce 1 KB 3.32 us (the alpha diameter is 3.3), 64 KB 4.62 us where the
alpha-beta search's file took 7.76 us.

A rank's buffer is read by the owners it sends to before their sums come back (the direct-exchange baseline's
convention, :mod:`synth.synthesis.baselines.all_pairs`): the replay proves each total holds every input once.

>>> from synth.model.topology import load_topology
>>> found = sharded_exchange(load_topology("dgx-h100", nodes=2), 64 << 10, 1)
>>> found.schedule.collective.chunks_per_rank, len(found.schedule.transfers)
(1, 480)
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import InputError
from synth.model.collectives import make_collective
from synth.model.topology import Topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.ir import COPY, REDUCE, Schedule, Transfer
from synth.schedule.list_scheduler import RUNTIME_FIFO_DEPTH
from synth.schedule.replay import ReplayReport, verify
from synth.synthesis.hierarchy import check_applicable, node_trees, rank_share_GBps

LABEL = "exchange/"
PIECES = (1, 2, 4)     # chunks per rank tried
# Transfers beyond which it is not built: each costs about half a millisecond to write and check.
MAX_TRANSFERS = 1 << 17


@dataclass(frozen=True)
class ShardedExchange:
    """A verified sharded exchange: its schedule, chunks per rank and replay at the request's size."""

    schedule: Schedule
    pieces: int
    report: ReplayReport

    @property
    def label(self) -> str:
        return f"{LABEL}c{self.schedule.collective.chunks_per_rank}"


def exchange_applies(topology: Topology, collective: str) -> bool:
    """An Allreduce on several nodes whose rails link GPU ``i`` of every node to GPU ``i`` of every other, or on
    two nodes joined both ways by rails that need not meet at the same GPUs (:func:`crossed_rails`)."""
    if collective != "allreduce" or topology.num_nodes < 2:
        return False
    try:
        check_applicable(topology, collective)
    except InputError:
        return bool(crossed_rails(topology))
    return True


def crossed_rails(topology: Topology) -> tuple[tuple[int, int, int, int], ...]:
    """Two nodes joined by one-way rails, paired as ``(u, v, x, y)``: ``u -> v`` from node 0 to node 1 and
    ``x -> y`` back, the ``i``-th of each by sending GPU; empty where another machine, or a rail has no partner.

    TE-CCL's DGX-2 pair links odd GPU ``2k + 1`` to GPU ``16 + 2k`` and ``17 + 2k`` to ``2k``: no GPU sends and
    receives on the same rail pair, so the owners of a shard in the two nodes are not one rail apart both ways.

    >>> from synth.model.topology import load_topology
    >>> crossed_rails(load_topology("dgx2-2node-tecc"))[:2]
    ((1, 16, 17, 0), (3, 18, 19, 2))
    """
    g = topology.gpus_per_node
    if topology.num_nodes != 2 or not isinstance(topology.links, tuple):
        return ()
    out = sorted((link.src, link.dst) for link in topology.links if link.src < g <= link.dst)
    back = sorted((link.src, link.dst) for link in topology.links if link.dst < g <= link.src)
    if not out or len(out) != len(back):
        return ()
    return tuple((u, v, x, y) for (u, v), (x, y) in zip(out, back))


def waits_on_shared_nics(topology: Topology, size_bytes: float, pieces: int) -> bool:
    """Whether the rail messages would wait on the runtime's FIFOs where the plan cannot see it: GPUs share a NIC,
    a rail connection carries more messages than its FIFO holds, and they are smaller than the FIFO needs to
    cover the rail's latency. The runtime serves a shared port in the order sends come, and there the replay
    planned 2 x dgx2 1 MB with 4 chunks per rank at 17.98 us, which simulated at 18.57 (3.3%); where each GPU has
    its NIC (dgx-h100) the file ran as planned."""
    rail = topology.link(0, topology.gpus_per_node)
    if rank_share_GBps(topology, rail) >= rail.capacity_GBps:
        return False
    messages = topology.num_nodes * pieces             # a GPU's owned chunks, each sent once on each rail peer
    message_bytes = size_bytes / (topology.num_ranks * pieces)
    cover = rail.alpha_us * rail.capacity_GBps * BYTES_PER_US_PER_GBPS / RUNTIME_FIFO_DEPTH
    return messages > RUNTIME_FIFO_DEPTH and message_bytes < cover


def sharded_exchange(topology: Topology, size_bytes: float, pieces: int) -> ShardedExchange | None:
    """The sharded exchange with ``pieces`` chunks per rank (the Allreduce's ``N * pieces`` chunks, chunk ``c``
    owned by local GPU ``c mod G``), replayed at ``size_bytes``; None where it does not apply, would exceed
    :data:`MAX_TRANSFERS`, or :func:`waits_on_shared_nics`."""
    if not exchange_applies(topology, "allreduce"):
        return None
    try:
        check_applicable(topology, "allreduce")
    except InputError:
        return _crossed_exchange(topology, size_bytes, pieces)
    if waits_on_shared_nics(topology, size_bytes, pieces):
        return None
    g, k = topology.gpus_per_node, topology.num_nodes
    nodes = node_trees(topology)
    trees = nodes.edges
    collective = make_collective("allreduce", topology.num_ranks, pieces)
    if len(collective.chunks) * k * (2 * (g - 1) + k - 1) > MAX_TRANSFERS:
        return None
    transfers = []
    for chunk in range(len(collective.chunks)):
        owner = chunk % g
        edges = trees[owner]                       # out-tree from the owner, parents first
        depth = _depths(edges, owner)
        deepest = max(depth.values())
        for node in range(k):
            base = node * g
            transfers += [Transfer(chunk, base + v, base + u, deepest - depth[v], REDUCE) for u, v in edges]
            transfers += [Transfer(chunk, base + u, base + v, deepest + 1 + depth[u], COPY) for u, v in edges]
            transfers += [Transfer(chunk, base + owner, other * g + owner, deepest, REDUCE)
                          for other in range(k) if other != node]
    schedule = Schedule(collective, topology.name, tuple(transfers), 1 + max(t.step for t in transfers),
                        method="exchange", notes={"exchange": {"node_trees": nodes.kind,
                                                               "pieces": pieces}})
    return ShardedExchange(schedule, pieces, verify(schedule, topology, size_bytes))


def _crossed_exchange(topology: Topology, size_bytes: float, pieces: int) -> ShardedExchange:
    """The sharded exchange on two nodes joined by :func:`crossed_rails`: chunk ``c`` takes rail pair ``c mod R``,
    ``(u, v, x, y)``. Node 0 sums it into ``u`` and node 1 into ``x`` (over the node's trees); ``u`` copies its sum
    to ``y`` and ``x`` to ``v`` while each sends it over its rail, ``u -> v`` and ``x -> y``, to be added there;
    ``v`` and ``y`` then hold the total and copy it through their nodes. Four hops, as the exchange over rails
    that meet: the copies inside a node land before the sums that crossed the network."""
    g = topology.gpus_per_node
    pairs = crossed_rails(topology)
    trees = node_trees(topology).edges
    collective = make_collective("allreduce", topology.num_ranks, pieces)

    def reduced(chunk: int, owner: int, last_step: int) -> list[Transfer]:
        """Node ``owner // g``'s inputs summed into ``owner``, its last hop at ``last_step``."""
        base, edges = owner - owner % g, trees[owner % g]
        depth = _depths(edges, owner % g)
        return [Transfer(chunk, base + b, base + a, last_step - depth[b] + 1, REDUCE) for a, b in edges]

    def spread(chunk: int, origin: int, first_step: int) -> list[Transfer]:
        """``origin``'s value copied through its node, its first hop at ``first_step``."""
        base, edges = origin - origin % g, trees[origin % g]
        depth = _depths(edges, origin % g)
        return [Transfer(chunk, base + a, base + b, first_step + depth[a], COPY) for a, b in edges]

    deepest = max(max(_depths(edges, origin).values()) for origin, edges in enumerate(trees))
    transfers = []
    for chunk in range(len(collective.chunks)):
        u, v, x, y = pairs[chunk % len(pairs)]
        transfers += reduced(chunk, u, deepest - 1) + reduced(chunk, x, deepest - 1)
        transfers += [Transfer(chunk, a, b, deepest, COPY) for a, b in ((u, y), (x, v)) if a != b]
        transfers += [Transfer(chunk, u, v, deepest + 1, REDUCE), Transfer(chunk, x, y, deepest + 1, REDUCE)]
        transfers += spread(chunk, v, deepest + 2) + spread(chunk, y, deepest + 2)
    schedule = Schedule(collective, topology.name, tuple(transfers), 1 + max(t.step for t in transfers),
                        method="exchange", notes={"exchange": {"node_trees": "crossed rails", "pieces": pieces}})
    return ShardedExchange(schedule, pieces, verify(schedule, topology, size_bytes))


def _depths(edges, origin: int) -> dict[int, int]:
    """Hops from ``origin`` to each GPU of its tree (``edges``: parents first)."""
    depth = {origin: 0}
    for a, b in edges:
        depth[b] = depth[a] + 1
    return depth
