"""Order and time routed transfers: a list scheduler over the alpha-beta cost model, and step numbering.

Given routes (a tree per chunk), :func:`list_schedule` books transfers one at a time with the same
:class:`synth.costmodel.LinkClock` the replay uses, always taking the transfer that can start earliest (ties:
a sender's own chunks first on inter-node links when asked, then the longest remaining path below the
transfer, then a caller-given rank). :func:`number_steps` turns the booking order into schedule steps so that
the replay (:func:`synth.execute.replay_time`) books every link and switch port in exactly the same order and
therefore reproduces the same times: a transfer's step is larger than the step that delivered its chunk and
larger than the step of the previous transfer on each resource it uses.

Times in microseconds, sizes in bytes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .collectives import Collective
from .costmodel import LinkClock
from .schedule import COPY, Schedule, Transfer
from .topology import Topology

_EPS = 1e-9


@dataclass(frozen=True)
class TransferTable:
    """Flat arrays describing routed transfers: chunk, link, the transfer that delivers the chunk to the link's
    source (-1 at a source) and the remaining-path time below each transfer (us)."""

    chunk: np.ndarray
    link: np.ndarray
    pred: np.ndarray
    tail_us: np.ndarray
    children: tuple[tuple[int, ...], ...]


def transfer_table(topology: Topology, collective: Collective, route_links, hop_us: np.ndarray) -> TransferTable:
    """Flatten per-chunk routes (tuples of link indices, parents first) into a :class:`TransferTable`."""
    chunk, link, pred = [], [], []
    for c, route in enumerate(route_links):
        at = {}
        for li in route:
            src = topology.links[li].src
            pred.append(at.get(src, -1))
            at[topology.links[li].dst] = len(chunk)
            chunk.append(c)
            link.append(li)
    chunk = np.array(chunk, dtype=np.int64)
    link = np.array(link, dtype=np.int64)
    pred = np.array(pred, dtype=np.int64)
    kids: list[list[int]] = [[] for _ in range(len(chunk))]
    for i, p in enumerate(pred):
        if p >= 0:
            kids[p].append(i)
    tail = np.zeros(len(chunk))
    for i in range(len(chunk) - 1, -1, -1):   # children come after parents within a chunk
        tail[i] = hop_us[link[i]] + max((tail[k] for k in kids[i]), default=0.0)
    return TransferTable(chunk, link, pred, tail, tuple(tuple(k) for k in kids))


def list_schedule(topology: Topology, collective: Collective, route_links, size_bytes: float, method: str,
                  own_first: bool = False, rank: np.ndarray | None = None, notes: dict | None = None) -> Schedule:
    """Book every routed transfer greedily (earliest start first) and return the timed, step-numbered Schedule.

    Parameters
    ----------
    route_links : sequence of tuples of link indices, one per chunk, parents before children.
    size_bytes : nccl-tests' size; a chunk is ``collective.chunk_bytes(size_bytes)`` bytes.
    own_first : on links between nodes, a sender's own chunks go before chunks it relays.
    rank : optional per-transfer tie-break (smaller first), e.g. an order from a MILP.
    """
    nbytes = collective.chunk_bytes(size_bytes)
    cap = np.array([l.capacity_GBps for l in topology.links])
    alpha = np.array([l.alpha_us for l in topology.links])
    hop = alpha + nbytes / (cap * 1e3)
    table = transfer_table(topology, collective, route_links, hop)
    n = len(table.chunk)
    clock = LinkClock(topology)
    link_ports = [((l.switch, l.egress_port, "egress"), (l.switch, l.ingress_port, "ingress"))
                  if l.switch is not None else () for l in topology.links]
    inter = np.array([topology.node_of(l.src) != topology.node_of(l.dst) for l in topology.links])
    src_rank = np.array([l.src for l in topology.links])
    own = np.zeros(n, dtype=bool)
    if own_first:
        for i in range(n):
            li = table.link[i]
            own[i] = inter[li] and src_rank[li] in collective.chunks[table.chunk[i]].sources
    tie = rank if rank is not None else np.zeros(n)
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)

    def earliest(i: int) -> float:
        li = table.link[i]
        t = max(ready[i], clock.link_free[li])
        for p in link_ports[li]:
            t = max(t, clock.port_free.get(p, 0.0))
        return t

    heap = [(0.0, not own[i], -table.tail_us[i], tie[i], i) for i in range(n) if table.pred[i] < 0]
    heapq.heapify(heap)
    booked_order = []
    while heap:
        key, o, t, r, i = heapq.heappop(heap)
        est = earliest(i)
        if est > key + _EPS:
            heapq.heappush(heap, (est, o, t, r, i))
            continue
        res = clock.reserve(int(table.link[i]), ready[i], nbytes)
        start[i], end[i] = res.start_us, res.arrival_us
        booked_order.append(i)
        for k in table.children[i]:
            ready[k] = res.arrival_us
            heapq.heappush(heap, (earliest(k), not own[k], -table.tail_us[k], tie[k], k))
    steps = number_steps(topology, table.link, table.pred, booked_order)
    transfers = tuple(Transfer(int(table.chunk[i]), topology.links[table.link[i]].src,
                               topology.links[table.link[i]].dst, int(steps[i]), COPY, float(start[i]), float(end[i]))
                      for i in booked_order)
    return Schedule(collective, topology.name, transfers, int(steps.max()) + 1 if n else 0, None, None, method,
                    notes=dict(notes or {}))


def number_steps(topology: Topology, link: np.ndarray, pred: np.ndarray, order) -> np.ndarray:
    """Steps for transfers booked in ``order``: above the delivering transfer's step, and above the step of the
    previous transfer on the same link or switch port (so no two transfers share a resource within a step and
    the order on every resource is fixed by the steps alone, whatever the size)."""
    steps = np.zeros(len(link), dtype=np.int64)
    last: dict = {}
    for i in order:
        li = int(link[i])
        l = topology.links[li]
        keys = [("l", li)]
        if l.switch is not None:
            keys += [("p", l.switch, l.egress_port, "e"), ("p", l.switch, l.ingress_port, "i")]
        s = steps[pred[i]] + 1 if pred[i] >= 0 else 0
        for k in keys:
            s = max(s, last.get(k, -1) + 1)
        steps[i] = s
        for k in keys:
            last[k] = s
    return steps


def schedule_order_table(topology: Topology, schedule: Schedule):
    """For a non-combining schedule whose chunks arrive at most once per rank: per transfer (in replay order)
    its link index and the index of the transfer that delivered its chunk to its source (-1 at a source)."""
    ordered = schedule.ordered()
    at = {}
    link = np.zeros(len(ordered), dtype=np.int64)
    pred = np.full(len(ordered), -1, dtype=np.int64)
    for i, t in enumerate(ordered):
        link[i] = topology.link_index[(t.src, t.dst)]
        pred[i] = at.get((t.src, t.chunk), -1)
        at[(t.dst, t.chunk)] = i
    return ordered, link, pred
