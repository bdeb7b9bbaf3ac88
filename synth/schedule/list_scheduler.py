"""Order and time routed transfers: a list scheduler over the alpha-beta cost model and the runtime's FIFOs.

Given routes (a tree per chunk), :func:`list_schedule` books transfers one at a time with the same
:class:`synth.schedule.costmodel.LinkClock` the replay uses, always taking the transfer that can start earliest (ties:
a sender's own chunks first on inter-node links when asked, then the longest remaining path below the
transfer, then a caller-given rank). :func:`number_steps` turns the booking order into schedule steps so that
the replay (:func:`synth.schedule.replay.replay_time`) books every link and switch port in exactly the same order and
therefore reproduces the same times: a transfer's step is larger than the steps that delivered its chunk and
larger than the step of the previous transfer on each resource it uses.

Routes are out-trees (copies: a chunk spreads from its sources) or, for reductions, in-trees (each rank sends its
partial sum on once every partial sum routed into it has arrived): a transfer waits for every transfer of its
chunk into its source, so one rule serves both.

**The runtime's FIFO** (DESIGN section 7). An MSCCL connection holds at most :data:`RUNTIME_FIFO_DEPTH` messages
that the receiver has not taken (2 with the Simple protocol); the receiving threadblock takes its messages in
order, and a reduction into a chunk's partial sum also waits for the previous one into the same chunk. A plan
that ignores this (the replay's unbounded buffers) can look fast and run slow: a reversed tree schedule stalls
whenever partial sums arrive long before the ones they must follow. So, unless ``fifo_depth=None``, every
transfer also has a *taken* time (its arrival, after the previous message on its connection and, for a
reduction, the previous reduction into the same chunk at its receiver), data is usable from its taken time on,
and a message starts only once the one ``fifo_depth`` places earlier on its connection has been taken: the
plan is timed as the runtime runs the plain lowering (one threadblock per connection end).

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
from synth.schedule.ir import COPY, REDUCE, Schedule, Transfer
from synth.model.topology import Topology

_EPS = 1e-9
# Messages an MSCCL connection holds before a send waits, with the Simple protocol the synthesizer writes
# (DESIGN section 7; backends.msccl.interpret.RUNTIME_FIFO_DEPTH holds every protocol's, and a test keeps them equal).
RUNTIME_FIFO_DEPTH = 2


@dataclass(frozen=True)
class TransferTable:
    """Flat arrays describing routed transfers: chunk, link, the transfers that deliver the chunk to the link's
    source (none at a source; one on an out-tree, every child's on an in-tree), the transfers that wait for each
    one, and the remaining-path time below each transfer (us)."""

    chunk: np.ndarray
    link: np.ndarray
    preds: tuple[tuple[int, ...], ...]
    tail_us: np.ndarray
    children: tuple[tuple[int, ...], ...]


def transfer_table(topology: Topology, route_links, hop_us: np.ndarray) -> TransferTable:
    """Flatten per-chunk routes (tuples of link indices forming an out-tree or an in-tree) into a
    :class:`TransferTable`; raises ValueError when a route's transfers wait for each other in a cycle."""
    chunk, link, preds = [], [], []
    for c, route in enumerate(route_links):
        first = len(chunk)
        into: dict[int, list[int]] = {}
        for k, li in enumerate(route):
            into.setdefault(topology.links[li].dst, []).append(first + k)
            chunk.append(c)
            link.append(li)
        preds.extend(tuple(into.get(topology.links[li].src, ())) for li in route)
    n = len(chunk)
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            kids[p].append(i)
    order = _topological(preds, kids)
    link_arr = np.array(link, dtype=np.int64)
    tail = np.zeros(n)
    for i in reversed(order):
        tail[i] = hop_us[link_arr[i]] + max((tail[k] for k in kids[i]), default=0.0)
    return TransferTable(np.array(chunk, dtype=np.int64), link_arr, tuple(preds), tail,
                         tuple(tuple(k) for k in kids))


def _topological(preds, kids) -> list[int]:
    waiting = [len(p) for p in preds]
    order = [i for i, w in enumerate(waiting) if w == 0]
    for i in order:           # grows while it is walked
        for k in kids[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                order.append(k)
    if len(order) != len(preds):
        raise ValueError("routes whose transfers wait for each other in a cycle")
    return order


def list_schedule(topology: Topology, collective: Collective, route_links, size_bytes: float, method: str,
                  own_first: bool = False, rank: np.ndarray | None = None, notes: dict | None = None,
                  rule: str = "work", fifo_depth: int | None = RUNTIME_FIFO_DEPTH) -> Schedule:
    """Book every routed transfer greedily (earliest start first) and return the timed, step-numbered Schedule.

    Parameters
    ----------
    route_links : sequence of tuples of link indices, one per chunk: an out-tree from the chunk's sources, or
        for a combining collective an in-tree towards its destination (every transfer is then a reduction).
    size_bytes : nccl-tests' size; a chunk is ``collective.chunk_bytes(size_bytes)`` bytes.
    own_first : on links between nodes, a sender's own chunks go before chunks it relays.
    rank : optional per-transfer tie-break (smaller first), e.g. an order from a MILP.
    rule : how transfers that can start at the same time are ranked after ``own_first``: ``"work"`` prefers
        the link whose busiest resource (the link or one of its switch ports) has the most unbooked work left,
        then the longest remaining path; ``"tail"`` uses the remaining path only; ``"rank"`` uses ``rank``
        first, then the remaining path; ``"deadline"`` takes ``rank`` as each transfer's due time (us) and
        prefers the least slack, ``rank`` minus the remaining path (a chunk with far to go leaves first).
    fifo_depth : messages a connection holds before its sender waits (the runtime's, by default); None books
        as the replay does, with unbounded buffers and data usable on arrival.

    Every link keeps its waiting transfers (by ready time, and by priority once they can go); a global heap
    holds one entry per link, so booking a port re-ranks the links through that port, not every transfer
    waiting behind it.
    """
    if collective.combining and collective.name == "allreduce":
        raise ValueError("allreduce is scheduled as its parts (synth.schedule.transforms.Concatenation)")
    op = REDUCE if collective.combining else COPY
    nbytes = collective.chunk_bytes(size_bytes)
    cap = np.array([l.capacity_GBps for l in topology.links])
    alpha = np.array([l.alpha_us for l in topology.links])
    hop = alpha + nbytes / (cap * BYTES_PER_US_PER_GBPS)
    table = transfer_table(topology, route_links, hop)
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
        res_of_link.append([(("l", li), busy)] + [(p, nbytes / (port_bw[p] * BYTES_PER_US_PER_GBPS))
                                                  for p in link_ports[li]])
    remaining: dict = {}
    for li in link_of:
        for k, b in res_of_link[li]:
            remaining[k] = remaining.get(k, 0.0) + b
    if rule not in ("work", "tail", "rank", "deadline", "sequence"):
        raise ValueError(f"unknown rule {rule!r}; use work, tail, rank, deadline or sequence")
    use_work = rule == "work"
    # the sequence each link's sends are issued in: a rank's sends through one switch port, else the link's own
    sequencer: dict = {}
    seq_of: dict[int, int] = {}
    seq_links: list[list[int]] = []
    for li in sorted(set(link_of)):
        l = topology.links[li]
        q = sequencer.setdefault((l.src, l.sender_port) if l.sender_port is not None else ("l", li), len(sequencer))
        if q == len(seq_links):
            seq_links.append([])
        seq_of[li] = q
        seq_links[q].append(li)
    seq_free = [0.0] * len(sequencer)
    in_sequence = rule == "sequence"
    if in_sequence:       # each sequence's transfers in rank order, the next one waits for its data
        order_of: list[list[int]] = [[] for _ in sequencer]
        for i in sorted(range(n), key=lambda i: (tie[i], i)):
            order_of[seq_of[link_of[i]]].append(i)
        next_of = [0] * len(sequencer)
    future: list[list] = [[] for _ in range(nlinks)]    # (ready, prio..., i)
    arrived: list[list] = [[] for _ in range(nlinks)]   # (prio..., i), ready by arrived_at
    arrived_at = [0.0] * nlinks
    version = [0] * len(sequencer)
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)
    unmet = [len(p) for p in table.preds]
    fifo = _Fifos(nlinks, fifo_depth)
    dst_of = [topology.links[li].dst for li in range(nlinks)]

    by_rank = rule == "rank"
    by_deadline = rule == "deadline"

    def prio(i: int):
        if by_deadline:
            return (not own[i], tie[i] - tail[i], i)
        return (not own[i], tie[i], -tail[i], i) if by_rank else (not own[i], -tail[i], tie[i], i)

    def put_back(li: int, at: float) -> None:
        """Transfers sorted by priority as ready by a time later than ``at`` wait by ready time again, so one
        that is ready earlier is never overtaken."""
        arr = arrived[li]
        if arr and arrived_at[li] > at + _EPS:
            for item in arr:
                heapq.heappush(future[li], (ready[item[-1]],) + item)
            arr.clear()

    def available_us(li: int, free: float) -> float | None:
        """When link ``li`` could issue its next message once its sequence is free at ``free`` (None: nothing
        waits on it)."""
        at = max(free, fifo.room_us(li))
        put_back(li, at)
        if arrived[li]:
            return at
        return max(at, future[li][0][0]) if future[li] else None

    def best_at(li: int, at: float):
        """The best transfer on ``li`` ready by ``at``: its waiting ones are sorted by priority from then on."""
        fut, arr = future[li], arrived[li]
        put_back(li, at)
        while fut and fut[0][0] <= at + _EPS:
            heapq.heappush(arr, heapq.heappop(fut)[1:])
        arrived_at[li] = at
        return arr[0]

    def decide(q: int):
        """(issue time, key, link, transfer) of sequence ``q``'s next send, or None: the sequence issues as soon
        as one of its links has a transfer ready and room in its FIFO; among those, the one that can start first
        (its link and ports free), then by the rule. With ``rule="sequence"`` the next is the next by rank, once
        its data is there."""
        free = seq_free[q]
        if in_sequence:
            if next_of[q] == len(order_of[q]):
                return None
            i = order_of[q][next_of[q]]
            if unmet[i]:
                return None
            li = link_of[i]
            return max(free, ready[i], fifo.room_us(li)), (tie[i], i), li, i
        times = [(at, li) for li in seq_links[q] if (at := available_us(li, free)) is not None]
        if not times:
            return None
        at = min(t for t, _ in times)
        best = None
        for t, li in times:
            if t > at + _EPS:
                continue
            top = best_at(li, at)
            est = max(at, clock.link_free[li], *(clock.port_free.get(p, 0.0) for p in link_ports[li]))
            urgency = max(remaining[k] for k, _ in res_of_link[li]) if use_work else 0.0
            key = (est, top[0], -urgency) + tuple(top[1:])
            if best is None or key < best[0]:
                best = (key, li, top[-1])
        return (at,) + best

    heap = []

    def push(q: int):
        decision = decide(q)
        version[q] += 1
        if decision is not None:
            heapq.heappush(heap, (decision[0],) + decision[1] + (q, version[q]))

    for i in range(n):
        if not unmet[i] and not in_sequence:
            heapq.heappush(future[link_of[i]], (0.0,) + prio(i))
    for q in range(len(sequencer)):
        if seq_links[q]:
            push(q)
    booked_order = []
    while heap:
        entry = heapq.heappop(heap)
        q, ver = entry[-2], entry[-1]
        if ver != version[q]:
            continue
        # the ports may have been booked since: choose again at the same issue time (it only moves with q's links)
        at, _, li, i = decide(q)
        if in_sequence:
            next_of[q] += 1
        else:
            heapq.heappop(arrived[li])
        res = clock.reserve(li, at, nbytes)
        seq_free[q] = res.busy_until_us
        start[i], end[i] = res.start_us, res.arrival_us
        usable = fifo.take(li, (dst_of[li], int(table.chunk[i])) if op == REDUCE else None, res.arrival_us)
        booked_order.append(i)
        for k, b in res_of_link[li]:
            remaining[k] -= b
        woken = set()
        for k in table.children[i]:
            ready[k] = max(ready[k], usable)
            unmet[k] -= 1
            if not unmet[k]:
                if not in_sequence:
                    heapq.heappush(future[link_of[k]], (ready[k],) + prio(k))
                woken.add(seq_of[link_of[k]])
        woken.add(q)
        for w in woken:
            push(w)
    if len(booked_order) < n:
        raise ValueError(f"rule 'sequence': the ranks make {n - len(booked_order)} transfers wait for each other")
    steps = number_steps(topology, table.link, table.preds, booked_order,
                         table.chunk if op == REDUCE else None)
    transfers = tuple(Transfer(int(table.chunk[i]), topology.links[table.link[i]].src,
                               topology.links[table.link[i]].dst, int(steps[i]), op, float(start[i]), float(end[i]))
                      for i in booked_order)
    return Schedule(collective, topology.name, transfers, int(steps.max()) + 1 if n else 0, None, None, method,
                    notes=dict(notes or {}))


def reverse_in_time(forward: Schedule, topology: Topology, collective: Collective, size_bytes: float, method: str,
                    fifo_depth: int | None = RUNTIME_FIFO_DEPTH, rule: str = "rank") -> Schedule:
    """An in-tree ``collective`` on ``topology`` (ReduceScatter, Reduce, Gather) from the schedule ``forward`` of
    its broadcast-type dual on the reversed topology: every chunk takes the reversed
    route, and the transfers are booked forward in time (:func:`list_schedule`, with the runtime's FIFOs),
    preferring the order of the time reversal of ``forward``.

    The pure time reversal (:func:`synth.schedule.transforms.reverse_schedule`) replays as fast as ``forward``
    but ignores that a receiver applies the partial sums of a chunk one after the other and takes each
    connection's messages in order: at the runtime's FIFO depth a reversed tree schedule stalls (dgx1
    ReduceScatter 1 GB simulated 27% slower than replayed). Booked forward, the plan is what runs, and taking
    the reversal's order where transfers compete keeps the forward schedule's pipelining. Chunk ids are those
    of ``forward`` (true of the duals of :mod:`synth.schedule.transforms`). ``rule="deadline"`` takes the
    reversed start times as due times and books the least slack first (:func:`list_schedule`).
    """
    ordered = forward.ordered()
    ends = [t.end_us for t in ordered]
    timed = all(e is not None for e in ends)
    span = max(ends, default=0.0) if timed else 0.0
    routes: list[list[int]] = [[] for _ in collective.chunks]
    order: dict = {}
    for position, t in enumerate(ordered):
        li = topology.link_index[(t.dst, t.src)]
        routes[t.chunk].append(li)
        # reversed start time, else reversed issue order
        order[(t.chunk, li)] = span - t.end_us if timed else -position
    rank = np.array([order[(c, li)] for c, route in enumerate(routes) for li in route])
    return list_schedule(topology, collective, [tuple(r) for r in routes], size_bytes, method, rank=rank,
                         rule=rule, fifo_depth=fifo_depth, notes=forward.notes)


class _Fifos:
    """The runtime's connections as the plan sees them: when each message is taken by its receiver, and so when
    the next message has room (``depth=None``: unbounded buffers, data usable on arrival, as the replay)."""

    def __init__(self, num_links: int, depth: int | None):
        self.depth = depth
        self.taken: list[list[float]] = [[] for _ in range(num_links)]
        self.reduced: dict = {}      # (rank, chunk) -> when the last reduction into it was taken

    def room_us(self, li: int) -> float:
        """Earliest start of the next message on link ``li``."""
        taken = self.taken[li]
        if self.depth is None or len(taken) < self.depth:
            return 0.0
        return taken[len(taken) - self.depth]

    def take(self, li: int, reduces_into, arrival_us: float) -> float:
        """Book the taking of a message that arrives at ``arrival_us``; returns when its data is usable.
        ``reduces_into`` is the (rank, chunk) a reduction adds to (None for a copy)."""
        if self.depth is None:
            return arrival_us
        taken = self.taken[li]
        at = max(arrival_us, taken[-1] if taken else 0.0)
        if reduces_into is not None:
            at = max(at, self.reduced.get(reduces_into, 0.0))
            self.reduced[reduces_into] = at
        taken.append(at)
        return at


def number_steps(topology: Topology, link: np.ndarray, preds, order, reduced_chunk: np.ndarray | None = None
                 ) -> np.ndarray:
    """Steps for transfers booked in ``order``: above the steps of the transfers that deliver their chunk, and
    above the step of the previous transfer on the same link or switch port (so no two transfers share a resource
    within a step and the order on every resource is fixed by the steps alone, whatever the size). With
    ``reduced_chunk`` (the chunk of every transfer of a reduction) the reductions into one chunk at one rank also
    follow the booking order, which is the order the lowering applies them in."""
    steps = np.zeros(len(link), dtype=np.int64)
    last: dict = {}
    for i in order:
        li = int(link[i])
        l = topology.links[li]
        keys = [("l", li), *l.ports]
        if reduced_chunk is not None:
            keys.append(("r", l.dst, int(reduced_chunk[i])))
        s = max((steps[p] + 1 for p in preds[i]), default=0)
        for k in keys:
            s = max(s, last.get(k, -1) + 1)
        steps[i] = s
        for k in keys:
            last[k] = s
    return steps


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
    table = transfer_table(topology, route_links, hop)
    n = len(table.chunk)
    order = sorted(range(n), key=lambda i: (position[(int(table.chunk[i]), int(table.link[i]))], i))
    clock = LinkClock(topology)
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)
    done = np.zeros(n, dtype=bool)
    for i in order:
        if not all(done[p] for p in table.preds[i]):
            raise ValueError("book_in_order: a transfer is ranked before the one that delivers its chunk")
        res = clock.reserve(int(table.link[i]), ready[i], nbytes)
        start[i], end[i] = res.start_us, res.arrival_us
        done[i] = True
        for k in table.children[i]:
            ready[k] = max(ready[k], res.arrival_us)
    steps = number_steps(topology, table.link, table.preds, order)
    transfers = tuple(Transfer(int(table.chunk[i]), topology.links[table.link[i]].src,
                               topology.links[table.link[i]].dst, int(steps[i]), COPY, float(start[i]), float(end[i]))
                      for i in order)
    return Schedule(collective, topology.name, transfers, int(steps.max()) + 1 if n else 0, None, None, method,
                    notes=dict(notes or {}))
