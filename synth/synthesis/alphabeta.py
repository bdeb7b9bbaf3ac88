"""Alpha-beta synthesis: route, order, pipeline, verify (DESIGN sections 4-6, issue 4).

The search works on whole chunks and then pipelines, because that is what measured best on this machine
class (a time-expanded MILP over fine pieces finds nothing in minutes; rounding LP relaxations deadlocks):

1. **start**: constructive routes (load-aware shortest-path trees, latency-optimal trees, and the routes of the
   best NCCL-style baseline when they are trees the sketch allows), one orbit representative at a time;
2. **improve** with a MILP at chunk granularity, warm-started from the best start:
   ``routed`` (:mod:`synth.formulations.routed`, load <= makespan on every link and switch port) or ``timexp``
   (:mod:`synth.formulations.timexp`, epochs; the flow LP for unicast collectives such as Alltoall);
3. **order and pipeline**: every candidate's routes are cut into ``k`` pieces (``k`` a power of two up to 32
   unless a sketch or the caller fixes it, with at most 64 transfers on any link, since MSCCL's executor runs at
   most 64 steps per threadblock) and ordered by the list scheduler (:mod:`synth.schedule.list_scheduler`); a timexp solution is
   also booked in its own epoch order and cut into pieces (:func:`synth.schedule.transforms.cut_into_pieces`);
4. **verify**: every candidate is replayed (:func:`synth.schedule.replay.verify`); the fastest wins. The baselines
   compete in ``synth solve``, where the simulator times every file: their replay ignores the runtime's FIFO, so
   it is no match for the list-scheduled times here (a 4-chunk shortest-path Allgather on TE-CCL's two DGX-2
   nodes replayed at 3.3 us, won here, and its file ran at 42 us).

Unless given, the chunks per rank start at 1 and double (up to 4) while the best routes' busiest resource stays
more than 1% above the cut bound of :mod:`synth.bounds.physical` on a bandwidth-bound instance: one tree per chunk cannot
split a rank's data over several trees, more chunks can.

Combining collectives go through the reductions of :mod:`synth.schedule.transforms`: ReduceScatter is the time
reversal of an Allgather schedule on the reversed topology (copies become reductions), Reduce of a Broadcast;
Allreduce is ReduceScatter followed by Allgather (the Allgather with the ReduceScatter's chunks and pieces).

``method="auto"`` runs ``routed`` (see :data:`AUTO_RULE`). The status is the MILP's, honestly: ``optimal`` only
when HiGHS proved the chunk-level model optimal (its objective estimates the time; the replay gives the real
figure), else ``feasible`` with the gap when known.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from synth.model.collectives import Collective, make_collective, normalize_name
from synth.errors import InfeasibleError, InputError, SolverError, SynthError
from synth.bounds.physical import bandwidth_bound_us
from synth.schedule.replay import verify
from synth.schedule.list_scheduler import (PLAN_CHANNELS, book_in_order, co_resident_channels, list_schedule, retime,
                                           reverse_in_time)
from synth.schedule.transforms import (CollectiveProblem, Concatenation, Reversal, cut_into_pieces, reduction_for,
                                       split_collective)
from synth.formulations.routes import (AlphaBetaProblem, Routes, is_symmetric, make_problem, route_loads, routes_from_schedule,
                     shortest_path_routes)
from synth.schedule.ir import Schedule
from synth.model.sketch import Sketch, load_sketch
from synth.solver.deadline import UNBOUNDED, Deadline
from synth.solver.highs import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, SolverOptions, Stall, Status, solve_model
from synth.synthesis.baselines import BaselineRun, BaselineTable, evaluate_baselines
from synth.synthesis.steps import SynthesisResult
from synth.model.topology import Topology, check_connected

METHODS = ("auto", "routed", "timexp")
AUTO_RULE = ("auto = routed, for every collective and size. Evidence (benchmarks/bench_alphabeta.py, 2 cores): on "
             "all seven instances of issue 4 routed and timexp reach the same replayed time (98.8-100% of the "
             "limit), routed in 0.2-4 s, timexp in 2.5-115 s; the binary epoch model never improved its start "
             "within its time limit and the Alltoall flow LP only matched the routed result. timexp stays available "
             "as the quality anchor.")
MAX_PIECES_PER_LINK = 64        # MSCCL executor: steps per threadblock
DEFAULT_MAX_PIECES = 32
MAX_TRANSFERS = 40_000          # list-scheduling budget per candidate
TIMEXP_MAX_EPOCHS = 48
TIMEXP_FLOW_EPOCHS = 40
TIMEXP_ROLLING_COLUMNS = 60_000  # binary epoch models above this many send columns are solved in windows
TIMEXP_WINDOW = 12
MAX_AUTO_CHUNKS = 4
CHUNK_ESCALATION_GAP = 0.01
TIMEXP_ROUTED_SHARE = 0.3       # of the time limit, for the routed MILP that provides timexp's start


@dataclass(frozen=True)
class Candidate:
    """One verified schedule and where it came from: ``time_us`` its replay, ``runtime_us`` (when known) its
    list-scheduled time with the runtime's FIFO depth, which decides (more pieces are more messages, and a
    connection holds two at a time)."""

    label: str
    schedule: Schedule
    time_us: float
    runtime_us: float | None = None

    @property
    def rank_us(self) -> float:
        return self.time_us if self.runtime_us is None else max(self.time_us, self.runtime_us)


@dataclass(frozen=True)
class _Solved:
    """A verified schedule with the solver's account. ``time_us`` is its replayed time; ``base_chunks`` the chunks
    per rank before cutting into ``pieces``; ``bandwidth_floor_us``/``best_load_us`` (direct solves only) say
    whether more chunks per rank could still help. ``record`` is for the report only, never for decisions."""

    schedule: Schedule
    status: Status
    seconds: float
    gap: float | None
    symmetry_order: int
    time_us: float
    base_chunks: int
    pieces: int
    record: dict
    bandwidth_floor_us: float = 0.0
    best_load_us: float = 0.0


@dataclass(frozen=True)
class _Booked:
    """A schedule a MILP ordered (its transfers booked in the model's order); ``splittable``: may be cut into
    more pieces."""

    label: str
    schedule: Schedule
    splittable: bool


@dataclass(frozen=True)
class _MilpOutcome:
    """What one alpha-beta model gave: routes (None when it found none), schedules in its order, the solver's
    account, and a record for the report."""

    routes: Routes | None
    booked: tuple[_Booked, ...]
    status: Status
    gap: float | None
    seconds: float
    record: dict


@dataclass(frozen=True)
class _Search:
    """What every sub-problem of one alpha-beta synthesis shares: the size (bytes), the formulation, solver
    options, the requested pieces, and where baselines come from (built once per request)."""

    size_bytes: float
    method: str
    options: SolverOptions
    pieces: int | None
    baselines: Callable[[str, Topology], BaselineTable]
    channels: tuple[int, ...] = PLAN_CHANNELS    # the list scheduler's (one for a reduction's forward schedule)
    most_pieces: int | None = None      # a sketch's ``pieces`` hint: tried, and so are fewer (powers of two)


def synthesize_alpha_beta(topology: Topology, collective_name: str, size_bytes: float, method: str = "auto",
                          sketch: Sketch | str | None = None, chunks: int | None = None, root: int | None = None,
                          options: SolverOptions = SolverOptions(), pieces: int | None = None,
                          baselines: Callable[[str, Topology], BaselineTable] | None = None) -> SynthesisResult:
    """Synthesize a verified alpha-beta schedule for any collective.

    Parameters
    ----------
    topology : Topology
    collective_name : str
        Any of :data:`synth.model.collectives.COLLECTIVES` (or an alias).
    size_bytes : float
        nccl-tests' size (DESIGN section 4), bytes; the schedule is tuned and timed at this size.
    method : str
        ``auto``, ``routed`` or ``timexp``.
    sketch : Sketch, str or None
        A sketch (or a shipped sketch name / JSON path, loaded against ``topology``).
    chunks : int, optional
        Chunks per rank before pipelining (default: the sketch's ``chunks_per_rank``, else 1, then 2 and 4
        while the routes stay more than 1% above the cut bound on a bandwidth-bound instance).
    root : int, optional
        Root of rooted collectives.
    options : SolverOptions
        HiGHS time limit (per MILP), gap, threads, seed. A sketch's hints fill in options left at their default.
    pieces : int, optional
        Pieces per chunk for pipelining (default: the sketch's hint, else the best power of two up to 32 by
        replay, keeping at most 64 transfers on every link).
    baselines : callable, optional
        ``(collective, topology) -> BaselineTable`` at ``size_bytes`` and ``root``, so a request builds each
        baseline table once (:meth:`synth.synthesis.request.SynthesisRequest.baselines_for`); default: built here.

    Returns
    -------
    SynthesisResult
        ``schedule`` (verified by replay; ``schedule.notes`` records the method, pieces, the model objective and
        every candidate's time), ``status`` (``optimal``/``feasible``), ``steps`` of the ordered schedule,
        ``rounds=None``, ``chunks`` = chunks per rank of the final (pipelined) schedule.

    Raises
    ------
    InputError
        Unknown collective or method, a bad sketch.
    InfeasibleError
        The sketch leaves a destination unreachable (the message names the sketch constraint to relax).

    Examples
    --------
    >>> from synth.model.topology import load_topology
    >>> r = synthesize_alpha_beta(load_topology("ring-4"), "allgather", 1 << 20)
    >>> from synth.schedule.replay import verify
    >>> verify(r.schedule, load_topology("ring-4"), 1 << 20).time_us > 0
    True
    """
    name = normalize_name(collective_name)
    if method not in METHODS:
        raise InputError("--method", "", f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if size_bytes <= 0:
        raise InputError("--size", "", f"size must be positive, got {size_bytes!r}")
    check_connected(topology)
    if isinstance(sketch, str):
        sketch = load_sketch(sketch, topology)
    options = _with_hints(options, sketch)
    chunks = chunks or (sketch.chunks_per_rank if sketch else None)
    # a sketch's pieces hint is the most tried: TE-CCL's dgx2 x2 sketch says 8, right at 1 GB; held to exactly 8,
    # dgx2 x2 Gather 1 MB went to 4 chunks per rank of 8 pieces, 1 KB messages that queue behind the NICs' 2.6 us
    # alphas (planned 8.3 us, ran 30.2 us); with fewer competing, 8 of 4 KB (8.7 us)
    most_pieces = sketch.hints.pieces if pieces is None and sketch is not None else None
    chosen = "routed" if method == "auto" else method
    if baselines is None:
        def baselines(collective: str, topo: Topology) -> BaselineTable:
            return evaluate_baselines(collective, topo, size_bytes, root)
    t0 = time.perf_counter()
    search = _Search(size_bytes, chosen, options, pieces, baselines, most_pieces=most_pieces)
    solved = _solve(CollectiveProblem(topology, name, root, chunks, sketch), search)
    schedule = solved.schedule
    notes = dict(schedule.notes)
    notes.update(solved.record)
    notes.update({"pieces": solved.pieces, "time_us": solved.time_us, "chunks": solved.base_chunks})
    notes["method"] = f"{method} ({chosen})" if method == "auto" else method
    notes["synthesis_seconds"] = round(time.perf_counter() - t0, 3)
    schedule = replace(schedule, notes=notes)
    return SynthesisResult(schedule, solved.status, solved.seconds, solved.gap, solved.symmetry_order,
                           schedule.steps, None, schedule.collective.chunks_per_rank)


def _with_hints(options: SolverOptions, sketch: Sketch | None) -> SolverOptions:
    if sketch is None:
        return options
    default = SolverOptions()
    if sketch.hints.time_limit_s is not None and options.time_limit_s == default.time_limit_s:
        options = replace(options, time_limit_s=sketch.hints.time_limit_s)
    if sketch.hints.mip_gap is not None and options.mip_gap == default.mip_gap:
        options = replace(options, mip_gap=sketch.hints.mip_gap)
    return options


# ----------------------------------------------------------------------------------------------- combining

def _solve(problem: CollectiveProblem, search: _Search) -> _Solved:
    """Solve a problem directly, or through the reduction (:mod:`synth.schedule.transforms`) that makes it."""
    reduction = reduction_for(problem)
    if isinstance(reduction, Reversal):
        return _reversal(reduction, search)
    if isinstance(reduction, Concatenation):
        return _concatenation(reduction, search)
    return _search_chunks(problem, search)


def _reversal(reduction: Reversal, search: _Search) -> _Solved:
    (dual,) = reduction.apply()
    forward = _solve(dual, replace(search, channels=(1,)))
    problem = reduction.problem
    coll = make_collective(problem.collective, problem.topology.num_ranks,
                           forward.schedule.collective.chunks_per_rank, problem.root)
    schedule = reverse_in_time(forward.schedule, problem.topology, coll, search.size_bytes, forward.schedule.method)
    report = verify(schedule, problem.topology, search.size_bytes)
    record = dict(forward.record, reversal_of=reduction.dual)
    return replace(forward, schedule=schedule, time_us=report.time_us, record=record)


def _concatenation(reduction: Concatenation, search: _Search) -> _Solved:
    """The first part is searched freely; the others are solved directly with its chunks per rank before
    pipelining and its piece count, so every part ends with the same chunks per rank."""
    parts = reduction.apply()
    first, *rest = parts
    solved = [_solve(first, search)]
    total = solved[0].schedule.collective.chunks_per_rank
    base = solved[0].base_chunks
    base, k = (base, total // base) if total % base == 0 else (total, 1)
    for part in rest:
        coll = make_collective(part.collective, part.topology.num_ranks, base, part.root)
        solved.append(_direct(part.topology, coll, part.sketch, search, k, exact_chunks=total))
    # the parts' steps put every ReduceScatter transfer on a link before its Allgather ones; the runtime's channels
    # let Allgather sends whose data is ready go first, so the plan is what runs only retimed that way
    schedule = retime(reduction.invert([s.schedule for s in solved]), reduction.problem.topology, search.size_bytes)
    report = verify(schedule, reduction.problem.topology, search.size_bytes)
    status = OPTIMAL if all(s.status == OPTIMAL for s in solved) else FEASIBLE
    gaps = [s.gap for s in solved if s.gap is not None]
    record = {p.collective: s.record for p, s in zip(parts, solved)}
    return _Solved(schedule, status, sum(s.seconds for s in solved), max(gaps) if gaps else None,
                   min(s.symmetry_order for s in solved), report.time_us, total, k, record)


# ----------------------------------------------------------------------------------------------- direct

def _search_chunks(problem: CollectiveProblem, search: _Search) -> _Solved:
    """Solve with ``chunks`` per rank, or, when not given, with 1 and then more chunks per rank (2, 4) while the
    best routes' busiest resource stays more than 1% above the cut bound, bandwidth dominates the time and the
    time limit has not passed: one tree per chunk cannot split a rank's data over several trees (tree
    packing), more chunks can."""
    topology = problem.topology

    def direct(chunks: int) -> _Solved:
        coll = make_collective(problem.collective, topology.num_ranks, chunks, problem.root)
        return _direct(topology, coll, problem.sketch, search, search.pieces)

    if problem.chunks_per_rank is not None:
        return direct(problem.chunks_per_rank)
    best = None
    c = 1
    deadline = time.perf_counter() + search.options.time_limit_s
    while True:
        solved = direct(c)
        if best is None or solved.time_us < best.time_us * (1 - 1e-4):
            best = solved
        floor, load = solved.bandwidth_floor_us, solved.best_load_us
        bandwidth_bound = load >= 0.5 * solved.time_us
        if c >= MAX_AUTO_CHUNKS or floor <= 0 or load <= floor * (1 + CHUNK_ESCALATION_GAP) or not bandwidth_bound \
                or time.perf_counter() > deadline or search.options.deadline.expired:
            return best
        c *= 2


def _direct(topology: Topology, coll: Collective, sketch: Sketch | None, search: _Search, pieces: int | None,
            exact_chunks: int | None = None) -> _Solved:
    """Non-combining collective: starts, one MILP, then pipelined candidates; the fastest verified one wins
    (only candidates with ``exact_chunks`` chunks per rank when given)."""
    size_bytes, method, options = search.size_bytes, search.method, search.options
    problem = make_problem(topology, coll, size_bytes, sketch)
    floor = _bandwidth_floor(problem)
    baseline = _best_baseline(problem, search)
    starts = _starts(problem, baseline)
    piece_options = _piece_options(problem, [r for _, r in starts], pieces, search.most_pieces)
    plan_k = max(piece_options)
    start_label, start_routes = min(starts, key=lambda s: _estimate(problem, s[1], plan_k))
    route_sets = list(starts)
    if method == "routed":
        outcome = _run_routed(problem, start_routes, plan_k, options, floor)
        if outcome.routes is not None:
            route_sets.append(("routed", outcome.routes))
        seconds = outcome.seconds
    else:
        # the epoch model starts from the best routes known: the routed MILP's (given a share of the time)
        share = replace(options, time_limit_s=TIMEXP_ROUTED_SHARE * options.time_limit_s)
        routed = _run_routed(problem, start_routes, plan_k, share, floor)
        if routed.routes is not None:
            route_sets.append(("routed", routed.routes))
            if _estimate(problem, routed.routes, plan_k) < _estimate(problem, start_routes, plan_k):
                start_label, start_routes = "routed", routed.routes
        rest = replace(options, time_limit_s=max(1.0, options.time_limit_s - routed.seconds))
        outcome = _run_timexp(problem, start_routes, plan_k, rest)
        seconds = outcome.seconds + routed.seconds
        outcome.record["routed_start"] = {k: routed.record.get(k) for k in ("solver_status", "objective")}
        if outcome.routes is not None:
            route_sets.append(("timexp", outcome.routes))
    status, gap, notes = outcome.status, outcome.gap, outcome.record
    notes["start"] = start_label
    candidates = _evaluate(problem, route_sets, outcome.booked, piece_options, size_bytes, method,
                           options.deadline, search.channels)
    if exact_chunks is not None:
        candidates = [c for c in candidates if c.schedule.collective.chunks_per_rank == exact_chunks]
    runnable = [c for c in candidates if c.schedule.collective.runs_at_power_of_two_sizes]
    best = min(runnable or candidates, key=lambda c: c.rank_us)
    best_load = min(route_loads(problem, r)[0] for _, r in route_sets)
    notes["winner"] = best.label
    notes["candidates_us"] = {c.label: round(c.rank_us, 3) for c in sorted(candidates, key=lambda c: c.rank_us)}
    notes["bandwidth_floor_us"] = floor
    notes["best_load_us"] = best_load
    if not best.label.startswith(("routed", "timexp")) and status == OPTIMAL:
        status = FEASIBLE  # the winner did not come from the model that was proven optimal
    schedule = replace(best.schedule, method=f"alpha-beta:{method}")
    pieces_used = best.schedule.collective.chunks_per_rank // coll.chunks_per_rank
    return _Solved(schedule, status, seconds, gap, problem.symmetry.order, best.time_us, coll.chunks_per_rank,
                   pieces_used, notes, floor, best_load)


def _best_baseline(problem: AlphaBetaProblem, search: _Search) -> BaselineRun | None:
    """The fastest NCCL-style baseline at the problem's size (from the request's table), or None."""
    try:
        return search.baselines(problem.collective.name, problem.topology).best()
    except SynthError:
        return None


def _starts(problem: AlphaBetaProblem, baseline) -> list[tuple[str, Routes]]:
    """Constructive symmetric starting routes: load-aware and latency-optimal shortest-path trees, and the best
    baseline's routes when they are symmetric trees the sketch allows at the same chunk count."""
    out = [("shortest-path-balanced", shortest_path_routes(problem, load_weight=1.0)),
           ("shortest-path", shortest_path_routes(problem, load_weight=0.0))]
    if baseline is not None and baseline.schedule.collective.chunks_per_rank == problem.collective.chunks_per_rank:
        routes = routes_from_schedule(problem, baseline.schedule)
        if routes is not None and is_symmetric(problem, routes):
            out.append((f"baseline:{baseline.name}", routes))
    return out


