"""The exact (steps, rounds, chunks) Pareto frontier of the step formulation (SCCL's pareto-optimal search).

A step schedule (S, R, C) costs ``alpha * S + beta * (size / C) * R`` (DESIGN section 6): S buys latency and the
ratio R/C bandwidth. A point is on the frontier when no other feasible point has fewer or equal steps and a smaller
or equal ratio (one of them strictly); between equal points the one with fewer chunks is kept.

The search, level by level from the hop lower bound on steps up to ``max_steps``, looks at each level S for the
feasible point with the smallest ratio below the best ratio of fewer steps (anything else is dominated), and never
below the rounds-per-chunk lower bound of :mod:`synth.bounds.rounds`:

1. While no point is known yet, a *probe* (S, R, 1) with so many rounds that capacity never binds decides
   whether S steps can work at all; the rounds its schedule actually needs bound the level's ratio from above.
2. The lowest-ratio candidate is tried first: when it is feasible the level is done (often it meets the bound).
3. Otherwise a staircase walks the columns C = 1..``max_chunks``. Feasibility at fixed S survives more rounds,
   fewer chunks, and splitting every chunk into k pieces ((R, C) -> (kR, kC)), so the least feasible R of a
   column is never below that of the column before. Each column starts at the rounds where the previous one
   stopped, tests its top (the most rounds whose ratio still beats the best so far): infeasible means the whole
   column is; feasible starts a bisection for the column's least feasible R, whose ratio becomes the one to
   beat. Every instance below the level's point is thus proven infeasible: solved on the full model
   (:func:`synth.synthesis.steps.synthesize_steps` re-proves a symmetric model's infeasibility without symmetry),
   implied by a solved one (:func:`implied_infeasible`), or ruled out by the lower bound.
4. The search stops when a level reaches the lower bound, when no larger S can have a smaller ratio with
   ``C <= max_chunks`` (``S / max_chunks >= best``), after ``max_steps``, or when an optional time budget
   runs out (checked before each instance).

Instances that hit the time limit are ``unknown``: the search goes on as if infeasible, and the frontier is then
not proven (:attr:`Frontier.complete` is False).

Allreduce is ReduceScatter + Allgather with S/2 steps and R/2 rounds each, so only even S and R are searched.

Instances are solved in this process or, through any :class:`concurrent.futures.Executor` (a local process pool,
a Dask cluster: :mod:`synth.sweep.workers`), several at once: upcoming instances are solved speculatively and results
are taken in the sequential order, so the points and their statuses are the same whoever solves them.
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import math
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable, Iterable, Iterator

from synth.model.collectives import make_collective, normalize_name
from synth.errors import InfeasibleError, InputError, NoSolutionError
from synth.schedule.replay import verify
from synth.bounds.rounds import rounds_per_chunk_bound
from synth.schedule.ir import Schedule
from synth.solver.highs import FEASIBLE, INFEASIBLE, NO_SOLUTION, SolverOptions, Status
from synth.synthesis.steps import smallest_steps, steps_multiple, synthesize_steps
from synth.model.topology import Topology


SOLVED = "solved"            # how a status was established
IMPLIED = "implied"
PROBE = "probe"
FIRST, STAIR = "first", "stair"   # phases of a level after the probe

# Why a search stopped; the first two mean the frontier is complete (within the chunk cap).
STOP_LOWER_BOUND = "lower-bound"
STOP_CHUNK_CAP = "chunk-cap"
STOP_MAX_STEPS = "max-steps"
STOP_BUDGET = "budget"

_REL_TOL = 1e-9
DEFAULT_MAX_CHUNKS = 8
DEFAULT_EXTRA_STEPS = 4


@dataclass(frozen=True)
class SweepSpec:
    """What one frontier search explores (everything a worker needs besides the topology).

    ``rounds_per_chunk_lower`` is the LP bound on R/C (dimensionless); ``options.time_limit_s`` is per instance.
    """

    collective: str
    root: int | None
    min_steps: int
    max_steps: int
    max_chunks: int
    rounds_per_chunk_lower: float
    use_symmetry: bool = True
    options: SolverOptions = SolverOptions()

    @property
    def step_stride(self) -> int:
        """Allreduce splits steps and rounds in two halves, so it only takes even counts."""
        return steps_multiple(self.collective)

    def to_dict(self) -> dict:
        opts = self.options
        return {"collective": self.collective, "root": self.root, "min_steps": self.min_steps,
                "max_steps": self.max_steps, "max_chunks": self.max_chunks,
                "rounds_per_chunk_lower": self.rounds_per_chunk_lower,
                "rounds_per_chunk_lower_fraction": str(Fraction(self.rounds_per_chunk_lower).limit_denominator(1000)),
                "use_symmetry": self.use_symmetry,
                "solver": {"time_limit_s": opts.time_limit_s, "mip_gap": opts.mip_gap, "threads": opts.threads,
                           "seed": opts.seed}}


def plan_sweep(topology: Topology, collective: str, max_steps: int | None = None,
               max_chunks: int = DEFAULT_MAX_CHUNKS, root: int | None = None,
               options: SolverOptions = SolverOptions(), use_symmetry: bool = True) -> SweepSpec:
    """Compute the lower bounds and fill in defaults (``max_steps``: hop bound + 4).

    >>> from synth.model.topology import load_topology
    >>> spec = plan_sweep(load_topology("ring-4"), "allgather")
    >>> spec.min_steps, spec.max_steps, round(spec.rounds_per_chunk_lower, 3)
    (2, 6, 1.5)
    """
    name = normalize_name(collective)
    if max_chunks < 1:
        raise InputError("--max-chunks", "", f"must be at least 1, got {max_chunks}")
    coll = make_collective(name, topology.num_ranks, 1, root)
    low = smallest_steps(topology, name, 1, coll.root)
    low += -low % steps_multiple(name)
    high = low + DEFAULT_EXTRA_STEPS if max_steps is None else max_steps
    if high < low:
        raise InputError("--max-steps", "", f"{high} is below the hop lower bound {low} for {name} on "
                         f"{topology.name}; raise it")
    lower = rounds_per_chunk_bound(topology, name, coll.root)
    return SweepSpec(name, coll.root, low, high, max_chunks, lower, use_symmetry, options)


@dataclass(frozen=True, order=True)
class Instance:
    """One (steps, rounds, chunks) step instance."""

    steps: int
    rounds: int
    chunks: int

    @property
    def ratio(self) -> Fraction:
        """Rounds per chunk R/C (dimensionless)."""
        return Fraction(self.rounds, self.chunks)

    def __str__(self) -> str:
        return f"({self.steps},{self.rounds},{self.chunks})"


@dataclass(frozen=True)
class SweepPoint:
    """The outcome of one instance.

    ``status`` is feasible, infeasible (proven) or unknown (time limit). ``how`` says how: ``solved``,
    ``probe`` (the capacity-free instance of a level) or ``implied`` (``implied_by`` names the infeasible
    instance it follows from). For a feasible point ``rounds`` is what the schedule needs (for a probe, fewer
    than were allowed: ``asked_rounds``). Times in seconds: ``solve_seconds`` inside HiGHS, ``wall_seconds``
    for the whole instance including encoding, decoding and the replay check.
    """

    steps: int
    rounds: int
    chunks: int
    status: Status
    how: str = SOLVED
    asked_rounds: int | None = None
    implied_by: Instance | None = None
    solver_status: Status | None = None
    solve_seconds: float = 0.0
    wall_seconds: float = 0.0
    symmetry_order: int = 1
    message: str = ""
    schedule: Schedule | None = field(default=None, compare=False, repr=False)

    @property
    def instance(self) -> Instance:
        return Instance(self.steps, self.rounds, self.chunks)

    @property
    def ratio(self) -> Fraction:
        return Fraction(self.rounds, self.chunks)

    @property
    def feasible(self) -> bool:
        return self.status == FEASIBLE

    def to_dict(self) -> dict:
        return {"steps": self.steps, "rounds": self.rounds, "chunks": self.chunks,
                "rounds_per_chunk": str(self.ratio), "status": self.status, "how": self.how,
                "asked_rounds": self.asked_rounds,
                "implied_by": list(_triple(self.implied_by)) if self.implied_by else None,
                "solver_status": self.solver_status, "solve_seconds": self.solve_seconds,
                "wall_seconds": self.wall_seconds, "symmetry_order": self.symmetry_order, "message": self.message}


def _triple(inst: Instance) -> tuple[int, int, int]:
    return (inst.steps, inst.rounds, inst.chunks)


def pareto_filter(points: Iterable[SweepPoint]) -> tuple[SweepPoint, ...]:
    """The feasible points no other feasible point dominates, by increasing steps.

    ``a`` dominates ``b`` when ``a.steps <= b.steps`` and ``a.rounds/a.chunks <= b.rounds/b.chunks`` with one
    strict; of equal (steps, ratio) points the one with fewest chunks stays. Infeasible and unknown points are
    ignored. Pure: no solver, no I/O.

    >>> pts = [SweepPoint(2, 3, 2, FEASIBLE), SweepPoint(3, 7, 6, FEASIBLE), SweepPoint(3, 3, 2, FEASIBLE),
    ...        SweepPoint(2, 6, 4, FEASIBLE), SweepPoint(3, 6, 6, INFEASIBLE)]
    >>> [(p.steps, p.rounds, p.chunks) for p in pareto_filter(pts)]
    [(2, 3, 2), (3, 7, 6)]
    """
    best: dict[tuple[int, Fraction], SweepPoint] = {}
    for p in points:
        if not p.feasible:
            continue
        key = (p.steps, p.ratio)
        if key not in best or p.chunks < best[key].chunks:
            best[key] = p
    kept = []
    lowest = None
    for (steps, ratio), p in sorted(best.items()):
        if lowest is None or ratio < lowest:
            kept.append(p)
            lowest = ratio
    return tuple(kept)


def solve_instance(topology: Topology, spec: SweepSpec, inst: Instance, how: str = SOLVED) -> SweepPoint:
    """Solve one instance and replay-check its schedule (top level, so process pools and Dask can pickle it)."""
    t0 = time.perf_counter()
    try:
        result = synthesize_steps(topology, spec.collective, inst.steps, inst.rounds, inst.chunks, spec.root,
                                  spec.options, spec.use_symmetry)
    except InfeasibleError as exc:
        return SweepPoint(inst.steps, inst.rounds, inst.chunks, INFEASIBLE, how, solver_status=INFEASIBLE,
                          wall_seconds=time.perf_counter() - t0, message=str(exc))
    except NoSolutionError as exc:
        return SweepPoint(inst.steps, inst.rounds, inst.chunks, NO_SOLUTION, how, solver_status=NO_SOLUTION,
                          wall_seconds=time.perf_counter() - t0, message=str(exc))
    verify(result.schedule, topology, 1 << 20)
    rounds = result.schedule.rounds
    return SweepPoint(inst.steps, rounds, inst.chunks, FEASIBLE, how,
                      asked_rounds=inst.rounds if rounds != inst.rounds else None, solver_status=result.status,
                      solve_seconds=result.solve_seconds, wall_seconds=time.perf_counter() - t0,
                      symmetry_order=result.symmetry_order, schedule=result.schedule)


def instances_to_try(spec: SweepSpec, steps: int, upper: Fraction) -> Iterator[Instance]:
    """Instances at ``steps`` with ``lower <= R/C < upper``, ``R >= steps``, ``C <= max_chunks``, in (R/C, C) order.

    >>> spec = SweepSpec("allgather", None, 2, 3, 8, 7 / 6)
    >>> [str(i) for i in instances_to_try(spec, 3, Fraction(3, 2))]
    ['(3,7,6)', '(3,6,5)', '(3,5,4)', '(3,10,8)', '(3,9,7)', '(3,4,3)', '(3,8,6)', '(3,11,8)', '(3,7,5)', '(3,10,7)']
    """
    stride = spec.step_stride
    heap = []
    for c in range(1, spec.max_chunks + 1):
        r = max(steps, math.ceil(spec.rounds_per_chunk_lower * c * (1 - _REL_TOL) - _REL_TOL))
        r += (-r) % stride
        heap.append((Fraction(r, c), c, r))
    heapq.heapify(heap)
    while heap:
        ratio, c, r = heapq.heappop(heap)
        if ratio >= upper:
            return
        yield Instance(steps, r, c)
        heapq.heappush(heap, (Fraction(r + stride, c), c, r + stride))


def implied_infeasible(inst: Instance, infeasible: Iterable[Instance]) -> Instance | None:
    """An infeasible instance at the same steps that implies ``inst`` is infeasible, or None.

    Feasibility at fixed steps survives more rounds, fewer chunks, and splitting every chunk into k pieces
    ((R, C) -> (kR, kC)); so an infeasible (R', C') rules out (R, C) whenever some k >= 1 has kR <= R' and
    kC >= C'.

    >>> implied_infeasible(Instance(2, 3, 4), [Instance(2, 7, 8)])
    Instance(steps=2, rounds=7, chunks=8)
    >>> implied_infeasible(Instance(2, 4, 11), [Instance(2, 4, 10)]) is not None
    True
    """
    for known in infeasible:
        if known.steps == inst.steps:
            k = max(1, -(-known.chunks // inst.chunks))
            if k * inst.rounds <= known.rounds:
                return known
    return None


class _OutOfBudget(Exception):
    """The sweep's time budget ran out (caught by the search, which then stops)."""


