"""Reductions between collectives: how a schedule for one problem is made from schedules of simpler ones.

In the style of cvxpy's reductions (``cvxpy/reductions/reduction.py``): a reduction's ``apply`` maps a
:class:`CollectiveProblem` to the sub-problem(s) a driver solves, and ``invert`` maps their schedules back to a
schedule of the original problem. The drivers (:mod:`synth.synthesis.steps`, :mod:`synth.synthesis.alphabeta`)
ask :func:`reduction_for` which reduction applies and never branch on a collective's name. Three reductions:

- :class:`Reversal`: a reduction collective (ReduceScatter, Reduce) is the time-reversal of its broadcast-type
  dual (Allgather, Broadcast) solved on the reversed topology (:func:`synth.model.topology.reverse_topology`):
  a copy ``u -> v`` at step ``s`` of ``S`` becomes a reduce ``v -> u`` at step ``S - 1 - s``, so every link and
  switch port serves the same transfers in reverse order; rounds per step and start/end times reverse too
  (:func:`reverse_schedule`).
- :class:`Concatenation`: Allreduce is ReduceScatter followed by Allgather; the second schedule's steps (and
  times, when known) are shifted past the first's.
- :class:`CutIntoPieces`: every chunk is cut into ``k`` pieces that follow the same routes in the same order
  (:func:`cut_into_pieces`). A schedule that moves whole chunks store-and-forward pays a chunk's transfer time
  on every hop; cut into ``k`` pieces, a relay forwards piece 0 while piece 1 is still arriving, so the path
  latency shrinks to about one chunk time plus ``1/k`` of a chunk time per extra hop, while link loads stay
  the same. Keep ``k`` moderate: every piece is a step of a threadblock (MSCCL's executor allows 64 per
  threadblock, the legacy runtime 256).

Which collective reduces to which is data, in :data:`REVERSAL_DUAL` and :data:`CONCATENATION_PARTS`.

>>> from synth.model.topology import load_topology
>>> ring = load_topology("ring-4")
>>> reduction = reduction_for(CollectiveProblem(ring, "reducescatter", chunks_per_rank=1))
>>> (dual,) = reduction.apply()
>>> dual.collective, dual.topology.name
('allgather', 'ring-4-reversed')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Sequence

from synth.model.collectives import Collective, make_collective
from synth.model.sketch import Sketch, reverse_sketch
from synth.model.topology import Topology, reverse_topology
from synth.schedule.ir import COPY, REDUCE, Schedule, Transfer

# The broadcast-type collective whose time-reversal gives each reduction collective.
REVERSAL_DUAL = MappingProxyType({"reducescatter": "allgather", "reduce": "broadcast"})
# Collectives scheduled as one collective after another (in this order).
CONCATENATION_PARTS = MappingProxyType({"allreduce": ("reducescatter", "allgather")})


@dataclass(frozen=True)
class CollectiveProblem:
    """A collective to schedule on a topology: what the reductions map.

    ``collective`` is a canonical name (:func:`synth.model.collectives.normalize_name`); ``chunks_per_rank`` is
    None where the driver chooses it; ``sketch`` restricts the alpha-beta search (None: no restriction).
    """

    topology: Topology
    collective: str
    root: int | None = None
    chunks_per_rank: int | None = None
    sketch: Sketch | None = None


# ----------------------------------------------------------------------------------------------- schedules

def reverse_schedule(schedule: Schedule, collective: Collective, topology_name: str) -> Schedule:
    """Time-reverse a schedule: a broadcast-type schedule becomes one of the reduction ``collective``.

    Each copy ``u -> v`` at step ``s`` of ``S`` becomes a reduce ``v -> u`` at step ``S - 1 - s`` (and a reduce
    a copy); ``rounds_per_step`` is reversed; a transfer timed ``[start, end]`` is reflected within the
    schedule's time span ``[t0, t1]`` (first start, last end) to ``[t0 + t1 - end, t0 + t1 - start]``. So
    reversing twice, with the original collective, gives back the original schedule.

    >>> from synth.model.collectives import make_collective
    >>> ag = Schedule(make_collective("allgather", 2, 1), "pair", (Transfer(0, 0, 1, 0), Transfer(1, 1, 0, 1)),
    ...               2, 3, (1, 2))
    >>> rs = reverse_schedule(ag, make_collective("reducescatter", 2, 1), "pair")
    >>> [(t.chunk, t.src, t.dst, t.step, t.op) for t in rs.ordered()], rs.rounds_per_step
    ([(1, 0, 1, 0, 'reduce'), (0, 1, 0, 1, 'reduce')], (2, 1))
    """
    last = schedule.steps - 1
    starts = [t.start_us for t in schedule.transfers if t.start_us is not None]
    ends = [t.end_us for t in schedule.transfers if t.end_us is not None]
    span = min(starts, default=0.0) + max(ends, default=0.0)

    def flip(t: Transfer) -> Transfer:
        start = span - t.end_us if t.end_us is not None else None
        end = span - t.start_us if t.start_us is not None else None
        return Transfer(t.chunk, t.dst, t.src, last - t.step, COPY if t.op == REDUCE else REDUCE, start, end)

    rps = tuple(reversed(schedule.rounds_per_step)) if schedule.rounds_per_step else None
    return replace(schedule, collective=collective, topology=topology_name,
                   transfers=tuple(flip(t) for t in schedule.transfers), rounds_per_step=rps)


def concatenate_schedules(parts: Sequence[Schedule], collective: Collective, topology_name: str) -> Schedule:
    """One schedule that runs ``parts`` one after another: each part's steps (and times, when known) start
    after the previous parts'. Rounds add up when every part counts them; method and notes are the first
    part's method and no notes.

    >>> from synth.model.collectives import make_collective
    >>> a = Schedule(make_collective("allgather", 2, 1), "pair", (Transfer(0, 0, 1, 0, start_us=0.0, end_us=2.0),), 1)
    >>> both = concatenate_schedules([a, a], make_collective("allgather", 2, 1), "pair")
    >>> [(t.step, t.start_us, t.end_us) for t in both.transfers], both.steps
    ([(0, 0.0, 2.0), (1, 2.0, 4.0)], 2)
    """
    transfers: list[Transfer] = []
    step0, time0 = 0, 0.0
    for part in parts:
        for t in part.transfers:
            transfers.append(replace(t, step=t.step + step0,
                                     start_us=None if t.start_us is None else t.start_us + time0,
                                     end_us=None if t.end_us is None else t.end_us + time0))
        step0 += part.steps
        time0 += max((t.end_us for t in part.transfers if t.end_us is not None), default=0.0)
    if all(p.rounds_per_step is not None for p in parts):
        rps = tuple(r for p in parts for r in p.rounds_per_step)
        rounds = sum(rps)
    else:
        rps, rounds = None, None
    return Schedule(collective, topology_name, tuple(transfers), step0, rounds, rps, parts[0].method)


def split_collective(collective: Collective, pieces: int) -> Collective:
    """The same collective with ``pieces`` times the chunks per rank; raises ValueError if the piece layout
    (chunk ``c*k + p`` is piece ``p`` of chunk ``c``: same sources and destinations, contiguous buffer ranges)
    does not hold. It holds for every collective of :mod:`synth.model.collectives`."""
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


def cut_into_pieces(schedule: Schedule, pieces: int) -> Schedule:
    """Cut every chunk of ``schedule`` into ``pieces`` pieces that follow the same routes in the same order.

    Transfer ``(chunk c, step s)`` becomes ``(chunk c*k + p, step s*k + p)`` for ``p < k``, untimed (the replay
    gives the time), on the collective rebuilt with ``k`` times the chunks per rank (:func:`split_collective`).
    Step-snapshot semantics are preserved exactly: piece ``p`` of a send at step ``s`` sees piece ``p`` of every
    arrival at steps ``< s`` and of none at steps ``>= s``; for combining collectives every partial sum stays
    correct. ``notes["pieces"]`` multiplies.

    >>> from synth.synthesis.steps import synthesize_steps
    >>> from synth.model.topology import load_topology
    >>> s = synthesize_steps(load_topology("ring-4"), "allgather", steps=2, rounds=2).schedule
    >>> p = cut_into_pieces(s, 4)
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


