"""Pipelining: cut every chunk of a schedule into pieces that follow the same routes in the same order.

A schedule that moves whole chunks store-and-forward pays a chunk's transfer time on every hop; cut into ``k``
pieces, a relay forwards piece 0 while piece 1 is still arriving, so the path latency shrinks to about one
chunk time plus ``1/k`` of a chunk time per extra hop, while link loads stay the same. The piece count is kept
moderate: every piece is a step of a threadblock (MSCCL's executor allows 64 per threadblock, the legacy
runtime 256).

Transfer ``(chunk c, step s)`` becomes ``(chunk c*k + p, step s*k + p)`` for ``p < k``. The collective is
rebuilt with ``k`` times the chunks per rank; in every collective of :mod:`synth.model.collectives` chunk ``c*k + p``
of the finer collective is the ``p``-th piece of chunk ``c`` (same sources and destinations, contiguous buffer
ranges), which :func:`pipeline` checks. Step-snapshot semantics are preserved exactly: piece ``p`` of a send at
step ``s`` sees piece ``p`` of every arrival at steps ``< s`` and of none at steps ``>= s``; for combining
collectives every partial sum stays correct. The replay gives the time.
"""

from __future__ import annotations

from dataclasses import replace

from synth.model.collectives import Collective, make_collective
from synth.schedule.ir import Schedule, Transfer


def split_collective(collective: Collective, pieces: int) -> Collective:
    """The same collective with ``pieces`` times the chunks per rank; raises ValueError if the piece layout
    (chunk ``c*k + p`` is piece ``p`` of chunk ``c``) does not hold."""
    finer = make_collective(collective.name, collective.num_ranks, collective.chunks_per_rank * pieces,
                            collective.root)
    if len(finer.chunks) != len(collective.chunks) * pieces:
        raise ValueError(f"{collective.name}: cannot split into {pieces} pieces")
    for c in collective.chunks:
        for p in range(pieces):
            f = finer.chunks[c.id * pieces + p]
            if f.sources != c.sources or f.dest_ranks != c.dest_ranks:
                raise ValueError(f"{collective.name}: chunk {c.id * pieces + p} is not a piece of chunk {c.id}")
    return finer


def pipeline(schedule: Schedule, pieces: int) -> Schedule:
    """Split every chunk of ``schedule`` into ``pieces`` pieces that follow the same routes and order.

    >>> from synth.synthesis.steps import synthesize_steps
    >>> from synth.model.topology import load_topology
    >>> s = synthesize_steps(load_topology("ring-4"), "allgather", steps=2, rounds=2).schedule
    >>> p = pipeline(s, 4)
    >>> p.collective.chunks_per_rank, len(p.transfers), p.steps
    (4, 48, 8)
    """
    if pieces < 1:
        raise ValueError("pieces must be at least 1")
    if pieces == 1:
        return schedule
    finer = split_collective(schedule.collective, pieces)
    transfers = tuple(Transfer(t.chunk * pieces + p, t.src, t.dst, t.step * pieces + p, t.op)
                      for t in schedule.ordered() for p in range(pieces))
    notes = dict(schedule.notes)
    notes["pieces"] = notes.get("pieces", 1) * pieces
    rps = None
    if schedule.rounds_per_step is not None:
        rps = tuple(r for r in schedule.rounds_per_step for _ in range(pieces))
    return replace(schedule, collective=finer, transfers=transfers, steps=schedule.steps * pieces,
                   rounds=sum(rps) if rps else None, rounds_per_step=rps, notes=notes)
