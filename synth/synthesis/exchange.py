"""The sharded exchange Allreduce across nodes: each node reduces every shard into its owner GPU, the owners of a
shard (GPU ``i`` of every node, one rail) add each other's node sums in one exchange over the rail, and each
owner copies the total back through its node.

The hierarchical composition (:mod:`synth.synthesis.hierarchy`) collects a shard into one owner of the whole
machine and spreads it back: the shard crosses the network twice (reduce, then broadcast), four phases of
alphas. Here it crosses once, and every node's owner holds the total at the same time: three phases. On two
nodes each rail still carries one shard each way, as much as reduce-scatter then allgather; on ``K`` nodes it
carries ``K - 1`` (a rail exchange is all to all), so the simulator decides where that pays. 2 x dgx-h100
Allreduce 64 KB: 0.6 + 2.0 + 0.6 us of alphas, where the composition takes 5.4 us and the best baseline 4.96 us.

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
    """An Allreduce on several nodes whose rails link GPU ``i`` of every node to GPU ``i`` of every other."""
    if collective != "allreduce" or topology.num_nodes < 2:
        return False
    try:
        check_applicable(topology, collective)
    except InputError:
        return False
    return True


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
    if not exchange_applies(topology, "allreduce") or waits_on_shared_nics(topology, size_bytes, pieces):
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
        depth = {owner: 0}
        for u, v in edges:
            depth[v] = depth[u] + 1
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