def _collective(problem: CollectiveProblem, chunks_per_rank: int) -> Collective:
    return make_collective(problem.collective, problem.topology.num_ranks, chunks_per_rank, problem.root)


# ----------------------------------------------------------------------------------------------- reductions

@dataclass(frozen=True)
class Reversal:
    """A reduction collective (``problem``) solved as the time-reversal of its broadcast-type dual.

    ``apply()`` gives the dual on the reversed topology (sketch reversed too); ``invert([dual schedule])`` the
    reversed schedule on ``problem``'s collective with the dual schedule's chunks per rank.

    >>> from synth.model.topology import load_topology
    >>> from synth.synthesis.steps import synthesize_steps
    >>> ring = load_topology("ring-4")
    >>> reversal = Reversal(CollectiveProblem(ring, "reducescatter", chunks_per_rank=1))
    >>> (dual,) = reversal.apply()
    >>> forward = synthesize_steps(dual.topology, dual.collective, 2, 2).schedule
    >>> rs = reversal.invert([forward])
    >>> rs.collective.name, rs.topology, {t.op for t in rs.transfers}
    ('reducescatter', 'ring-4', {'reduce'})
    """

    problem: CollectiveProblem

    @property
    def dual(self) -> str:
        return REVERSAL_DUAL[self.problem.collective]

    def apply(self) -> tuple[CollectiveProblem]:
        p = self.problem
        sketch = reverse_sketch(p.sketch) if p.sketch is not None else None
        return (replace(p, topology=reverse_topology(p.topology), collective=self.dual, sketch=sketch),)

    def invert(self, schedules: Sequence[Schedule]) -> Schedule:
        (forward,) = schedules
        coll = _collective(self.problem, forward.collective.chunks_per_rank)
        return reverse_schedule(forward, coll, self.problem.topology.name)


