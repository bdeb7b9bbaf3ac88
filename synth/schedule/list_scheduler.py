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

**Shared ports.** The program orders one rank's sends through a switch port (dependencies, in the lowering), but
nothing orders the sends of different ranks that meet at a port (two GPUs behind one NIC, fifteen senders into one
GPU's NVSwitch ingress): the runtime serves them as they come. So the greedy booking only chooses the order, and
the order is then timed as the runtime runs it (:func:`_time_in_sequence`); the greedy times alone were 9-35%
optimistic on two-node machines (dgx2-2node-tecc Allreduce 1 GB planned at 98.8% of the limit ran at 89.8%).

**Channels.** The writer lowers a connection on one channel or spreads it over several (chunk ``c`` on channel
``c % k``), each a threadblock with a FIFO of its own; on a link without a switch port nothing orders them, so the
link serves whichever is ready. Where asked (:func:`list_schedule`; copies only), the order is timed on 1, 2, 4
and 8 channels (:data:`PLAN_CHANNELS`) and the fastest timing is the plan; its steps follow that timing's booking
order, so a one-channel lowering runs the same order. :func:`retime` does the same for a schedule made otherwise (a
concatenation's parts: dgx1 Allreduce 1 MB replayed in the parts' step order at 14.6 us, ran at 13.9 us, retimed
13.9 us).

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
from dataclasses import dataclass, replace

import numpy as np

from synth.model.collectives import Collective
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS, LinkClock
from synth.schedule.ir import COPY, REDUCE, Schedule, Transfer
from synth.model.topology import Topology

_EPS = 1e-9
# Messages an MSCCL connection holds before a send waits, with the Simple protocol the synthesizer writes
# (DESIGN section 7; backends.msccl.interpret.RUNTIME_FIFO_DEPTH holds every protocol's, and a test keeps them equal).
RUNTIME_FIFO_DEPTH = 2
# How the plan's timing cuts connections over channels (:func:`_time_in_sequence`)
CUTS = ("chunk", "position", "fused")
# Channels per connection the plan is timed on (the writer lowers on one and on wider spreads, and the simulator
# picks): the fastest timing decides the plan's order. Four cover ring-4 Allreduce as ReduceScatter + Allgather
# (4 pieces: on two channels 40.7 us, its file 35.5 us on four), eight dgx-h100 Broadcast 1 MB (on four 4.95 us,
# its file 4.80 us on eight, planned on eight 4.86 us).
PLAN_CHANNELS = (1, 2, 4, 8)


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


def hop_times_us(topology: Topology, nbytes: float) -> np.ndarray:
    """Per link, the time one message of ``nbytes`` takes from its start to its arrival: alpha plus its bytes at
    the link's bandwidth (us)."""
    cap = np.array([l.capacity_GBps for l in topology.links])
    return np.array([l.alpha_us for l in topology.links]) + nbytes / (cap * BYTES_PER_US_PER_GBPS)


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
    hop = hop_us.tolist()
    tail = [0.0] * n
    for i in reversed(order):
        tail[i] = hop[link[i]] + max((tail[k] for k in kids[i]), default=0.0)
    return TransferTable(np.array(chunk, dtype=np.int64), np.array(link, dtype=np.int64), tuple(preds),
                         np.array(tail), tuple(tuple(k) for k in kids))


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
                  rule: str = "work", fifo_depth: int | None = RUNTIME_FIFO_DEPTH,
                  channels: tuple[int, ...] = (1,), cut: str = "chunk") -> Schedule:
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
        ``"sequence"``: no greedy choice, each sender's sends through one port go in ``rank`` order.
    fifo_depth : messages a connection holds before its sender waits (the runtime's, by default); None books
        as the replay does, with unbounded buffers and data usable on arrival.
    channels : the channel counts the order is timed on with the runtime's FIFOs; the fastest timing is the plan
        (:func:`_fastest_in_sequence`). One by default; :data:`PLAN_CHANNELS` where it was measured to plan what
        runs (copies). Not for reductions: partial sums into one chunk that come on several channels wait for each
        other across threadblocks, which the timing does not see (2 x dgx2 ReduceScatter 1 MB timed on two
        channels was planned 6% faster than it ran), nor for the forward schedule a reduction is reversed from
        (dgx-h100 Reduce 1 MB reversed from a Broadcast so ordered ran 19% slower).
    cut : how the timing cuts connections over channels, as a lowering does (:data:`CUTS`): ``"chunk"`` (each
        sender's sends through a port in order, whatever their channel), ``"position"`` (the plain lowering of
        connections longer than a threadblock holds) or ``"fused"`` (fused chains); see :func:`_time_in_sequence`.

    Every link keeps its waiting transfers (by ready time, and by priority once they can go); a global heap
    holds one entry per link, so booking a port re-ranks the links through that port, not every transfer
    waiting behind it. The greedy booking chooses the order; with the runtime's FIFOs the order is then timed as
    the runtime runs it (:func:`_time_in_sequence`): each rank sends through a port in that order, and a port
    that several ranks share serves their sends as they come.
    """
    if collective.combining and collective.name == "allreduce":
        raise ValueError("allreduce is scheduled as its parts (synth.schedule.transforms.Concatenation)")
    if rule not in ("work", "tail", "rank", "deadline", "sequence"):
        raise ValueError(f"unknown rule {rule!r}; use work, tail, rank, deadline or sequence")
    op = REDUCE if collective.combining else COPY
    nbytes = collective.chunk_bytes(size_bytes)
    table = transfer_table(topology, route_links, hop_times_us(topology, nbytes))
    n = len(table.chunk)
    tie = rank if rank is not None else np.zeros(n)
    chained = None
    if rule != "sequence" and not own_first and (fifo_depth is None or (channels == (1,) and cut == "chunk")):
        chained = _along_one_chain(topology, table, nbytes, op, tie, rule, fifo_depth)
    if chained is not None:
        order, start, end = chained
    elif rule == "sequence":
        order = sorted(range(n), key=lambda i: (tie[i], i))
    else:
        order, start, end = _book_greedily(topology, collective, table, nbytes, op, own_first, tie, rule,
                                           fifo_depth)
    if chained is None and (rule == "sequence" or fifo_depth is not None):
        order, start, end = _fastest_in_sequence(topology, table, nbytes, op, order, fifo_depth, channels, cut)
    steps = number_steps(topology, table.link, table.preds, order, table.chunk if op == REDUCE else None)
    return Schedule(collective, topology.name, _transfers(topology, table, order, steps, op, start, end),
                    int(steps.max()) + 1 if n else 0, None, None, method, notes=dict(notes or {}))


def _transfers(topology: Topology, table: TransferTable, order, steps: np.ndarray, op: str, start, end
               ) -> tuple[Transfer, ...]:
    """The booked transfers in ``order``, each at its step, start and arrival (us). (Read as Python numbers in
    bulk: a schedule holds tens of thousands.)"""
    links = topology.links
    chunk, link, step = table.chunk.tolist(), table.link.tolist(), steps.tolist()
    start, end = np.asarray(start, dtype=float).tolist(), np.asarray(end, dtype=float).tolist()
    return tuple(Transfer(chunk[i], links[link[i]].src, links[link[i]].dst, step[i], op, start[i], end[i])
                 for i in order)


def _book_greedily(topology: Topology, collective: Collective, table: TransferTable, nbytes: float, op: str,
                   own_first: bool, tie: np.ndarray, rule: str, fifo_depth: int | None):
    """The greedy booking of :func:`list_schedule`: (booking order, start us, arrival us) per transfer.

    Per-transfer values are Python lists, not numpy arrays: the loop reads them one at a time, tens of
    thousands of times (numpy's scalar reads were a third of the scheduler's time)."""
    n = len(table.chunk)
    nlinks = len(topology.links)
    cap = [l.capacity_GBps for l in topology.links]
    clock = LinkClock(topology)
    port_free = clock.port_free
    link_ports = [l.ports for l in topology.links]
    port_bw = topology.port_capacity()
    inter = [topology.node_of(l.src) != topology.node_of(l.dst) for l in topology.links]
    link_of = table.link.tolist()
    chunk_of = table.chunk.tolist()
    own = [False] * n
    if own_first:
        for i in range(n):
            li = link_of[i]
            own[i] = inter[li] and topology.links[li].src in collective.chunks[chunk_of[i]].sources
    tail = table.tail_us.tolist()
    tie = np.asarray(tie).tolist()
    # unbooked work (us) per resource; a transfer's resources are its link's, so urgency is per link
    res_of_link = []
    for li in range(nlinks):
        busy = nbytes / (cap[li] * BYTES_PER_US_PER_GBPS)
        res_of_link.append([(("l", li), busy)] + [(p, nbytes / (port_bw[p] * BYTES_PER_US_PER_GBPS))
                                                  for p in link_ports[li]])
    resources_of_link = [[k for k, _ in resources] for resources in res_of_link]
    remaining: dict = {}
    for li in link_of:
        for k, b in res_of_link[li]:
            remaining[k] = remaining.get(k, 0.0) + b
    use_work = rule == "work"
    future: list[list] = [[] for _ in range(nlinks)]    # (ready, prio..., i)
    arrived: list[list] = [[] for _ in range(nlinks)]   # (prio..., i)
    version = [0] * nlinks
    arrived_at = [0.0] * nlinks
    ready = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    unmet = [len(p) for p in table.preds]
    fifo = _Fifos(nlinks, fifo_depth)
    dst_of = [topology.links[li].dst for li in range(nlinks)]

    prio = _priority(rule, own, tie, tail)

    def link_key(li: int):
        """(est, own, -urgency, -tail, tie, i) of the best transfer on link ``li``, or None.

        ``arrived`` holds transfers ready by ``arrived_at[li]``; when that is later than the link's free time
        they are put back, so a transfer that becomes ready earlier is never overtaken."""
        # (two-value maxima spelled out in the loops: the builtin's call costs eight times the comparison)
        free, room = clock.link_free[li], fifo.room_us(li)
        free = room if room > free else free
        for p in link_ports[li]:
            held = port_free.get(p, 0.0)
            free = held if held > free else free
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
        urgency = max(map(remaining.__getitem__, resources_of_link[li])) if use_work else 0.0
        return (t, top[0], -urgency) + top[1:]

    heap = []

    def push(li: int):
        key = link_key(li)
        if key is not None:
            version[li] += 1
            heapq.heappush(heap, key + (li, version[li]))

    for i in range(n):
        if not unmet[i]:
            heapq.heappush(future[link_of[i]], (0.0,) + prio(i))
    for li in range(nlinks):
        push(li)
    booked_order = []
    children = table.children
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
        room = fifo.room_us(li)
        res = clock.reserve(li, room if room > ready[i] else ready[i], nbytes)
        start[i], end[i] = res.start_us, res.arrival_us
        usable = fifo.take(li, (dst_of[li], chunk_of[i]) if op == REDUCE else None, res.arrival_us)
        booked_order.append(i)
        for k, b in res_of_link[li]:
            remaining[k] -= b
        for k in children[i]:
            if usable > ready[k]:
                ready[k] = usable
            unmet[k] -= 1
            if not unmet[k]:
                heapq.heappush(future[link_of[k]], (ready[k],) + prio(k))
                if link_of[k] != li:
                    push(link_of[k])
        push(li)
    return booked_order, np.array(start), np.array(end)


def _priority(rule: str, own: list, tie: list, tail: list):
    """How the greedy booking ranks transfers that can start at once (smaller first): ``prio(i)``, a tuple (see
    ``rule`` in :func:`list_schedule`)."""
    if rule == "deadline":
        return lambda i: (not own[i], tie[i] - tail[i], i)
    if rule == "rank":
        return lambda i: (not own[i], tie[i], -tail[i], i)
    return lambda i: (not own[i], -tail[i], tie[i], i)


# A chain's fast path (:func:`_along_one_chain`) needs a link's messages to arrive further apart than the greedy
# booking's tolerance for "ready at once" (``_EPS``): each holds its link at least this long (us)
_CHAIN_MIN_BUSY_US = 1e-6


def _along_one_chain(topology: Topology, table: TransferTable, nbytes: float, op, tie, rule: str,
                     fifo_depth: int | None):
    """(booking order, start us, arrival us) of :func:`_book_greedily` then, with the runtime's FIFOs, of
    :func:`_time_in_sequence` on one channel, cut by chunk, computed directly where every chunk takes the same chain
    of links and no two of its links share a switch port (a Broadcast down one chain: dgx2 1 GB, 2048 chunks on 15
    hops, 0.3 s of the general booking); None elsewhere, and wherever the shortcut could differ (then the general
    booking runs).

    On such a chain each link only ever holds the chain's messages, one per chunk, and they reach a link in the
    order they left the link before (a relay forwards each as it is taken, and a FIFO keeps the order): so the
    greedy booking sends the chunks down every link in its ranking at the first hop (all ready at once), provided
    that ranking is the same at every hop and consecutive messages arrive more than its tolerance apart. The timing
    in that order is then a recurrence per link (each message starts once its chunk is there, or taken at the
    link's source with FIFOs, and the message before it is on the wire, and a FIFO has room). Both bookings pop
    from a heap that only ever gets later entries than the one popped, so they book in the order of their keys:
    :func:`_time_in_sequence` by (start, sequence, index); :func:`_book_greedily`, with unbounded buffers
    (``fifo_depth=None``), by its links' keys (earliest start, the link's unbooked work under rule "work", the
    ranking). Copies only.
    """
    n = len(table.chunk)
    if op != COPY or (fifo_depth is not None and fifo_depth < 1) or n == 0:
        return None
    link_of = table.link.tolist()
    chunk_of = table.chunk.tolist()
    preds, children = table.preds, table.children
    # the first chunk's transfers: a path (one starts it, each other follows exactly one, none branches)
    hops = next((i for i in range(n) if chunk_of[i] != chunk_of[0]), n)
    if n % hops:
        return None
    path = [i for i in range(hops) if not preds[i]]
    if len(path) != 1:
        return None
    while len(path) < hops:
        kids = children[path[-1]]
        if len(kids) != 1:
            return None
        path.append(kids[0])
    if any(len(children[i]) > 1 for i in range(hops)):
        return None
    # every chunk takes those links, in the same positions, one chunk after the other in the table
    route = link_of[:hops]
    chunks = n // hops
    if link_of != route * chunks or any(chunk_of[c * hops] != chunk_of[c * hops + hops - 1] or
                                        (c and chunk_of[c * hops] == chunk_of[c * hops - 1]) for c in range(chunks)):
        return None
    links = topology.links
    resources = [("l", li) for li in route] + [p for li in route for p in links[li].ports]
    if len(set(resources)) != len(resources):
        return None
    clock = LinkClock(topology)
    if min(clock.duration_us(li, nbytes) for li in route) <= _CHAIN_MIN_BUSY_US:
        return None
    # the ranking at the first hop, the same at every hop
    tail = table.tail_us.tolist()
    tie = np.asarray(tie).tolist()
    prio = _priority(rule, [False] * n, tie, tail)
    ranked = sorted(range(chunks), key=lambda c: prio(c * hops + path[0]))
    for h in path[1:]:
        keys = [prio(c * hops + h) for c in ranked]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            return None
    if fifo_depth is None:
        return _greedy_along_one_chain(topology, clock, nbytes, link_of, path, ranked, prio, rule == "work")
    # timed hop by hop, each link's messages in the ranking (as _time_in_sequence times them)
    sequence = {li: s for s, li in enumerate(sorted(route))}     # sequences numbered in link order
    fifo = _Fifos(len(links), fifo_depth)
    reserve, take, room_us = clock.reserve, fifo.take, fifo.room_us
    start = [0.0] * n
    end = [0.0] * n
    at = [0.0] * n           # when each send may go: the key _time_in_sequence books it by
    usable = [0.0] * n       # when each message's data is taken at its destination
    for position, h in enumerate(path):
        li = link_of[h]
        previous_hop = path[position - 1] if position else None
        busy_until = 0.0
        last = None
        for c in ranked:
            i = c * hops + h
            ready = usable[c * hops + previous_hop] if previous_hop is not None else 0.0
            go = max(busy_until, ready, room_us(li))
            # sends pop from _time_in_sequence's heap in (at, sequence, index) order only when each goes strictly
            # after what it waits for (a later push never sorts before an earlier pop)
            if (last is not None and go <= at[last]) or (previous_hop is not None and go <= at[i - h + previous_hop]):
                return None
            res = reserve(li, go, nbytes)
            at[i], start[i], end[i] = go, res.start_us, res.arrival_us
            usable[i] = take(li, None, res.arrival_us)
            busy_until = res.busy_until_us
            last = i
    order = sorted(range(n), key=lambda i: (at[i], sequence[link_of[i]], i))
    return order, np.array(start), np.array(end)


def _greedy_along_one_chain(topology: Topology, clock: LinkClock, nbytes: float, link_of: list[int],
                            path: list[int], ranked: list[int], prio, by_work: bool):
    """:func:`_along_one_chain` with unbounded buffers: :func:`_book_greedily`'s own times and booking order.

    Each message is booked when its chunk has arrived at the link's source and the link and its ports are free;
    the greedy booking ranks a link by (when its next message can start: the link's free time, or the message's
    arrival when later by more than the tolerance; the link's unbooked work under rule "work", its busiest resource
    as the greedy booking counts it down; the message's ranking), and books in that order."""
    hops, n = len(path), len(link_of)
    links, port_bw = topology.links, clock.port_bw
    start = [0.0] * n
    end = [0.0] * n
    keys: list = [None] * n
    for position, h in enumerate(path):
        li = link_of[h]
        ports = links[li].ports
        # the link's unbooked work per resource, summed and counted down as _book_greedily does
        work = [(nbytes / (links[li].capacity_GBps * BYTES_PER_US_PER_GBPS))] + [
            nbytes / (port_bw[p] * BYTES_PER_US_PER_GBPS) for p in ports]
        remaining = [0.0] * len(work)
        for _ in ranked if by_work else ():
            remaining = [r + w for r, w in zip(remaining, work)]
        previous_hop = path[position - 1] if position else None
        last = None
        for c in ranked:
            i = c * hops + h
            ready = end[c * hops + previous_hop] if previous_hop is not None else 0.0
            free = clock.link_free[li]
            for p in ports:
                held = clock.port_free.get(p, 0.0)
                free = held if held > free else free
            t = free if ready <= free + _EPS else ready
            keys[i] = (t, True, -max(remaining) if by_work else -0.0) + prio(i)[1:]
            # the heap pops in key order only when each key is later than those of what it waits for
            if (last is not None and t <= keys[last][0]) or (previous_hop is not None and
                                                             t <= keys[c * hops + previous_hop][0]):
                return None
            res = clock.reserve(li, ready, nbytes)
            start[i], end[i] = res.start_us, res.arrival_us
            if by_work:
                remaining = [r - w for r, w in zip(remaining, work)]
            last = i
    order = sorted(range(n), key=keys.__getitem__)
    return order, np.array(start), np.array(end)


def co_resident_channels(topology: Topology, link_of, channels: tuple[int, ...]) -> tuple[int, ...]:
    """The counts of ``channels`` whose threadblocks fit the GPU: a plain program has one per peer, direction and
    channel on each rank, and all must be co-resident (one per SM, ``topology.sms_per_gpu``); the fewest when none
    fits, all when the SM count is not known. The alpha-beta search plans with it; the rooted compositions do not
    (2 x dgx2 Broadcast 1 MB, planned on up to eight at 20.34 us, runs on two at 19.79 us; planned on the two that
    fit, 20.82 us: their timing model, not the channel count, is what is off there).

    >>> from synth.model.topology import load_topology
    >>> a100 = load_topology("dgx-a100", 2)      # 108 SMs; GPU 0 talks to 7 GPUs of its node and GPU 8
    >>> co_resident_channels(a100, [a100.link_index[(0, p)] for p in (1, 2, 3, 4, 5, 6, 7, 8)]
    ...                      + [a100.link_index[(p, 0)] for p in (1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 4, 8))
    (1, 2, 4)
    """
    if not topology.sms_per_gpu:
        return channels
    peers: dict[int, set] = {}
    links = topology.links
    for li in set(link_of):
        link = links[li]
        peers.setdefault(link.src, set()).add(("to", link.dst))
        peers.setdefault(link.dst, set()).add(("from", link.src))
    per_channel = max((len(p) for p in peers.values()), default=1)
    fitting = tuple(c for c in channels if c * per_channel <= topology.sms_per_gpu)
    return fitting or (min(channels),)


def _fastest_in_sequence(topology: Topology, table: TransferTable, nbytes: float, op, order, fifo_depth,
                         channels: tuple[int, ...] = PLAN_CHANNELS, cut: str = "chunk"):
    """:func:`_time_in_sequence` on each of ``channels`` channels; the one whose last arrival is earliest
    (the first on ties). Two channels give a connection two FIFOs: 2 x dgx2 Allgather 1 MB in step on one channel
    was planned at 11.7 us (its order, timed with one FIFO of two messages per connection) and ran at 10.7 us on
    two; timed on two, 10.8 us."""
    best = None
    for count in channels:
        timed = _time_in_sequence(topology, table, nbytes, op, order, fifo_depth, count, cut)
        if best is None or timed[2].max(initial=0.0) < best[2].max(initial=0.0) - _EPS:
            best = timed
    return best


def _channels_by_position(link_of: list[int], order, channels: int) -> list[int]:
    """Each transfer's channel as the lowering cuts long connections (:func:`backends.msccl.lowering.
    _spread_over_channels`, by position): the k-th message of a connection (in ``order``) on channel ``k mod
    share``, a connection's share of the channels in proportion to its messages (the busiest has them all)."""
    on_link: dict[int, list[int]] = {}
    for i in order:
        on_link.setdefault(link_of[i], []).append(i)
    longest = max((len(m) for m in on_link.values()), default=1)
    channel = [0] * len(link_of)
    for messages in on_link.values():
        share = max(1, -(-channels * len(messages) // longest))
        for k, i in enumerate(messages):
            channel[i] = k % share
    return channel


def _time_in_sequence(topology: Topology, table: TransferTable, nbytes: float, op, order, fifo_depth,
                      channels: int = 1, cut: str = "chunk"):
    """Time transfers as the runtime runs the plain program of this order: (booking order, start us, arrival us).

    Each rank's sends through one switch port form a sequence in ``order`` (the lowering keeps it with
    dependencies, :func:`backends.msccl.lowering._order_shared_ports`); a send goes once the one before it in its
    sequence is on the wire, its data has been taken at its source and its connection's FIFO has room. Sends are
    booked when they go, in time order, so a port that several ranks share (a NIC, a GPU's NVSwitch ingress)
    serves them as they come, as the simulator (:mod:`backends.msccl.simulate`) does: no program can order sends
    of different ranks.

    ``channels``: the lowering cuts every connection into that many, chunk ``c`` on channel ``c % channels``
    (:func:`backends.msccl.lowering.spread_index`), each a threadblock with its own FIFO of ``fifo_depth``
    messages; on a link without a switch port nothing orders the threadblocks, so each channel is a sequence of
    its own and the link serves whichever is ready. ``cut="position"``: connections are cut by their messages'
    positions (:func:`_channels_by_position`), as the lowering cuts connections longer than a threadblock holds,
    and, as there, a send waits for the send before it through its port only when that one goes to another
    peer: the channels of one connection go as their data comes (a chain's relays, whose data arrives out of the
    port's planned order: 2 x dgx2 Broadcast 1 GB as chains, the port's order planned 83.7% of the limit, and
    its file on 32 channels simulated at 98.2%). ``cut="fused"``: chunk ``c`` on channel ``c % channels`` (a fused
    chain keeps a chunk on one channel), relays as their data comes (fused relays are not held to the port's order),
    and a send of data its rank holds from the start in the port's order (to other peers) and in its link's order
    (the lowering ``in_link_order``): 2 x dgx2 Reduce 1 GB as chains, the port's order planned 96.7% of the limit and
    its file ran at 93.4% (fused on 16 channels); so timed, planned 93.6%, its file 95.4%. ``op`` is the operation
    of every transfer (one string, or one per transfer). Raises ValueError when the sequences wait for each
    other."""
    n = len(table.chunk)
    link_of = table.link.tolist()
    links = topology.links
    reduces = [op == REDUCE] * n if isinstance(op, str) else [o == REDUCE for o in op]
    if cut not in CUTS:
        raise ValueError(f"unknown cut {cut!r}; use {', '.join(CUTS)}")
    as_they_come = cut != "chunk"       # sends to one peer on other channels are not held to the port's order
    channel = _channels_by_position(link_of, order, channels) if cut == "position" else \
        [c % channels for c in table.chunk.tolist()]

    def sequence_key(i: int) -> tuple:
        l = links[link_of[i]]
        return (l.src, l.sender_port) if l.sender_port is not None and not as_they_come else \
            ("l", link_of[i], channel[i])

    # sequences numbered in link order, which breaks ties between sends ready at once as the simulator does (by
    # sender rank): a port that two ranks reach together serves the lower first
    sequencer: dict = {}
    for li, c, i in sorted((link_of[i], channel[i], i) for i in range(n)):
        sequencer.setdefault(sequence_key(i), len(sequencer))
    seq_of = [sequencer[sequence_key(i)] for i in range(n)]    # transfer -> its sequence
    # what each send waits for besides its data: the send before it in its sequence and, as they come, the send
    # before it through its port when that one goes to another peer (fused: only a send of data its rank holds from
    # the start, which also waits for the send before it on its link)
    after: list[list[int]] = [[] for _ in range(n)]
    unmet = [len(p) for p in table.preds]
    last_in: dict = {}
    for i in order:
        first = last_in.get(seq_of[i])
        last_in[seq_of[i]] = i
        if not as_they_come:    # cut "chunk": only the send before it in its sequence
            if first is not None:
                after[first].append(i)
                unmet[i] += 1
            continue
        before = [first]
        port = links[link_of[i]].sender_port
        if cut == "fused":
            previous = last_in.get(("link", link_of[i]))
            last_in[("link", link_of[i])] = i
            if table.preds[i]:
                port = None
            else:
                before.append(previous)
        if as_they_come and port is not None:
            key = (links[link_of[i]].src, port)
            previous = last_in.get(key)
            last_in[key] = i
            if previous is not None and links[link_of[previous]].dst != links[link_of[i]].dst:
                before.append(previous)
        for b in set(before) - {None}:
            after[b].append(i)
            unmet[i] += 1
    conn = [link_of[i] * channels + channel[i] for i in range(n)]
    clock = LinkClock(topology)
    fifo = _Fifos(len(links) * channels, fifo_depth)
    ready = [0.0] * n
    free = [0.0] * n        # when the sends each one waits for are on the wire
    start = [0.0] * n
    end = [0.0] * n
    chunk_of = table.chunk.tolist()
    children = table.children
    heap: list[tuple[float, int, int]] = []

    def push(i: int) -> None:
        heapq.heappush(heap, (max(free[i], ready[i], fifo.room_us(conn[i])), seq_of[i], i))

    for i in range(n):
        if not unmet[i]:
            push(i)
    booked = []
    while heap:
        at, _, i = heapq.heappop(heap)
        li = link_of[i]
        res = clock.reserve(li, at, nbytes)
        start[i], end[i] = res.start_us, res.arrival_us
        usable = fifo.take(conn[i], (links[li].dst, chunk_of[i]) if reduces[i] else None, res.arrival_us)
        booked.append(i)
        for k in children[i]:
            if usable > ready[k]:
                ready[k] = usable
            unmet[k] -= 1
            if not unmet[k]:
                push(k)
        busy_until = res.busy_until_us
        for k in after[i]:
            if busy_until > free[k]:
                free[k] = busy_until
            unmet[k] -= 1
            if not unmet[k]:
                push(k)
    if len(booked) < n:
        raise ValueError(f"rule 'sequence': the ranks make {n - len(booked)} transfers wait for each other")
    return booked, np.array(start), np.array(end)


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
        previous = taken[-1] if taken else 0.0
        at = previous if previous > arrival_us else arrival_us
        if reduces_into is not None:
            reduced = self.reduced.get(reduces_into, 0.0)
            at = reduced if reduced > at else at
            self.reduced[reduces_into] = at
        taken.append(at)
        return at


def number_steps(topology: Topology, link: np.ndarray, preds, order, reduced_chunk: np.ndarray | None = None
                 ) -> np.ndarray:
    """Steps for transfers booked in ``order``: above the steps of the transfers that deliver their chunk, and
    above the step of the previous transfer on the same link or switch port (so no two transfers share a resource
    within a step and the order on every resource is fixed by the steps alone, whatever the size). With
    ``reduced_chunk`` (the chunk of every transfer of a reduction) the reductions into one chunk at one rank also
    follow the booking order, which is the order the lowering applies them in (a negative entry: a copy)."""
    steps = [0] * len(link)
    last: dict = {}
    links = topology.links
    link = np.asarray(link).tolist()
    reduced_chunk = None if reduced_chunk is None else np.asarray(reduced_chunk).tolist()
    resources = {li: (("l", li), *links[li].ports) for li in set(link)}
    for i in order:
        li = link[i]
        keys = resources[li]
        if reduced_chunk is not None and reduced_chunk[i] >= 0:
            keys = (*keys, ("r", links[li].dst, reduced_chunk[i]))
        s = 0
        for p in preds[i]:
            if steps[p] >= s:
                s = steps[p] + 1
        for k in keys:
            after = last.get(k, -1) + 1
            if after > s:
                s = after
        steps[i] = s
        for k in keys:
            last[k] = s
    return np.array(steps, dtype=np.int64)


def retime(schedule: Schedule, topology: Topology, size_bytes: float, fifo_depth: int | None = RUNTIME_FIFO_DEPTH,
           channels: tuple[int, ...] = PLAN_CHANNELS) -> Schedule:
    """``schedule`` with its transfers timed as the runtime runs its lowering (:func:`_fastest_in_sequence`: each
    sender's sends through one switch port, else each channel of a link, in the schedule's step order; FIFOs of
    ``fifo_depth`` per channel) and steps renumbered in that booking order, so the replay books every link and
    port in the order the runtime serves them.

    Where the schedule's steps order a link's transfers one way and the runtime's channels serve them another
    (the transfers of a later step ready first), the step-order replay is not the time of the file written from
    it: dgx1 Allreduce 1 MB, ReduceScatter then Allgather, replayed at 14.6 us, and its file on two channels ran
    at 13.9 us, the Allgather's first sends going while ReduceScatter sends of earlier steps still waited for data
    on the other channel. Retimed, the plan says 13.9 us and is what runs. Transfers read what their source
    received at earlier steps (and a transfer into a chunk waits for the sends of it that read it before), as in
    the replay; the result is a schedule of the same transfers, timed (``start_us``/``end_us``).

    >>> from synth.model.topology import load_topology
    >>> from synth.synthesis.steps import synthesize_steps
    >>> ring = load_topology("ring-4")
    >>> s = synthesize_steps(ring, "allgather", 3, 3).schedule
    >>> r = retime(s, ring, 1 << 20)
    >>> len(r.transfers) == len(s.transfers), max(t.end_us for t in r.transfers) > 0
    (True, True)
    """
    transfers = schedule.ordered()
    n = len(transfers)
    if n == 0:
        return schedule
    into: dict[tuple[int, int], list[tuple[int, int]]] = {}
    out_of: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, t in enumerate(transfers):
        into.setdefault((t.dst, t.chunk), []).append((t.step, i))
        out_of.setdefault((t.src, t.chunk), []).append((t.step, i))
    # read after write (arrivals at earlier steps), and write after read (sends that read the chunk before)
    preds = tuple(tuple(j for s, j in into.get((t.src, t.chunk), ()) if s < t.step)
                  + tuple(j for s, j in out_of.get((t.dst, t.chunk), ()) if s <= t.step)
                  for t in transfers)
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            kids[p].append(i)
    link = np.array([topology.link_index[(t.src, t.dst)] for t in transfers], dtype=np.int64)
    chunk = np.array([t.chunk for t in transfers], dtype=np.int64)
    table = TransferTable(chunk, link, preds, np.zeros(n), tuple(tuple(k) for k in kids))
    ops = [t.op for t in transfers]
    order, start, end = _fastest_in_sequence(topology, table, schedule.collective.chunk_bytes(size_bytes), ops,
                                             range(n), fifo_depth, channels)
    steps = number_steps(topology, link, preds, order,
                         np.where(np.array([o == REDUCE for o in ops]), chunk, -1))
    timed = tuple(replace(transfers[i], step=int(steps[i]), start_us=float(start[i]), end_us=float(end[i]))
                  for i in order)
    return replace(schedule, transfers=timed, steps=int(steps.max()) + 1, rounds=None, rounds_per_step=None)


def book_in_order(topology: Topology, collective: Collective, route_links, size_bytes: float, method: str,
                  position: dict, notes: dict | None = None) -> Schedule:
    """Time routed transfers booked in a fixed order (e.g. a MILP's epochs) instead of greedily.

    ``position[(chunk, link)]`` ranks every routed transfer; a transfer must rank after the one that delivers
    its chunk to its source (true for start epochs of a time-expanded solution). Each is booked as soon as its
    chunk is at its source and its link and ports are free, as the replay does.
    """
    nbytes = collective.chunk_bytes(size_bytes)
    table = transfer_table(topology, route_links, hop_times_us(topology, nbytes))
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
