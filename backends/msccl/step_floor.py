"""The fewest steps, threadblocks and XML elements any lowering of a schedule can give a rank, from the schedule
alone (linear in its transfers, no lowering): so a schedule that can never load is refused before minutes of
fitting (1024 GPUs of DGX-H100, Allreduce composed by hierarchy: 2,095,104 transfers, three lowerings tried for
55 minutes before the XML reader's limit ruled each out).

Why the floor holds for every lowering (:mod:`backends.msccl.lowering`, :mod:`backends.msccl.merge`):

- a message is one step at each end; a step receives at most one message and sends at most one, and one that
  does both (``rcs``, ``rrs``, ``rrcs``) sends what it received, so it forwards a chunk its rank received at an
  earlier or the same step of the schedule. A rank's steps are at least its received plus its sent messages,
  less those forwards (each received message forwards once at most);
- messages merge (``cnt > 1``) only where the chunks sit next to each other in the same buffer at both ends
  (:func:`synth.schedule.ir.buffer_layout`, which every lowering uses) and at most :data:`MAX_CNT` together, so a
  connection carries at least one message per such run of ``MAX_CNT`` chunks;
- a rank needs a threadblock per peer it sends to and per peer it receives from; a threadblock has at most one
  of each, and our lowerings give a threadblock both only for fused chains, which receive from a peer what they
  send on to another: so one threadblock serves two peers at most once per peer that forwards (the fewer of the
  peers it receives chunks from that it also sends, and of the peers it sends chunks it also received).

>>> from synth.model.collectives import make_collective
>>> from synth.schedule.ir import Schedule, Transfer
>>> chain = Schedule(make_collective("broadcast", 3, 2, 0), "line-3",
...                  tuple(Transfer(c, r, r + 1, r) for c in range(2) for r in range(2)), 2)
>>> [f.steps for f in rank_floors(chain)], [f.threadblocks for f in rank_floors(chain)]
([1, 1, 1], [1, 1, 1])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from backends.msccl.limits import MAX_CNT, MAX_XML_ELEMENTS, max_steps, xml_elements
from synth.schedule.ir import BufferLayout, Schedule, buffer_layout

BUFFER_CODES = {"i": 0, "o": 1, "s": 2}


@dataclass(frozen=True)
class RankFloor:
    """The least a rank's part of any lowering holds: ``steps`` (messages received plus sent, less forwards) and
    ``threadblocks`` (its send and receive peers, less the pairs fused chains can share, module docstring)."""

    rank: int
    steps: int
    threadblocks: int
    received: int      # messages, at least
    sent: int
    forwards: int      # received messages a fused step may also send on, at most
    send_peers: int = 0
    recv_peers: int = 0

    def elements(self, ngpus: int) -> int:
        """The XML elements the rank's load counts, at least (:func:`backends.msccl.limits.xml_elements`)."""
        return xml_elements(ngpus, self.threadblocks, self.steps)