@dataclass(frozen=True)
class Concatenation:
    """A collective (``problem``) scheduled as its parts one after another (Allreduce: ReduceScatter, then
    Allgather), all on the same topology.

    ``apply()`` gives one sub-problem per part; ``invert(schedules)`` the concatenated schedule on ``problem``'s
    collective, with the last part's chunks per rank (every part must have the same).

    >>> from synth.model.topology import load_topology
    >>> from synth.synthesis.steps import synthesize_steps
    >>> ring = load_topology("ring-4")
    >>> concat = Concatenation(CollectiveProblem(ring, "allreduce", chunks_per_rank=1))
    >>> [p.collective for p in concat.apply()]
    ['reducescatter', 'allgather']
    >>> ar = concat.invert([synthesize_steps(ring, p.collective, 2, 2).schedule for p in concat.apply()])
    >>> ar.collective.name, ar.steps, ar.rounds_per_step
    ('allreduce', 4, (1, 1, 1, 1))
    """

    problem: CollectiveProblem

    @property
    def parts(self) -> tuple[str, ...]:
        return CONCATENATION_PARTS[self.problem.collective]

    def apply(self) -> tuple[CollectiveProblem, ...]:
        return tuple(replace(self.problem, collective=name, root=None) for name in self.parts)

    def invert(self, schedules: Sequence[Schedule]) -> Schedule:
        chunks = {s.collective.chunks_per_rank for s in schedules}
        if len(chunks) != 1:
            raise ValueError(f"the parts of {self.problem.collective} have different chunks per rank: {chunks}")
        return concatenate_schedules(schedules, _collective(self.problem, chunks.pop()),
                                     self.problem.topology.name)


@dataclass(frozen=True)
class CutIntoPieces:
    """A problem with ``pieces`` times the chunks per rank, solved with whole chunks and cut into pieces.

    ``apply()`` gives the problem with ``chunks_per_rank / pieces`` chunks; ``invert([schedule])`` cuts every
    chunk of its schedule into ``pieces`` (:func:`cut_into_pieces`).

    >>> from synth.model.topology import load_topology
    >>> from synth.synthesis.steps import synthesize_steps
    >>> ring = load_topology("ring-4")
    >>> cut = CutIntoPieces(CollectiveProblem(ring, "allgather", chunks_per_rank=4), 4)
    >>> (whole,) = cut.apply()
    >>> whole.chunks_per_rank
    1
    >>> cut.invert([synthesize_steps(ring, "allgather", 2, 2, whole.chunks_per_rank).schedule]).steps
    8
    """

    problem: CollectiveProblem
    pieces: int

    def apply(self) -> tuple[CollectiveProblem]:
        chunks = self.problem.chunks_per_rank
        if chunks is None or chunks % self.pieces:
            raise ValueError(f"{chunks} chunks per rank do not cut into {self.pieces} pieces each")
        return (replace(self.problem, chunks_per_rank=chunks // self.pieces),)

    def invert(self, schedules: Sequence[Schedule]) -> Schedule:
        (whole,) = schedules
        return cut_into_pieces(whole, self.pieces)


def reduction_for(problem: CollectiveProblem) -> Reversal | Concatenation | None:
    """The reduction that makes ``problem``'s collective from others, or None when it is solved directly."""
    if problem.collective in REVERSAL_DUAL:
        return Reversal(problem)
    if problem.collective in CONCATENATION_PARTS:
        return Concatenation(problem)
    return None