@dataclass(frozen=True)
class _Column:
    """Staircase state: column ``chunks``; every R below ``lo`` is infeasible (solved, implied, or under the
    bound); ``hi`` is the least R known feasible (None: none yet); ratios must stay below ``upper``."""

    chunks: int
    lo: int
    hi: int | None
    upper: Fraction


@dataclass(frozen=True)
class Frontier:
    """A finished search: every point, the Pareto set, and whether the set is proven complete."""

    spec: SweepSpec
    points: tuple[SweepPoint, ...]
    frontier: tuple[SweepPoint, ...]
    stop_reason: str
    seconds: float

    @property
    def complete(self) -> bool:
        """True when the frontier is exact within ``max_chunks`` (every boundary point proven infeasible)."""
        return self.stop_reason in (STOP_LOWER_BOUND, STOP_CHUNK_CAP) and not any(
            p.status == NO_SOLUTION for p in self.points)


class FrontierSearch:
    """The search of the module docstring; iterate :meth:`points`, then read :attr:`stop_reason`."""

    def __init__(self, topology: Topology, spec: SweepSpec, budget_s: float | None = None):
        self.topology = topology
        self.spec = spec
        self.stop_reason: str | None = None
        self._deadline = None if budget_s is None else time.perf_counter() + budget_s
        self._infeasible: list[Instance] = []
        # where the sequential search stands (read by upcoming() for speculative solving)
        self._upper: Fraction | None = None
        self._next: Instance | None = None
        self._phase = PROBE
        self._col: _Column | None = None
        self._feasible: dict[Instance, SweepPoint] = {}

    def points(self, executor: cf.Executor | None = None, slots: int = 0,
               on_start: Callable[[Instance], None] | None = None) -> Iterator[SweepPoint]:
        """Yield every instance's outcome in the search order.

        ``executor`` solves instances (speculatively, up to ``slots`` at once); None solves them here, one by
        one. ``on_start`` is called with each instance before its result is awaited (for progress display).
        """
        runner = _Runner(self, executor, slots)
        self._on_start = on_start or (lambda inst: None)
        try:
            yield from self._search(runner)
        finally:
            runner.cancel_all()

    def _search(self, runner: _Runner) -> Iterator[SweepPoint]:
        try:
            yield from self._levels(runner)
        except _OutOfBudget:
            self.stop_reason = STOP_BUDGET

    def _levels(self, runner: _Runner) -> Iterator[SweepPoint]:
        spec = self.spec
        best: Fraction | None = None
        for steps in range(spec.min_steps, spec.max_steps + 1, spec.step_stride):
            if best is not None and next(instances_to_try(spec, steps, best), None) is None:
                self.stop_reason = STOP_CHUNK_CAP   # larger step counts allow no smaller ratio either
                return
            found: list[SweepPoint] = []
            yield from self._level_search(runner, steps, best, found)
            if found and (best is None or found[-1].ratio < best):
                best = found[-1].ratio
            if best is not None and best <= spec.rounds_per_chunk_lower * (1 + _REL_TOL) + _REL_TOL:
                self.stop_reason = STOP_LOWER_BOUND
                return
        self.stop_reason = STOP_MAX_STEPS

    def _level_search(self, runner, steps: int, upper: Fraction | None, found: list) -> Iterator[SweepPoint]:
        """The smallest-ratio feasible point below ``upper`` at ``steps`` (appended to ``found``)."""
        if upper is None:                                   # nothing known yet: can S steps work at all?
            probe = self._probe(steps)
            point = yield from self._solve(runner, probe, PROBE, None)
            if not point.feasible:
                return
            found.append(point)
            upper = point.ratio
        first = next(instances_to_try(self.spec, steps, upper), None)  # the lowest ratio first: it may be the bound
        if first is None:
            return
        point = yield from self._solve(runner, first, FIRST, _Column(1, steps, None, upper))
        if point.feasible:
            found.append(point)
            return
        col, inst = self._settle(steps, _Column(1, steps, None, upper))
        while inst is not None:
            point = yield from self._solve(runner, inst, STAIR, col)
            if point.feasible:   # a schedule may need fewer rounds than allowed: that many are feasible too
                inst = Instance(steps, max(col.lo, point.rounds), inst.chunks)
                self._feasible[inst] = point
            after = self._after(col, inst, point.feasible)
            if after.upper < col.upper:                     # the column closed on its least feasible R
                least = inst.rounds if point.feasible else col.hi
                found.append(self._feasible[Instance(steps, least, col.chunks)])
            col, inst = self._settle(steps, after)

    def _settle(self, steps: int, col: _Column) -> tuple[_Column, Instance | None]:
        """Skip finished columns; return the column state and the instance it tests next (None: level done).

        A column with no feasible R known tests its top (the most rounds with a ratio below ``upper``): if
        that is infeasible, so is the whole column. Otherwise it bisects between the rounds known infeasible
        and the least known feasible.
        """
        spec, stride = self.spec, self.spec.step_stride
        while col.chunks <= spec.max_chunks:
            c = col.chunks
            lo = max(col.lo, steps, math.ceil(spec.rounds_per_chunk_lower * c * (1 - _REL_TOL) - _REL_TOL))
            lo += (-lo) % stride
            col = replace(col, lo=lo)
            if col.hi is not None:
                mid = lo + (col.hi - lo) // (2 * stride) * stride
                return col, Instance(steps, mid, c)
            top = math.ceil(col.upper * c) - 1
            top -= top % stride
            if top >= lo:
                return col, Instance(steps, top, c)
            col = _Column(c + 1, lo, None, col.upper)       # nothing below the ratio to beat here
        return col, None

    def _after(self, col: _Column, inst: Instance, feasible: bool) -> _Column:
        """The column state once ``inst`` is decided; a column whose least feasible R is found closes, and the
        next column starts at that R with that ratio to beat (more chunks never need fewer rounds)."""
        if feasible:
            col = replace(col, hi=inst.rounds)
        else:
            col = replace(col, lo=inst.rounds + self.spec.step_stride)
        if col.hi is not None and col.lo >= col.hi:
            return _Column(col.chunks + 1, col.hi, None, Fraction(col.hi, col.chunks))
        return col

    def _solve(self, runner, inst: Instance, phase: str, col: _Column | None):
        """Yield the outcome of ``inst`` (implied or solved) and return it; records infeasibility."""
        self._next, self._phase, self._col = inst, phase, col
        if self._deadline is not None and time.perf_counter() > self._deadline:
            raise _OutOfBudget
        known = implied_infeasible(inst, self._infeasible) if phase != PROBE else None
        if known is not None:
            point = SweepPoint(inst.steps, inst.rounds, inst.chunks, INFEASIBLE, IMPLIED, implied_by=known)
        else:
            self._on_start(inst)
            point = runner.get(inst, PROBE if phase == PROBE else SOLVED)
            if point.status == INFEASIBLE and phase != PROBE:
                self._infeasible.append(inst)
        yield point
        return point

    def _probe(self, steps: int) -> Instance:
        """Rounds enough that no link or port capacity binds (a rank receives each chunk at most once)."""
        coll = make_collective(self.spec.collective, self.topology.num_ranks, 1, self.spec.root)
        rounds = steps * max(1, len(coll.chunks)) * self.topology.num_ranks
        return Instance(steps, rounds + (-rounds) % self.spec.step_stride, 1)

    # ---------------------------------------------------------------------------------------- speculation
    def upcoming(self, limit: int) -> list[Instance]:
        """Up to ``limit`` instances the sequential search may solve soon, the current one first.

        Guesses, in order: the next level's lowest-ratio candidate (that level starts with it unless this one
        ends at or below its ratio), then the instances this level tests next if the current one and its
        successors are infeasible (proofs are the slow part of a level), then the next one if it is feasible.
        """
        cur, col = self._next, self._col
        if cur is None or limit <= 0:
            return []
        spec = self.spec
        guesses = [cur]
        if self._phase != PROBE and col is not None:
            at_bound = cur.ratio <= spec.rounds_per_chunk_lower * (1 + _REL_TOL) + _REL_TOL
            if cur.steps + spec.step_stride <= spec.max_steps and not (self._phase == FIRST and at_bound):
                guesses.append(next(instances_to_try(spec, cur.steps + spec.step_stride, col.upper), None))
            if self._phase == FIRST:
                state, inst = self._settle(cur.steps, col)
                guesses.append(inst)
            else:
                state, inst = col, cur
            for _ in range(limit):
                if inst is None:
                    break
                state, inst = self._settle(cur.steps, self._after(state, inst, False))
                guesses.append(inst)
            if self._phase == STAIR:
                guesses.append(self._settle(cur.steps, self._after(col, cur, True))[1])
        out = []
        for inst in guesses:
            if inst is not None and inst not in out and (inst is cur
                                                         or not implied_infeasible(inst, self._infeasible)):
                out.append(inst)
        return out[:limit]


