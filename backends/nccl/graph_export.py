"""Write a ring-shaped schedule as an NCCL graph file (``NCCL_GRAPH_FILE``, DESIGN section 8).

Stock NCCL reads ``<graphs version="1"><graph id="0" pattern="4" ...><channel><gpu dev="0x0"/>...`` and runs
its ring algorithm over the listed GPU orders, one channel per ring, without validating them. So only
schedules that *are* rings can be written: every chunk's transfers must follow one Hamiltonian cycle (each
rank sends the chunk only to its successor on that cycle). Chunks may use different rings; NCCL splits the
data evenly over channels, so a ring carrying twice the chunks of another is written as two channels; a chunk that travels fewer than ``n - 1`` hops must lie on a ring another chunk
determines. Anything else (trees, all-pairs, a rank forwarding one chunk to two peers) raises
:class:`~synth.errors.BackendError` saying why.

Multi-node rings must visit each node's GPUs in one contiguous segment, and every node in the same local
order (one file serves every node); the channel then lists that local order between ``<net dev/>`` elements
naming the NIC (index into the topology's NICs) used to enter and leave the node. Device numbers are written
in hex (``0xa``) so NCCL 2.12 and 2.23 both read them. ``speedintra``/``speedinter`` are the per-channel
bandwidths (GB/s) of the narrowest ring link inside / between nodes, shared among the channels that use it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import jinja2

from synth.errors import BackendError
from synth.schedule.ir import Schedule
from synth.model.topology import Topology

TYPES_INTRA = ("NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")
TYPES_INTER = ("PIX", "PXB", "PXN", "PHB", "SYS", "NET")
MAX_CHANNELS = 32


@dataclass(frozen=True)
class ChannelView:
    """One ``<channel>``: local GPU devices (hex strings) in ring order, NIC devices (hex) or None."""

    gpus: tuple[str, ...]
    net_in: str | None
    net_out: str | None


@dataclass(frozen=True)
class GraphView:
    """Everything the template prints."""

    channels: tuple[ChannelView, ...]
    crossnic: int
    speedintra: str
    speedinter: str
    latencyinter: str
    typeintra: str
    typeinter: str
    samechannels: int


def _refuse(reason: str) -> BackendError:
    return BackendError(f"cannot write an NCCL graph file: {reason} (NCCL graph files describe rings: every "
                        "rank sends each chunk only to its successor on one Hamiltonian cycle)")


def _canonical(cycle: list[int]) -> tuple[int, ...]:
    k = cycle.index(min(cycle))
    return tuple(cycle[k:] + cycle[:k])


def _chunk_walk(chunk: int, edges: set[tuple[int, int]], n: int) -> tuple[list[int], bool]:
    """The chunk's transfers as one walk (list of ranks) and whether it closes into a cycle."""
    succ, pred = {}, {}
    for a, b in sorted(edges):
        if a in succ and succ[a] != b:
            raise _refuse(f"rank {a} sends chunk {chunk} to both {succ[a]} and {b}")
        if b in pred and pred[b] != a:
            raise _refuse(f"rank {b} receives chunk {chunk} from both {pred[b]} and {a}")
        succ[a], pred[b] = b, a
    starts = [a for a in succ if a not in pred]
    start = starts[0] if starts else min(succ)
    walk, seen = [start], {start}
    while walk[-1] in succ and succ[walk[-1]] not in seen:
        walk.append(succ[walk[-1]])
        seen.add(walk[-1])
    closed = not starts and len(walk) == len(succ)
    if len(walk) - (0 if closed else 1) != len(edges) or len(starts) > 1:
        raise _refuse(f"chunk {chunk} moves along several separate paths, not one path around a ring")
    if closed and len(walk) != n:
        raise _refuse(f"chunk {chunk} cycles through {len(walk)} of the {n} ranks only")
    return walk, closed


