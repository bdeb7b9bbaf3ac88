"""How fast can any MSCCL file of a schedule simulate? Lower bounds the verified writer uses to stop making variants
that cannot win (:mod:`backends.msccl.writer`), computed from the schedule alone, before anything is lowered.

- :func:`schedule_floor_us`: any file, merged steps included: the schedule's link and port loads
  (:func:`synth.schedule.costmodel.load_bound_us`).
- :func:`chain_floor_us`: any file, merged steps included: the longest chain of messages that must follow one
  another (alphas and the chunk's time per hop), without the loads they share.
- :func:`unmerged_floor_us`: any file that sends each transfer as its own message (no merged steps; every channel
  count, fused or plain). It adds what the loads leave out: a link or switch port cannot start before the data of its first message has arrived, and
  what it sends last must still travel on. On a chain the pipeline's fill and drain (dgx2 Broadcast 1 GB: 122 us
  over the 8590 us the root's port needs) is what separates the plan from the load bound.

Why :func:`unmerged_floor_us` holds for every file the writer accepts
----------------------------------------------------------------------
The simulator (:mod:`backends.msccl.simulate`) books each message on :class:`~synth.schedule.costmodel.LinkClock`:
a link and each switch port it crosses hold the message from one start time for its bytes at their bandwidth, one
message at a time, and it arrives alpha plus the link's time after it starts; a step that forwards data starts
once the message carrying it has fully arrived (store-and-forward), and a step reading a slot another step wrote
runs after it (the verdict refuses a race, and every order it accepts, tb order, a dependency or a matched
message, the simulator keeps in time). Take a transfer ``j`` of chunk ``c`` into rank ``v`` that is ``v``'s only
inbound transfer of ``c`` where ``v`` must hold ``c`` at the end and does not at the start: the postcondition can
then only hold if ``j``'s message carries ``c``, so it starts once ``c`` is at its source: at once where the
source holds ``c`` from the start, else no sooner than the earliest an inbound transfer of ``c`` carrying it can
arrive there (its *head*). Every such transfer out of ``v`` starts after ``j`` arrives, so from ``j``'s start the
file needs at least ``j``'s own alpha and link time plus what they need (its *tail*; where several of them share a
link or port, those hold it one after another). Where messages carry partial sums (ReduceScatter, Reduce), the
same holds the other way round: a rank that must not end with a chunk's sum and sends that chunk on only once must
send every contribution it holds (its own, and each that had to come to it) in that one message, so it starts
after each such inbound message arrives (the latest of them is its head), and carries them on. On one link or port the messages run one at a time, so for every
subset of its messages the last of them ends no sooner than the earliest head plus all their times there, and the
file no sooner than that plus the least tail still left after it; the bound is the largest such figure (subsets
taken by head and by tail thresholds), and never below :func:`schedule_floor_us`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from synth.model.topology import Topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS, load_bound_us
from synth.schedule.ir import COPY, Schedule

from backends.msccl.limits import MAX_CNT


def schedule_floor_us(schedule: Schedule, topology: Topology, size_bytes: float) -> float:
    """No MSCCL file written for ``schedule`` simulates faster than this at ``size_bytes`` (us): its link and port
    loads (:func:`synth.schedule.costmodel.load_bound_us`), whatever the channels and the merging (``cnt`` up to
    the runtime's largest). Judged before anything is lowered, so a file that cannot win is never written."""
    return load_bound_us(((t.src, t.dst) for t in schedule.transfers), topology,
                         schedule.collective.chunk_bytes(size_bytes), MAX_CNT)


def unmerged_floor_us(schedule: Schedule, topology: Topology, size_bytes: float) -> float:
    """No MSCCL file of ``schedule`` that sends each transfer as a message of its own simulates faster than this at
    ``size_bytes`` (us); see the module docstring for why. Never below :func:`schedule_floor_us`, never above the
    schedule's own replay (one timing of its messages that it bounds).

    >>> from synth.model.collectives import make_collective
    >>> from synth.model.topology import load_topology
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> chain = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(4) for r in range(3))
    >>> schedule = Schedule(make_collective("broadcast", 4, 4, 0), "ring-4", chain, 6)
    >>> ring = load_topology("ring-4")
    >>> unmerged_floor_us(schedule, ring, 4 << 20) > schedule_floor_us(schedule, ring, 4 << 20)
    True
    """
    floor = schedule_floor_us(schedule, topology, size_bytes)
    chains = _chains(schedule, topology, size_bytes)
    if chains is None:
        return floor
    transfers, order, travel, holds, head, waiting = chains
    tail = list(travel)
    for j in reversed(order):
        after = waiting.get(j)
        if not after:
            continue
        if len(after) == 1:
            tail[j] += tail[after[0]]
            continue
        most = max(tail[k] for k in after)
        shared: dict = defaultdict(list)
        for k in after:
            for resource, held in holds[k]:
                shared[resource].append((held, tail[k] - held))
        for jobs in shared.values():
            if len(jobs) > 1:
                most = max(most, sum(h for h, _ in jobs) + min(rest for _, rest in jobs))
        tail[j] += most
    jobs_on: dict = defaultdict(list)
    for j in range(len(transfers)):
        for resource, held in holds[j]:
            jobs_on[resource].append((head[j], held, tail[j] - held))
    return max(floor, max(_one_machine_bound(np.array(jobs)) for jobs in jobs_on.values()))


def chain_floor_us(schedule: Schedule, topology: Topology, size_bytes: float) -> float:
    """No MSCCL file of ``schedule`` simulates faster than this at ``size_bytes`` (us), merged steps included: the
    longest chain of messages that must follow one another (the module docstring's heads and tails, without the
    links and ports the messages share). A merged message carries at least its chunk and starts once all of it is
    there, so each hop of a chain still costs its alpha and the chunk's time, one hop after another.

    Where alphas dominate it is the bound that tells (256 GPUs, Allgather 1 MB: the bidirectional ring's chunks
    cross up to 128 links, over 90 us of alphas, where the loads alone need 1 us).

    >>> from synth.model.collectives import make_collective
    >>> from synth.model.topology import load_topology
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> chain = Schedule(make_collective("broadcast", 4, 1, 0), "ring-4", tuple(Transfer(0, r, r + 1, r)
    ...                  for r in range(3)), 3)
    >>> ring = load_topology("ring-4")
    >>> alpha = ring.link(0, 1).alpha_us
    >>> chain_floor_us(chain, ring, 1) > 3 * alpha > schedule_floor_us(chain, ring, 1)
    True
    """
    chains = _chains(schedule, topology, size_bytes)
    if chains is None:
        return 0.0
    transfers, order, travel, _, head, waiting = chains
    tail = list(travel)
    for j in reversed(order):
        if waiting.get(j):
            tail[j] += max(tail[k] for k in waiting[j])
    return max(h + t for h, t in zip(head, tail))


def _chains(schedule: Schedule, topology: Topology, size_bytes: float):
    """What the floors of chained messages are made of: the transfers, their order by step, each one's alpha plus
    link time (``travel``), the (resource, time held) of its link and ports, its earliest start (``head``) and the
    transfers that must wait for it (``waiting``); None where nothing can be said (no transfers, or copies of a
    non-combining collective that reduce)."""
    coll = schedule.collective
    transfers = schedule.transfers
    if not transfers or (not coll.combining and any(t.op != COPY for t in transfers)):
        return None
    nbytes = coll.chunk_bytes(size_bytes)
    port_bw = topology.port_capacity()
    holders = {(c.id, r) for c in coll.chunks for r in c.sources}
    must_hold = {(c.id, r) for c in coll.chunks for r in c.dest_ranks}
    inbound: dict[tuple[int, int], list[int]] = defaultdict(list)
    for j, t in enumerate(transfers):
        inbound[(t.chunk, t.dst)].append(j)
    # per link: alpha plus its time, and (resource, time held) for the link and each port it crosses
    costs: dict[tuple[int, int], tuple[float, tuple]] = {}
    for pair in {(t.src, t.dst) for t in transfers}:
        index = topology.link_index[pair]
        link = topology.links[index]
        beta_us = nbytes / (link.capacity_GBps * BYTES_PER_US_PER_GBPS)
        costs[pair] = (link.alpha_us + beta_us, ((("link", index), beta_us), *(
            (port, nbytes / (port_bw[port] * BYTES_PER_US_PER_GBPS)) for port in link.ports)))
    travel = [costs[(t.src, t.dst)][0] for t in transfers]
    holds = [costs[(t.src, t.dst)][1] for t in transfers]
    order = sorted(range(len(transfers)), key=lambda j: transfers[j].step)
    flow = _partial_sums if coll.combining else _copies
    head, waiting = flow(transfers, order, travel, inbound, holders, must_hold)
    return transfers, order, travel, holds, head, waiting


def _copies(transfers, order, travel, inbound, holders, must_hold) -> tuple[list[float], dict[int, list[int]]]:
    """Heads and waits where messages carry copies: a transfer into a rank that must end with its chunk, and gets
    it no other way, carries it; it starts no sooner than the earliest inbound copy can reach its source, and the
    transfers of that chunk out of its destination wait for it."""
    # the postcondition needs the transfer's message to carry its chunk: its destination's only way to get it
    carries = [(t.chunk, t.dst) in must_hold and (t.chunk, t.dst) not in holders and len(inbound[(t.chunk, t.dst)]) == 1
               for t in transfers]

    # earliest start of each transfer if it carries its chunk (steps order the data: a transfer's chunk reached its
    # source at an earlier step)
    earliest = [0.0] * len(transfers)
    for j in order:
        t = transfers[j]
        if (t.chunk, t.src) not in holders:
            step = t.step
            earliest[j] = min((earliest[i] + travel[i] for i in inbound[(t.chunk, t.src)] if transfers[i].step < step),
                              default=0.0)
    head = [e if c else 0.0 for e, c in zip(earliest, carries)]
    # the transfers that must wait for each one (its destination's chunk goes on only with its message)
    waiting: dict[int, list[int]] = defaultdict(list)
    for k, t in enumerate(transfers):
        if carries[k] and (t.chunk, t.src) not in holders:
            feeding = inbound[(t.chunk, t.src)]
            if len(feeding) == 1 and transfers[feeding[0]].step < t.step:
                waiting[feeding[0]].append(k)
    return head, waiting


def _partial_sums(transfers, order, travel, inbound, holders, must_hold
                  ) -> tuple[list[float], dict[int, list[int]]]:
    """Heads and waits where messages carry partial sums: a rank that needs no sum of a chunk and sends it on only
    once must send there every contribution it holds (its own, and those that had to reach it), so that transfer
    starts after each such inbound one arrives, and carries them on."""
    outbound: dict[tuple[int, int], list[int]] = defaultdict(list)
    for j, t in enumerate(transfers):
        outbound[(t.chunk, t.src)].append(j)
    carries = [False] * len(transfers)
    head = [0.0] * len(transfers)
    waiting: dict[int, list[int]] = defaultdict(list)
    for j in order:
        t = transfers[j]
        key = (t.chunk, t.src)
        if key in must_hold or len(outbound[key]) != 1:
            continue
        feeding = [i for i in inbound[key] if carries[i] and transfers[i].step < t.step]
        carries[j] = key in holders or bool(feeding)
        if feeding:
            head[j] = max(head[i] + travel[i] for i in feeding)
        for i in feeding:
            waiting[i].append(j)
    return head, waiting


def _one_machine_bound(jobs: np.ndarray) -> float:
    """The least time by which a resource serving ``jobs`` one at a time (rows of earliest start, time held, least
    time still needed after it lets go) can see them all through: for the jobs of every head threshold and of
    every tail threshold, the earliest head plus their times plus the least tail among them."""
    head, held, rest = jobs[:, 0], jobs[:, 1], jobs[:, 2]
    by_head = np.argsort(-head, kind="stable")      # the latest heads first
    best = np.max(head[by_head] + np.cumsum(held[by_head]) + np.minimum.accumulate(rest[by_head]))
    by_rest = np.argsort(-rest, kind="stable")      # the longest tails first
    return float(max(best, np.max(np.minimum.accumulate(head[by_rest]) + np.cumsum(held[by_rest]) + rest[by_rest])))
