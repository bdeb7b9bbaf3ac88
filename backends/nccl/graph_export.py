"""Write a ring-shaped schedule as an NCCL graph file (``NCCL_GRAPH_FILE``, DESIGN section 8).

Stock NCCL reads ``<graphs version="1"><graph id="0" pattern="4" ...><channel><gpu dev="0x0"/>...`` and runs
its ring algorithm over the listed GPU orders, one channel per ``<channel>``, without validating them. So only
schedules that *are* rings can be written: every chunk's transfers must follow one Hamiltonian cycle (each
rank sends the chunk only to its successor on that cycle). Chunks may use different rings; NCCL splits the
data evenly over channels, so a ring carrying twice the chunks of another is written twice as often; a chunk
that travels fewer than ``n - 1`` hops must lie on a ring another chunk determines. Anything else (trees,
all-pairs, a rank forwarding one chunk to two peers) raises :class:`~synth.errors.BackendError` saying why.

What the ``<graph>`` element says, the way NCCL's own search would set it (facts from NCCL's
``src/graph/search.cc``):

- ``nchannels`` and ``speedintra``/``speedinter`` (GB/s per channel): NCCL uses a loaded graph's channel count
  as is, so a ring written as one channel at the full link bandwidth would run on one channel. Each ring gets
  the bottleneck bandwidth of its links (a link's capacity shared by the rings on it); the per-channel speed
  is the largest of NCCL's search speeds (:data:`SPEEDS_INTRA`, :data:`SPEEDS_INTER` across nodes) within
  it, every ring is repeated as many times as that speed fits, and, as NCCL's ``ncclTopoDupChannels`` does,
  channels of 25 GB/s or more are doubled at half the speed (at most :data:`MAX_CHANNELS` channels).
- ``typeintra``: the worst NCCL path type of the ring's hops inside a node (``Link.path_type``: NVL over
  NVLink/NVSwitch, PIX/PXB/PHB/SYS over PCIe; links of unknown type count as NVL, as built-ins describe
  NVLink). ``typeinter``: the worst GPU-to-NIC path type of the NICs the channels use (``Nic.path_type``,
  kept from an NCCL dump; PIX when unknown), one of NCCL's :data:`TYPES_INTER`.
- Multi-node rings: NCCL runs one local order on every node, entering at its first GPU and leaving at its last.
  The ring must visit each node's GPUs in one contiguous segment; when nodes use different local orders, node
  0's order is written if every node has the same links (same capacity) for it, otherwise the ring is
  refused. The channel lists that order between ``<net dev/>`` elements: NCCL's net device numbers of the NICs
  of the first and last GPU (``Nic.net_devs``, kept from an NCCL topology dump; a NIC with several ports
  alternates them over channels; a topology without them falls back to the NIC's index, which may not be
  NCCL's numbering).

Device numbers are written in hex (``0xa``) so NCCL 2.12 and 2.23 both read them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import jinja2

from synth.errors import BackendError
from synth.schedule.ir import Schedule
from synth.model.topology import PATH_TYPES, Topology

TYPES_INTRA = PATH_TYPES
TYPES_INTER = ("PIX", "PXB", "PXN", "PHB", "SYS")   # GPU-to-NIC path types NCCL's graph reader knows
MAX_CHANNELS = 32
# NCCL's ring search speeds (GB/s per channel) inside one node and across nodes.
SPEEDS_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEEDS_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                0.24, 0.12)
DUP_CHANNELS_FROM_GBPS = 25.0


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


def _local_order(order: list[int], topology: Topology) -> list[int]:
    """The one local order NCCL runs on every node (module docstring)."""
    gpn = topology.gpus_per_node
    segments = [[r % gpn for r in order[k * gpn:(k + 1) * gpn]] for k in range(topology.num_nodes)]
    local = segments[0]
    for k, seg in enumerate(segments[1:], 1):
        if seg == local:
            continue
        for a, b in zip(local, local[1:]):
            mine, theirs = topology.link(a, b), topology.link(k * gpn + a, k * gpn + b)
            if theirs is None or theirs.capacity_GBps != mine.capacity_GBps:
                raise _refuse(f"node {k} visits its GPUs in the order {seg} but node 0 in {local}; one graph file "
                              f"serves every node, and node {k} lacks node 0's link {a}->{b} (or it is slower), so "
                              "all nodes must use the same local order")
    return local


def _nic(topology: Topology, local: int) -> tuple[int, object]:
    return next(((k, nic) for k, nic in enumerate(topology.nics) if local in nic.ranks), (0, None))


def _net_dev(topology: Topology, local: int, channel: int) -> str:
    """NCCL's net device of ``local``'s NIC (ports alternate over channels), or the NIC's index without one."""
    k, nic = _nic(topology, local)
    if nic is not None and nic.net_devs:
        return hex(nic.net_devs[channel % len(nic.net_devs)])
    return hex(k)