def ring_shares(schedule: Schedule) -> list[tuple[tuple[int, ...], int]]:
    """The distinct Hamiltonian cycles the schedule's chunks follow (in order of first use) with the number of
    chunks on each. Raises BackendError when some chunk does not follow a ring.

    >>> from synth.model.collectives import make_collective
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> coll = make_collective("allgather", 4)
    >>> ts = [Transfer(c, (c + k) % 4, (c + k + 1) % 4, k) for c in range(4) for k in range(3)]
    >>> ring_shares(Schedule(coll, "ring-4", tuple(ts), 3))
    [((0, 1, 2, 3), 4)]
    """
    n = schedule.num_ranks
    edges: dict[int, set] = {}
    for t in schedule.transfers:
        if t.src == t.dst:
            raise _refuse(f"chunk {t.chunk} is sent from rank {t.src} to itself")
        edges.setdefault(t.chunk, set()).add((t.src, t.dst))
    if not edges:
        raise _refuse("the schedule has no transfers")
    shares: dict[tuple[int, ...], int] = {}
    partial = []
    for chunk in sorted(edges):
        walk, closed = _chunk_walk(chunk, edges[chunk], n)
        if closed or len(walk) == n:
            ring = _canonical(walk)
            shares[ring] = shares.get(ring, 0) + 1
        else:
            partial.append((chunk, edges[chunk]))
    rings = list(shares)
    ring_edges = [{(r[i], r[(i + 1) % n]) for i in range(n)} for r in rings]
    for chunk, es in partial:
        home = next((r for r, re in zip(rings, ring_edges) if es <= re), None)
        if home is None:
            a, b = sorted(es)[0]
            raise _refuse(f"chunk {chunk} only travels {len(es)} hop(s) (e.g. {a}->{b}) and no ring of the "
                          "schedule contains its path, so its ring is unknown")
        shares[home] += 1
    return list(shares.items())


def find_rings(schedule: Schedule) -> list[tuple[int, ...]]:
    """The distinct rings of a ring-shaped schedule (see :func:`ring_shares`)."""
    return [ring for ring, _ in ring_shares(schedule)]


