"""Order and time routed transfers: a list scheduler over the alpha-beta cost model, and step numbering.

Given routes (a tree per chunk), :func:`list_schedule` books transfers one at a time with the same
:class:`synth.schedule.costmodel.LinkClock` the replay uses, always taking the transfer that can start earliest (ties:
a sender's own chunks first on inter-node links when asked, then the longest remaining path below the
transfer, then a caller-given rank). :func:`number_steps` turns the booking order into schedule steps so that
the replay (:func:`synth.schedule.replay.replay_time`) books every link and switch port in exactly the same order and
therefore reproduces the same times: a transfer's step is larger than the step that delivered its chunk and
larger than the step of the previous transfer on each resource it uses.

This is also the "exact schedule" stage of the routed formulation: once routes and the order on every link and
port are fixed, the earliest start times the replay computes (a longest-path computation) are the best timing of
that order, so no separate LP is needed. Merging consecutive chunks on a high-alpha link into one message
(``alpha + k * beta``) never shortens a schedule under the default cost model, where alpha overlaps and only beta
occupies the link (DESIGN section 4); it would under ``alpha_occupies`` (TACCL's convention), which is not used
for synthesis.

Times in microseconds, sizes in bytes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from synth.model.collectives import Collective
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS, LinkClock
from synth.schedule.ir import COPY, Schedule, Transfer
from synth.model.topology import Topology

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
                  own_first: bool = False, rank: np.ndarray | None = None, notes: dict | None = None,
                  rule: str = "work") -> Schedule:
    """Book every routed transfer greedily (earliest start first) and return the timed, step-numbered Schedule.

    Parameters
    ----------
    route_links : sequence of tuples of link indices, one per chunk, parents before children.
    size_bytes : nccl-tests' size; a chunk is ``collective.chunk_bytes(size_bytes)`` bytes.
    own_first : on links between nodes, a sender's own chunks go before chunks it relays.
    rank : optional per-transfer tie-break (smaller first), e.g. an order from a MILP.
    rule : how transfers that can start at the same time are ranked after ``own_first``: ``"work"`` prefers
        the link whose busiest resource (the link or one of its switch ports) has the most unbooked work left,
        then the longest remaining path; ``"tail"`` uses the remaining path only.

    Every link keeps its waiting transfers (by ready time, and by priority once they can go); a global heap
    holds one entry per link, so booking a port re-ranks the links through that port, not every transfer
    waiting behind it.
    """
    nbytes = collective.chunk_bytes(size_bytes)
    cap = np.array([l.capacity_GBps for l in topology.links])
    alpha = np.array([l.alpha_us for l in topology.links])
    hop = alpha + nbytes / (cap * BYTES_PER_US_PER_GBPS)
    table = transfer_table(topology, collective, route_links, hop)
    n = len(table.chunk)
    nlinks = len(topology.links)
    clock = LinkClock(topology)
    link_ports = [l.ports for l in topology.links]
    port_bw = topology.port_capacity()
    inter = [topology.node_of(l.src) != topology.node_of(l.dst) for l in topology.links]
    own = [False] * n
    if own_first:
        for i in range(n):
            li = int(table.link[i])
            own[i] = inter[li] and topology.links[li].src in collective.chunks[int(table.chunk[i])].sources
    tie = rank if rank is not None else np.zeros(n)
    tail = table.tail_us
    link_of = [int(x) for x in table.link]
    # unbooked work (us) per resource; a transfer's resources are its link's, so urgency is per link
    res_of_link = []
    for li in range(nlinks):
        busy = nbytes / (cap[li] * BYTES_PER_US_PER_GBPS)
        res_of_link.append([(("l", li), busy)] + [(p, max(busy, nbytes / (port_bw[p] * BYTES_PER_US_PER_GBPS)))
                                                  for p in link_ports[li]])
    remaining: dict = {}
    for li in link_of:
        for k, b in res_of_link[li]:
            remaining[k] = remaining.get(k, 0.0) + b
    use_work = rule == "work"
    future: list[list] = [[] for _ in range(nlinks)]    # (ready, prio..., i)
    arrived: list[list] = [[] for _ in range(nlinks)]   # (prio..., i)
    version = [0] * nlinks
    arrived_at = [0.0] * nlinks
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)

    def prio(i: int):
        return (not own[i], -tail[i], tie[i], i)

    def link_key(li: int):
        """(est, own, -urgency, -tail, tie, i) of the best transfer on link ``li``, or None.

        ``arrived`` holds transfers ready by ``arrived_at[li]``; when that is later than the link's free time
        they are put back, so a transfer that becomes ready earlier is never overtaken."""
        free = clock.link_free[li]
        for p in link_ports[li]:
            free = max(free, clock.port_free.get(p, 0.0))
        fut, arr = future[li], arrived[li]
        if arr and arrived_at[li] > free + _EPS:
            for item in arr:
                heapq.heappush(fut, (ready[item[-1]],) + item)
            arr.clear()
        while fut and fut[0][0] <= free + _EPS:
            heapq.heappush(arr, heapq.heappop(fut)[1:])
        if arr:
            t = free
        elif fut:
            t = fut[0][0]
            while fut and fut[0][0] <= t + _EPS:
                heapq.heappush(arr, heapq.heappop(fut)[1:])
            arrived_at[li] = t
        else:
            return None
        top = arr[0]
        urgency = max(remaining[k] for k, _ in res_of_link[li]) if use_work else 0.0
        return (t, top[0], -urgency) + tuple(top[1:])

    heap = []

    def push(li: int):
        key = link_key(li)
        if key is not None:
            version[li] += 1
            heapq.heappush(heap, key + (li, version[li]))

    for i in range(n):
        if table.pred[i] < 0:
            heapq.heappush(future[link_of[i]], (0.0,) + prio(i))
    for li in range(nlinks):
        push(li)
    booked_order = []
    while heap:
        entry = heapq.heappop(heap)
        li, ver = entry[-2], entry[-1]
        if ver != version[li]:
            continue
        fresh = link_key(li)
        if fresh is None:
            continue
        if fresh[:3] > entry[:3]:
            version[li] += 1
            heapq.heappush(heap, fresh + (li, version[li]))
            continue
        i = heapq.heappop(arrived[li])[-1]
        res = clock.reserve(li, ready[i], nbytes)
        start[i], end[i] = res.start_us, res.arrival_us
        booked_order.append(i)
        for k, b in res_of_link[li]:
            remaining[k] -= b
        for k in table.children[i]:
            ready[k] = res.arrival_us
            heapq.heappush(future[link_of[k]], (res.arrival_us,) + prio(k))
            if link_of[k] != li:
                push(link_of[k])
        push(li)
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
        keys = [("l", li), *l.ports]
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


def book_in_order(topology: Topology, collective: Collective, route_links, size_bytes: float, method: str,
                  position: dict, notes: dict | None = None) -> Schedule:
    """Time routed transfers booked in a fixed order (e.g. a MILP's epochs) instead of greedily.

    ``position[(chunk, link)]`` ranks every routed transfer; a transfer must rank after the one that delivers
    its chunk to its source (true for start epochs of a time-expanded solution). Each is booked as soon as its
    chunk is at its source and its link and ports are free, as the replay does.
    """
    nbytes = collective.chunk_bytes(size_bytes)
    cap = np.array([l.capacity_GBps for l in topology.links])
    hop = np.array([l.alpha_us for l in topology.links]) + nbytes / (cap * BYTES_PER_US_PER_GBPS)
    table = transfer_table(topology, collective, route_links, hop)
    n = len(table.chunk)
    order = sorted(range(n), key=lambda i: (position[(int(table.chunk[i]), int(table.link[i]))], i))
    clock = LinkClock(topology)
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)
    done = np.zeros(n, dtype=bool)
    for i in order:
        p = table.pred[i]
        if p >= 0 and not done[p]:
            raise ValueError("book_in_order: a transfer is ranked before the one that delivers its chunk")
        res = clock.reserve(int(table.link[i]), ready[i], nbytes)
        start[i], end[i] = res.start_us, res.arrival_us
        done[i] = True
        for k in table.children[i]:
            ready[k] = res.arrival_us
    steps = number_steps(topology, table.link, table.pred, order)
    transfers = tuple(Transfer(int(table.chunk[i]), topology.links[table.link[i]].src,
                               topology.links[table.link[i]].dst, int(steps[i]), COPY, float(start[i]), float(end[i]))
                      for i in order)
    return Schedule(collective, topology.name, transfers, int(steps.max()) + 1 if n else 0, None, None, method,
                    notes=dict(notes or {}))