def _fmt_GBps(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _channel_plan(budget_GBps: float, rings: int, speeds: tuple[float, ...]) -> tuple[int, float]:
    """(copies of every ring, GB/s per channel) NCCL's search would settle on for rings of ``budget_GBps``."""
    speed = next((s for s in speeds if s <= budget_GBps), speeds[-1])
    copies = max(1, min(int(budget_GBps // speed), MAX_CHANNELS // rings))
    if speed >= DUP_CHANNELS_FROM_GBPS and 2 * copies * rings <= MAX_CHANNELS:
        copies, speed = 2 * copies, speed / 2
    return copies, speed


def _path_type_rank(link) -> int:
    return PATH_TYPES.index(link.path_type) if link.path_type else 0


def graph_view(schedule: Schedule, topology: Topology, typeintra: str | None = None,
               typeinter: str | None = None) -> GraphView:
    """Check the schedule is ring-shaped on ``topology`` and prepare what the template prints.

    ``typeintra``/``typeinter`` None derive them from the links and NICs (module docstring).
    """
    if schedule.num_ranks != topology.num_ranks:
        raise BackendError(f"the schedule is for {schedule.num_ranks} ranks but topology {topology.name} has "
                           f"{topology.num_ranks}; pass the topology (and --nodes) it was made for")
    if (typeintra is not None and typeintra not in TYPES_INTRA) or (typeinter is not None
                                                                    and typeinter not in TYPES_INTER):
        raise BackendError(f"typeintra must be one of {', '.join(TYPES_INTRA)} and typeinter one of "
                           f"{', '.join(TYPES_INTER)} (NCCL's spelling)")
    rings = channel_rings(schedule)
    n = topology.num_ranks
    multi = topology.num_nodes > 1
    use = Counter()
    for ring in rings:
        for i in range(n):
            e = (ring[i], ring[(i + 1) % n])
            if topology.link(*e) is None:
                raise _refuse(f"ring {list(ring)} uses {e[0]}->{e[1]}, which topology {topology.name} lacks")
            use[e] += 1
    budget = min(topology.link(*e).capacity_GBps / count for e, count in use.items())
    copies, speed = _channel_plan(budget, len(rings), SPEEDS_INTER if multi else SPEEDS_INTRA)
    locals_ = [_local_order(_rotate_to_nodes(ring, topology), topology) if multi else list(ring) for ring in rings]
    channels = []
    for c in range(copies * len(rings)):
        local = locals_[c % len(rings)]
        channels.append(ChannelView(tuple(hex(d) for d in local),
                                    _net_dev(topology, local[0], c) if multi else None,
                                    _net_dev(topology, local[-1], c) if multi else None))
    intra = [topology.link(*e) for e in use if topology.node_of(e[0]) == topology.node_of(e[1])]
    if typeintra is None:
        typeintra = PATH_TYPES[max((_path_type_rank(l) for l in intra), default=0)]
    if typeinter is None:
        ends = [_nic(topology, local[i])[1] for local in locals_ for i in (0, -1)] if multi else []
        known = [nic.path_type for nic in ends if nic is not None and nic.path_type in TYPES_INTER]
        typeinter = max(known, key=PATH_TYPES.index) if known else "PIX"
    latency = max((topology.link(*e).alpha_us for e in use if topology.node_of(e[0]) != topology.node_of(e[1])),
                  default=0.0)
    return GraphView(tuple(channels), int(any(c.net_in != c.net_out for c in channels)), _fmt_GBps(speed),
                     _fmt_GBps(speed), _fmt_GBps(latency), typeintra, typeinter,
                     int(len({c.gpus for c in channels}) == 1))


_ENV = jinja2.Environment(loader=jinja2.PackageLoader("backends.nccl", "templates"), undefined=jinja2.StrictUndefined,
                          autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render_nccl_graph(view: GraphView) -> str:
    """The graph XML text (no prolog, two-space indentation) of a prepared view."""
    return _ENV.get_template("nccl_graph.xml.j2").render(graph=view)


def export_nccl_graph(schedule: Schedule, topology: Topology, typeintra: str | None = None,
                      typeinter: str | None = None) -> str:
    """The ring-shaped ``schedule`` as NCCL graph XML text (no prolog, two-space indentation).

    ``typeintra`` and ``typeinter`` (None: from the links and NICs) are NCCL's path types inside a node and from
    a GPU to its NIC. Raises BackendError for schedules that are not rings.

    >>> from synth.model.collectives import make_collective
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> from synth.model.topology import load_topology
    >>> coll = make_collective("allgather", 4)
    >>> ts = [Transfer(c, (c + k) % 4, (c + k + 1) % 4, k) for c in range(4) for k in range(3)]
    >>> print(export_nccl_graph(Schedule(coll, "ring-4", tuple(ts), 3), load_topology("ring-4")), end="")
    <graphs version="1">
      <graph id="0" pattern="4" crossnic="0" nchannels="1" speedintra="20" speedinter="20" latencyinter="0" typeintra="NVL" typeinter="PIX" samechannels="1">
        <channel>
          <gpu dev="0x0"/>
          <gpu dev="0x1"/>
          <gpu dev="0x2"/>
          <gpu dev="0x3"/>
        </channel>
      </graph>
    </graphs>
    """
    return render_nccl_graph(graph_view(schedule, topology, typeintra, typeinter))