def rank_floors(schedule: Schedule, layout: BufferLayout | None = None) -> list[RankFloor]:
    """Each rank's :class:`RankFloor` (module docstring); ``layout``: the schedule's
    :func:`~synth.schedule.ir.buffer_layout` when the caller has it already."""
    n = schedule.num_ranks
    transfers = schedule.transfers
    if not transfers:
        return [RankFloor(r, 0, 0, 0, 0, 0) for r in range(n)]
    src = np.fromiter((t.src for t in transfers), np.int64, len(transfers))
    dst = np.fromiter((t.dst for t in transfers), np.int64, len(transfers))
    chunk = np.fromiter((t.chunk for t in transfers), np.int64, len(transfers))
    step = np.fromiter((t.step for t in transfers), np.int64, len(transfers))
    messages = _connection_messages(schedule, src, dst, chunk, layout or buffer_layout(schedule))
    received = np.bincount(messages[1], weights=messages[2], minlength=n).astype(np.int64)
    sent = np.bincount(messages[0], weights=messages[2], minlength=n).astype(np.int64)
    forwards = np.minimum(_forwards(src, dst, chunk, step, n), np.minimum(received, sent))
    send_peers = np.bincount(np.unique(src * n + dst) // n, minlength=n)
    recv_peers = np.bincount(np.unique(dst * n + src) // n, minlength=n)
    shared = np.minimum(*_forwarding_peers(src, dst, chunk, n))
    threadblocks = send_peers + recv_peers - shared
    return [RankFloor(r, int(received[r] + sent[r] - forwards[r]), int(threadblocks[r]), int(received[r]),
                      int(sent[r]), int(forwards[r]), int(send_peers[r]), int(recv_peers[r])) for r in range(n)]


def _forwarding_peers(src, dst, chunk, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the peers it receives some chunk from that it also sends, and the peers it sends some chunk to
    that it also receives (at any step: generous, so the floor stays a floor)."""
    chunks = int(chunk.max()) + 1
    recv_key, send_key = dst * chunks + chunk, src * chunks + chunk
    sends_on = np.isin(send_key, recv_key)       # a send of a chunk its rank also receives
    takes_on = np.isin(recv_key, send_key)       # a receive of a chunk its rank also sends
    out_peers = np.bincount(np.unique(src[sends_on] * n + dst[sends_on]) // n, minlength=n)
    in_peers = np.bincount(np.unique(dst[takes_on] * n + src[takes_on]) // n, minlength=n)
    return in_peers, out_peers


def _connection_messages(schedule: Schedule, src, dst, chunk, layout: BufferLayout
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sender, receiver, messages at least) per connection: its chunks cut where they stop being neighbours in
    the same buffer (of ``layout``) at either end, each run in messages of at most :data:`MAX_CNT`."""
    slot = layout.slot
    send_buf, send_idx = _slots(slot, src, chunk)
    recv_buf, recv_idx = _slots(slot, dst, chunk)
    # a chunk has one slot per rank, so a connection's sender slot names its pair; one copy of each is enough
    rows = _unique_rows(np.stack([src, dst, send_buf, send_idx, recv_buf, recv_idx], axis=1))
    s, d, sb, si, rb, ri = rows.T
    joined = np.zeros(len(rows), bool)
    joined[1:] = ((s[1:] == s[:-1]) & (d[1:] == d[:-1]) & (sb[1:] == sb[:-1]) & (si[1:] == si[:-1] + 1)
                  & (rb[1:] == rb[:-1]) & (ri[1:] == ri[:-1] + 1))
    starts = np.flatnonzero(~joined)
    lengths = np.diff(np.append(starts, len(rows)))
    runs = -(-lengths // MAX_CNT)
    connection = s[starts] * schedule.num_ranks + d[starts]
    keys, inverse = np.unique(connection, return_inverse=True)
    per_connection = np.bincount(inverse, weights=runs).astype(np.int64)
    return keys // schedule.num_ranks, keys % schedule.num_ranks, per_connection


def _unique_rows(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows, axis=0)`` (the distinct rows, sorted column by column), by one lexsort: a tenth of its
    time on 30,720 rows of six columns."""
    if len(rows) == 0:
        return rows
    ordered = rows[np.lexsort(rows.T[::-1])]
    keep = np.ones(len(ordered), bool)
    keep[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    return ordered[keep]


def _slots(slot: dict, rank, chunk) -> tuple[np.ndarray, np.ndarray]:
    """The buffer (as :data:`BUFFER_CODES`) and index of each (rank, chunk)."""
    places = list(map(slot.__getitem__, zip(rank.tolist(), chunk.tolist())))
    buffers, indices = zip(*places) if places else ((), ())
    return (np.array([BUFFER_CODES[b] for b in buffers], np.int64), np.array(indices, np.int64))


def _forwards(src, dst, chunk, step, n: int) -> np.ndarray:
    """Per rank, at most how many of its received messages a fused step also sends on.

    A fused step sends the chunk's value as its receive left it, so a send can ride on the rank's latest receive
    of that chunk before it (or, at equal steps of the schedule, on either neighbour): per (rank, chunk), the
    fewer of its sends after its first receive and of its receives followed by a send before the next receive.
    """
    chunks = int(chunk.max()) + 1
    span = int(step.max()) + 2
    recv_key, send_key = dst * chunks + chunk, src * chunks + chunk
    received = np.sort(recv_key * span + step)
    key_of = received // span
    sends = send_key * span + step
    last = np.searchsorted(received, sends, "right") - 1          # the latest receive at or before the send
    ok = (last >= 0) & (key_of[np.maximum(last, 0)] == send_key)
    group_start = np.searchsorted(key_of, send_key, "left")
    first = np.maximum(np.searchsorted(received, sends, "left") - 1, group_start)   # the latest one before it
    cover = np.zeros(len(received) + 1, np.int64)
    np.add.at(cover, first[ok], 1)
    np.add.at(cover, last[ok] + 1, -1)
    served = np.cumsum(cover[:-1]) > 0
    keys, inverse = np.unique(key_of, return_inverse=True)
    served_per_key = np.bincount(inverse, weights=served, minlength=len(keys))
    sends_per_key = np.bincount(np.searchsorted(keys, send_key[ok]), minlength=len(keys))
    return np.bincount(keys // chunks, weights=np.minimum(served_per_key, sends_per_key),
                       minlength=n).astype(np.int64)


def element_floor_reason(schedule: Schedule, target: str, sms: int | None = None,
                         ranks: Iterable[int] | None = None, layout: BufferLayout | None = None) -> str | None:
    """Why no lowering of ``schedule`` can load on ``target`` (more peers one way than the GPU's ``sms``, its XML
    reader's elements, more threadblocks than SMs, or more steps than the SMs' threadblocks hold), from
    :func:`rank_floors` of ``ranks`` (default: all; a schedule holding only some ranks' transfers has their floors
    whole); None when one may. ``layout`` as in :func:`rank_floors`."""
    n = schedule.num_ranks
    floors = rank_floors(schedule, layout)
    if ranks is not None:
        floors = [floors[r] for r in ranks]
    for f in floors if sms is not None else ():
        for direction, peers in (("receive from", f.recv_peers), ("send to", f.send_peers)):
            if peers > sms:
                return (f"rank {f.rank} must {direction} {peers} peers, a threadblock each, and its GPU runs at "
                        f"most {sms} threadblocks (one per SM)")
    worst = max(floors, key=lambda f: f.elements(n))
    if worst.elements(n) > MAX_XML_ELEMENTS:
        return (f"rank {worst.rank} loads at least {worst.elements(n)} XML elements whatever the lowering (the "
                f"<algo>, {n} <gpu>, at least {worst.threadblocks} <tb> and {worst.steps} <step>: {worst.received} "
                f"messages received and {worst.sent} sent, at most {worst.forwards} of them forwarded by fused "
                f"steps); the runtimes' XML reader holds at most {MAX_XML_ELEMENTS}")
    if sms is not None:
        busiest = max(floors, key=lambda f: f.threadblocks)
        if busiest.threadblocks > sms:
            return (f"rank {busiest.rank} needs at least {busiest.threadblocks} threadblocks whatever the lowering "
                    f"(it sends to {busiest.send_peers} peers and receives from {busiest.recv_peers}, a threadblock "
                    f"each way unless a fused chain forwards from one to the other), and its GPU runs at most {sms} "
                    "(one per SM)")
        most = max(floors, key=lambda f: f.steps)
        if most.steps > sms * max_steps(target):
            return (f"rank {most.rank} needs at least {most.steps} steps whatever the lowering, and its {sms} "
                    f"threadblocks (one per SM) hold at most {sms * max_steps(target)} on the {target} runtime")
    return None