def _estimate(problem: AlphaBetaProblem, routes: Routes, pieces: int) -> float:
    """Pipelined makespan estimate (us): busiest resource plus the path latency of one piece."""
    load, _ = route_loads(problem, routes)
    return load + _path_us(problem, routes, pieces)


def _path_us(problem: AlphaBetaProblem, routes: Routes, pieces: int) -> float:
    topo = problem.topology
    d = np.array([l.alpha_us for l in topo.links]) + problem.beta_us() / pieces
    worst = 0.0
    for c, route in enumerate(routes.links):
        at = {s: 0.0 for s in problem.collective.chunks[c].sources}
        for li in route:
            at[topo.links[li].dst] = at[topo.links[li].src] + d[li]
            worst = max(worst, at[topo.links[li].dst])
    return worst


def _piece_options(problem: AlphaBetaProblem, route_sets, pieces: int | None, most: int | None = None
                   ) -> list[int]:
    """Pieces to try: the given count, else powers of two up to ``most`` (a sketch's hint, itself always tried)
    or ``DEFAULT_MAX_PIECES`` that keep every link at most ``MAX_PIECES_PER_LINK`` transfers and the schedule
    within the list-scheduling budget."""
    if pieces is not None:
        return [pieces]
    nlinks = len(problem.topology.links)
    per_link = max(int(r.link_counts(nlinks).max(initial=1)) for r in route_sets)
    transfers = max(r.num_transfers() for r in route_sets)
    out = [1]
    k, cap = 2, most or DEFAULT_MAX_PIECES
    while k <= cap and per_link * k <= MAX_PIECES_PER_LINK and transfers * k <= MAX_TRANSFERS:
        out.append(k)
        k *= 2
    return sorted(set(out) | ({most} if most else set()))