def channel_rings(schedule: Schedule) -> list[tuple[int, ...]]:
    """One ring per NCCL channel: each distinct ring repeated in proportion to its share of the chunks, so
    NCCL's even split of the data over channels gives every ring the share the schedule gives it."""
    shares = ring_shares(schedule)
    unit = math.gcd(*[count for _, count in shares])
    channels = [ring for ring, count in shares for _ in range(count // unit)]
    if len(channels) > MAX_CHANNELS:
        raise BackendError(f"cannot write an NCCL graph file: keeping each ring's share of the data needs "
                           f"{len(channels)} channels, more than NCCL's {MAX_CHANNELS}")
    return channels


def _rotate_to_nodes(ring: tuple[int, ...], topology: Topology) -> list[int]:
    """Rotate a multi-node ring to start where it enters node 0; check each node is one contiguous segment."""
    n = len(ring)
    node = topology.node_of
    entries = [i for i in range(n) if node(ring[i - 1]) != node(ring[i])]
    if len(entries) != topology.num_nodes:
        visits = Counter(node(ring[i]) for i in entries)
        k = next((k for k, v in visits.items() if v > 1), 0)
        raise _refuse(f"ring {list(ring)} enters node {k} {visits.get(k, 0)} times; NCCL channels visit each "
                      "node's GPUs in one contiguous segment")
    start = next(i for i in entries if node(ring[i]) == 0)
    return list(ring[start:] + ring[:start])


def _nic_of(topology: Topology, local: int) -> int:
    return next((k for k, nic in enumerate(topology.nics) if local in nic.ranks), 0)


def _fmt_GBps(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def graph_view(schedule: Schedule, topology: Topology, typeintra: str = "NVL", typeinter: str = "PIX") -> GraphView:
    """Check the schedule is ring-shaped on ``topology`` and prepare what the template prints."""
    if schedule.num_ranks != topology.num_ranks:
        raise BackendError(f"the schedule is for {schedule.num_ranks} ranks but topology {topology.name} has "
                           f"{topology.num_ranks}; pass the topology (and --nodes) it was made for")
    if typeintra not in TYPES_INTRA or typeinter not in TYPES_INTER:
        raise BackendError(f"typeintra must be one of {', '.join(TYPES_INTRA)} and typeinter one of "
                           f"{', '.join(TYPES_INTER)}")
    rings = channel_rings(schedule)
    n, gpn = topology.num_ranks, topology.gpus_per_node
    use = Counter()
    for ring in rings:
        for i in range(n):
            e = (ring[i], ring[(i + 1) % n])
            if topology.link(*e) is None:
                raise _refuse(f"ring {list(ring)} uses {e[0]}->{e[1]}, which topology {topology.name} lacks")
            use[e] += 1
    channels = []
    for ring in rings:
        order = _rotate_to_nodes(ring, topology) if topology.num_nodes > 1 else list(ring)
        segments = [[r % gpn for r in order[k * gpn:(k + 1) * gpn]] for k in range(topology.num_nodes)]
        for k, seg in enumerate(segments[1:], 1):
            if seg != segments[0]:
                raise _refuse(f"node {k} visits its GPUs in the order {seg} but node 0 in {segments[0]}; one "
                              "graph file serves every node, so all nodes must use the same local order")
        local = segments[0]
        multi = topology.num_nodes > 1
        channels.append(ChannelView(tuple(hex(d) for d in local),
                                    hex(_nic_of(topology, local[0])) if multi else None,
                                    hex(_nic_of(topology, local[-1])) if multi else None))
    intra, inter = [], []
    for e, count in use.items():
        share = topology.link(*e).capacity_GBps / count
        (inter if topology.node_of(e[0]) != topology.node_of(e[1]) else intra).append(share)
    speedintra = min(intra) if intra else min(inter)
    speedinter = min(inter) if inter else speedintra
    latency = max((topology.link(*e).alpha_us for e in use if topology.node_of(e[0]) != topology.node_of(e[1])),
                  default=0.0)
    return GraphView(tuple(channels), int(any(c.net_in != c.net_out for c in channels)), _fmt_GBps(speedintra),
                     _fmt_GBps(speedinter), _fmt_GBps(latency), typeintra, typeinter,
                     int(len({c.gpus for c in channels}) == 1))


_ENV = jinja2.Environment(loader=jinja2.PackageLoader("backends.nccl", "templates"), undefined=jinja2.StrictUndefined,
                          autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def export_nccl_graph(schedule: Schedule, topology: Topology, typeintra: str = "NVL", typeinter: str = "PIX") -> str:
    """The ring-shaped ``schedule`` as NCCL graph XML text (no prolog, two-space indentation).

    ``typeintra``/``typeinter`` are the path types NCCL assumes inside and between nodes (NVL for NVLink,
    PIX/PXB/PHB/SYS for PCIe paths). Raises BackendError for schedules that are not rings.

    >>> from synth.model.collectives import make_collective
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> from synth.model.topology import load_topology
    >>> coll = make_collective("allgather", 4)
    >>> ts = [Transfer(c, (c + k) % 4, (c + k + 1) % 4, k) for c in range(4) for k in range(3)]
    >>> print(export_nccl_graph(Schedule(coll, "ring-4", tuple(ts), 3), load_topology("ring-4")), end="")
    <graphs version="1">
      <graph id="0" pattern="4" crossnic="0" nchannels="1" speedintra="25" speedinter="25" latencyinter="0" typeintra="NVL" typeinter="PIX" samechannels="1">
        <channel>
          <gpu dev="0x0"/>
          <gpu dev="0x1"/>
          <gpu dev="0x2"/>
          <gpu dev="0x3"/>
        </channel>
      </graph>
    </graphs>
    """
    return _ENV.get_template("nccl_graph.xml.j2").render(graph=graph_view(schedule, topology, typeintra, typeinter))