class _Runner:
    """Solves instances for the search: inline, or through an executor with speculative prefetching."""

    def __init__(self, search: FrontierSearch, executor: cf.Executor | None, slots: int):
        self.search = search
        self.executor = executor
        self.slots = max(1, slots) if executor is not None else 0
        self.pending: dict[Instance, cf.Future] = {}

    def get(self, inst: Instance, how: str) -> SweepPoint:
        """The outcome of ``inst`` (waiting for it), keeping up to ``slots`` upcoming instances in flight."""
        if self.executor is None:
            return solve_instance(self.search.topology, self.search.spec, inst, how)
        if inst not in self.pending:
            self.pending[inst] = self._submit(inst)
        future = self.pending[inst]
        self._refill(inst)
        while not future.done():
            cf.wait([f for f in self.pending.values() if not f.done()], return_when=cf.FIRST_COMPLETED)
            self._refill(inst)
        del self.pending[inst]
        return replace(future.result(), how=how)

    def _submit(self, inst: Instance) -> cf.Future:
        return self.executor.submit(solve_instance, self.search.topology, self.search.spec, inst)

    def _refill(self, current: Instance) -> None:
        wanted = [i for i in self.search.upcoming(self.slots + 2) if i != current]
        for inst in [i for i in self.pending if i not in wanted and i != current]:
            if self.pending[inst].cancel():      # not started, and no longer on the search's path
                del self.pending[inst]
        busy = 1 + sum(1 for i, f in self.pending.items() if i != current and not f.done())
        for inst in wanted:
            if busy >= self.slots:
                break
            if inst not in self.pending:
                self.pending[inst] = self._submit(inst)
                busy += 1

    def cancel_all(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()


def explore_frontier(topology: Topology, spec: SweepSpec, executor: cf.Executor | None = None, slots: int = 0,
                     on_point: Callable[[SweepPoint], None] | None = None,
                     budget_s: float | None = None) -> Frontier:
    """Run the whole search and return the points, the Pareto set and why it stopped.

    >>> from synth.model.topology import load_topology
    >>> topo = load_topology("ring-4")
    >>> f = explore_frontier(topo, plan_sweep(topo, "allgather", max_chunks=2))
    >>> [str(p.instance) for p in f.frontier], f.stop_reason
    (['(2,3,2)'], 'lower-bound')
    """
    t0 = time.perf_counter()
    search = FrontierSearch(topology, spec, budget_s)
    points = []
    for point in search.points(executor, slots):
        points.append(point)
        if on_point is not None:
            on_point(point)
    return Frontier(spec, tuple(points), pareto_filter(points), search.stop_reason, time.perf_counter() - t0)