def _piece_routes(routes: Routes, pieces: int) -> list[tuple[int, ...]]:
    return [routes.links[c // pieces] for c in range(len(routes.links) * pieces)]


def _evaluate(problem: AlphaBetaProblem, route_sets, booked: tuple[_Booked, ...], piece_options, size_bytes,
              method, deadline: Deadline = UNBOUNDED, channels: tuple[int, ...] = (1,)) -> list[Candidate]:
    """List-schedule every route set at every piece count (and book MILP orders), verify, return candidates;
    once ``deadline`` has passed, the candidates built so far (at least one)."""
    topo = problem.topology
    own_first = problem.sketch.internode.own_chunks_first
    out = []
    seen = set()
    for label, routes in route_sets:
        key = routes.links
        if key in seen:
            continue
        seen.add(key)
        # timed only on channels whose threadblocks fit the GPU: 2 x dgx2 Scatter 1 MB under the rail sketch was
        # planned on eight at 8.4 us (128 threadblocks for its root, 80 SMs), and its file on four ran at 12.4 us;
        # so planned, the search takes fewer pieces, 10.1 us, and the file runs at 9.8 us
        fitting = co_resident_channels(topo, [li for path in routes.links for li in path], channels)
        for k in piece_options:
            if out and deadline.expired:
                return out
            coll = split_collective(problem.collective, k) if k > 1 else problem.collective
            sched = list_schedule(topo, coll, _piece_routes(routes, k), size_bytes, f"alpha-beta:{method}",
                                  own_first=own_first, notes={"routes": label, "pieces": k}, channels=fitting)
            out.append(Candidate(f"{label} x{k}", sched, verify(sched, topo, size_bytes).time_us,
                                 max(t.end_us for t in sched.transfers)))
    for b in booked:
        for k in (piece_options if b.splittable else [1]):
            s = cut_into_pieces(b.schedule, k) if k > 1 else b.schedule
            out.append(Candidate(f"{b.label} x{k}", s, verify(s, topo, size_bytes).time_us))
    return out


# ----------------------------------------------------------------------------------------------- MILPs

# The routed model's objective estimates the makespan (the list scheduler and the replay give the answer), so a
# solve within 0.01% of its bound stops once its incumbent has not improved for 10 s: ndv2 x4 Allreduce 1 KB held
# an incumbent 0.0001% from its bound for its whole 105 s limit, twice. (Stopping at the 0.01% gap itself lost
# tie-breaks that matter: dgx2-2node-tecc Gather 1 MB ran 2.5% slower.)
ROUTED_STALL = Stall(gap=1e-4, seconds=10.0)


def _run_routed(problem: AlphaBetaProblem, start: Routes, pieces: int, options: SolverOptions,
                floor: float) -> _MilpOutcome:
    from synth.formulations.routed import decode_routed, encode_routed

    enc = encode_routed(problem, start, pieces, z_lower_us=floor)
    res = solve_model(enc.model, replace(options, stall=options.stall or ROUTED_STALL), initial=enc.start)
    notes = {"model": "routed", "columns": enc.model.num_cols, "rows": enc.model.num_rows,
             "solver_status": res.status, "start_objective": float(enc.model.cost @ enc.start)}
    if res.status == INFEASIBLE:
        raise SolverError("the routing model rejected its own starting routes; this is a bug in the encoder")
    if res.x is None:
        notes["objective"] = None
        return _MilpOutcome(None, (), FEASIBLE, None, res.seconds, notes)
    notes["objective"] = res.objective
    notes["load_us"] = float(res.x[enc.z_col])
    notes["path_us"] = float(res.x[enc.t_col])
    return _MilpOutcome(decode_routed(enc, res), (), res.status, res.gap, res.seconds, notes)


def _bandwidth_floor(problem: AlphaBetaProblem) -> float:
    """A lower bound on the busiest resource's load (us): the topology's cut bound from :mod:`synth.bounds.physical`
    (a sketch only removes links, so the bound stays valid under it); 0 if it cannot be computed."""
    try:
        value, _ = bandwidth_bound_us(problem.collective.name, problem.topology, problem.size_bytes,
                                      problem.collective.root)
    except SynthError:
        return 0.0
    return float(value) * (1 - 1e-6) if np.isfinite(value) else 0.0


def _run_timexp(problem: AlphaBetaProblem, start: Routes, pieces: int, options: SolverOptions) -> _MilpOutcome:
    from synth.formulations import timexp as te

    unicast = all(len(c.dest_ranks - c.sources) <= 1 for c in problem.collective.chunks)
    if unicast:
        return _timexp_flow(problem, start, pieces, options)
    epoch = te.choose_epoch(problem, start, TIMEXP_MAX_EPOCHS)
    grid0 = te.make_grid(problem, epoch, 10 ** 9)
    if not te.symmetric_resources_ok(problem, grid0):
        problem = make_problem(problem.topology, problem.collective, problem.size_bytes, problem.sketch,
                               use_symmetry=False)
    start_epochs, horizon = te.epoch_start(problem, grid0, start)
    notes = {"model": "timexp", "epoch_us": epoch}
    extra = {c: start.links[c] for c in problem.reps}
    grid = te.make_grid(problem, epoch, horizon)
    enc = te.encode_timexp(problem, grid, start_epochs, extra_links=extra)
    notes.update({"epochs": horizon, "columns": enc.model.num_cols, "rows": enc.model.num_rows,
                  "start_finish_epoch": horizon})
    if len(enc.f_chunk) > TIMEXP_ROLLING_COLUMNS:
        notes["rolling_horizon_window"] = TIMEXP_WINDOW
        res = te.solve_rolling(enc, options, TIMEXP_WINDOW)
    else:
        res = solve_model(enc.model, options, initial=enc.start)
    notes["solver_status"] = res.status
    if res.x is None:
        return _MilpOutcome(None, (), FEASIBLE, None, res.seconds, notes)
    notes["finish_epoch"] = float(res.x[enc.finish_col])
    routes, position = te.decode_copies(enc, res)
    booked = book_in_order(problem.topology, problem.collective, routes.links, problem.size_bytes,
                           "alpha-beta:timexp", position, notes={"routes": "timexp-order"})
    return _MilpOutcome(routes, (_Booked("timexp-order", booked, True),), res.status, res.gap, res.seconds, notes)


def _timexp_flow(problem, start: Routes, pieces: int, options: SolverOptions) -> _MilpOutcome:
    """Flow LP for unicast collectives: epochs of 1/TIMEXP_FLOW_EPOCHS of the start's makespan; bisect the
    horizon for the fewest epochs the LP can meet, then decompose the flows into pieces."""
    from synth.formulations import timexp as te

    makespan = list_schedule(problem.topology, problem.collective, start.links, problem.size_bytes, "start",
                             own_first=problem.sketch.internode.own_chunks_first).transfers
    makespan = max(t.end_us for t in makespan)
    epoch = makespan / TIMEXP_FLOW_EPOCHS
    notes = {"model": "timexp-flow-lp", "epoch_us": epoch}
    lo, hi = 1, 2 * TIMEXP_FLOW_EPOCHS
    best = None
    seconds = 0.0
    deadline = time.perf_counter() + options.time_limit_s
    mid = TIMEXP_FLOW_EPOCHS + 4
    while lo <= hi and time.perf_counter() < deadline:
        grid = te.make_grid(problem, epoch, mid, fluid=True)
        try:
            enc = te.encode_timexp(problem, grid, None, fluid=True)
            left = max(1.0, deadline - time.perf_counter())
            res = solve_model(enc.model, replace(options, time_limit_s=left))
            seconds += res.seconds
            status = res.status
        except InfeasibleError:
            status = INFEASIBLE
        if status == OPTIMAL:
            best = (enc, res)
            hi = mid - 1
        elif status == INFEASIBLE:
            lo = mid + 1
        else:
            break
        mid = (lo + hi) // 2
    notes["solver_status"] = OPTIMAL if best is not None else NO_SOLUTION
    if best is None:
        return _MilpOutcome(None, (), FEASIBLE, None, seconds, notes)
    enc, res = best
    notes["epochs"] = enc.grid.num_epochs
    piece_routes, position = te.decode_flow(enc, res, pieces, start)
    fine = split_collective(problem.collective, pieces) if pieces > 1 else problem.collective
    booked = book_in_order(problem.topology, fine, piece_routes, problem.size_bytes, "alpha-beta:timexp",
                           position, notes={"routes": "timexp-flow"})
    listed = list_schedule(problem.topology, fine, piece_routes, problem.size_bytes, "alpha-beta:timexp",
                           own_first=problem.sketch.internode.own_chunks_first, notes={"routes": "timexp-flow"})
    # the LP is optimal for its horizon; the schedule's status is "feasible" (rounding to pieces is a heuristic)
    return _MilpOutcome(None, (_Booked(f"timexp-flow-order/{pieces}", booked, False),
                               _Booked(f"timexp-flow-list/{pieces}", listed, False)), FEASIBLE, None, seconds, notes)
