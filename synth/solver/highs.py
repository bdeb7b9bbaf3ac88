"""The solver boundary: the only module that imports highspy (lazily, so ``synth --help`` stays fast).

Encoders build a :class:`Model` of numpy arrays (COO triplets per constraint family, concatenated once) and
:func:`solve_model` passes it to HiGHS in one ``passModel`` call. HiGHS statuses are translated through one
table into ours; a time-limited incumbent is reported as ``feasible`` with its gap, never as ``optimal``.
pulp is the portable export layer (:func:`write_model`), not the hot path.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from synth.errors import SolverError
from synth.solver.deadline import UNBOUNDED, Deadline
from synth.text_enum import TextEnum


class Status(TextEnum):
    """How a search ended: the one status vocabulary of solver results, synthesis results and sweep points.

    A :class:`~synth.text_enum.TextEnum`, so JSON reports and comparisons with the plain strings keep working.
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"          # a solution, but a limit stopped the proof of optimality
    INFEASIBLE = "infeasible"      # proven: no solution exists
    NO_SOLUTION = "no-solution"    # a limit came before any solution or proof
    ERROR = "error"
    BASELINE = "baseline"          # not solved: an NCCL-style baseline construction


# Short names used by the encoders and drivers.
OPTIMAL, FEASIBLE, INFEASIBLE = Status.OPTIMAL, Status.FEASIBLE, Status.INFEASIBLE
NO_SOLUTION, ERROR = Status.NO_SOLUTION, Status.ERROR


@dataclass(frozen=True)
class Model:
    """A MILP ``min cost.x  s.t.  row_lower <= A x <= row_upper, col_lower <= x <= col_upper``.

    ``A`` is given as COO triplets (``rows``, ``cols``, ``vals``); ``integer`` marks integer columns.
    ``col_names`` are optional deterministic names for ``--write-model`` debugging.
    """

    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def num_cols(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)


@dataclass(frozen=True)
class Stall:
    """Stop a MIP whose gap is at most ``gap`` once its incumbent has not improved for ``seconds`` (HiGHS time):
    for models whose objective only estimates the answer, where the last fraction of a percent is a tie-break
    HiGHS may spend its whole limit proving."""

    gap: float
    seconds: float


@dataclass(frozen=True)
class SolverOptions:
    """HiGHS settings of one command.

    ``time_limit_s`` bounds each solver call; ``stall`` (:class:`Stall`) ends a settled MIP sooner; ``deadline``
    bounds the command, so a call gets at most the time
    left (:mod:`synth.solver.deadline`). ``node_limit`` bounds a MIP's branch-and-bound nodes: a budget that, unlike
    the wall clock, gives the same answer however loaded the machine is. ``progress`` receives the MIP's incumbent,
    dual bound and gap every :data:`MIP_PROGRESS_INTERVAL_S` seconds of a long solve (None: silent); it must be
    picklable where options travel to worker processes.
    """

    time_limit_s: float = 60.0
    mip_gap: float = 0.0
    stall: Stall | None = None
    threads: int | None = None
    seed: int = 0
    verbose: bool = False
    node_limit: int | None = None
    deadline: Deadline = UNBOUNDED
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @property
    def call_limit_s(self) -> float:
        """The limit of a solver call starting now: ``time_limit_s`` or the time left, whichever is shorter."""
        return self.deadline.cap(self.time_limit_s)


@dataclass(frozen=True)
class SolveResult:
    status: Status
    x: np.ndarray | None
    objective: float | None
    gap: float | None
    seconds: float
    highs_status: str = ""

    @property
    def has_solution(self) -> bool:
        return self.x is not None


class RowBuilder:
    """Accumulates constraint families as COO arrays; each ``add`` appends a block of rows at once."""

    def __init__(self):
        self._rows, self._cols, self._vals, self._lo, self._hi = [], [], [], [], []
        self.num_rows = 0

    def add(self, row_of_entry, cols, vals, lower, upper) -> None:
        """Add ``len(lower)`` rows; entry k goes to new row ``row_of_entry[k]`` (0-based within the block)."""
        lower = np.asarray(lower, dtype=float)
        upper = np.broadcast_to(np.asarray(upper, dtype=float), lower.shape)
        self._rows.append(np.asarray(row_of_entry, dtype=np.int64) + self.num_rows)
        self._cols.append(np.asarray(cols, dtype=np.int64))
        self._vals.append(np.broadcast_to(np.asarray(vals, dtype=float), np.shape(cols)).astype(float))
        self._lo.append(lower)
        self._hi.append(np.array(upper))
        self.num_rows += len(lower)

    def arrays(self):
        if not self._rows:
            empty = np.zeros(0)
            return empty.astype(np.int64), empty.astype(np.int64), empty, empty, empty
        return (np.concatenate(self._rows), np.concatenate(self._cols), np.concatenate(self._vals),
                np.concatenate(self._lo), np.concatenate(self._hi))


def _to_csr(model: Model):
    """Row-wise CSR arrays of the COO triplets; repeated (row, col) entries are summed (COO's meaning), since
    HiGHS rejects duplicates and symmetric models may add one column to a row through two group elements."""
    order = np.lexsort((model.cols, model.rows))
    rows, cols, vals = model.rows[order], model.cols[order], model.vals[order]
    if len(rows) > 1:
        new = np.ones(len(rows), dtype=bool)
        new[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        if not new.all():
            group = np.cumsum(new) - 1
            vals = np.bincount(group, weights=vals)
            rows, cols = rows[new], cols[new]
    start = np.zeros(model.num_rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=model.num_rows), out=start[1:])
    return start, cols.astype(np.int32), vals


def _status_table(highspy):
    s = highspy.HighsModelStatus
    return {
        s.kOptimal: OPTIMAL, s.kInfeasible: INFEASIBLE, s.kTimeLimit: None, s.kInterrupt: None,
        s.kSolutionLimit: None, s.kIterationLimit: None, s.kObjectiveBound: None, s.kObjectiveTarget: None,
        s.kUnboundedOrInfeasible: INFEASIBLE, s.kModelEmpty: OPTIMAL,
    }


def new_highs(highspy):
    """A ``highspy.Highs()`` whose banner goes to stderr: since highspy 1.16 the first one made in a process
    prints "Running HiGHS ..." on standard output before any option can be set, and stdout carries ``--json``.
    The banner is written by C++, so file descriptor 1 is pointed at 2 while it is made."""
    import sys
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:                 # no stdout to protect
        return highspy.Highs()
    try:
        os.dup2(2, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def solve_model(model: Model, options: SolverOptions = SolverOptions(),
                initial: np.ndarray | None = None) -> SolveResult:
    """Solve with HiGHS. ``initial`` is a feasible start (e.g. a baseline schedule) passed via setSolution."""
    import highspy

    t0 = time.perf_counter()
    h = new_highs(highspy)
    h.setOptionValue("output_flag", bool(options.verbose))
    h.setOptionValue("time_limit", float(options.call_limit_s))
    h.setOptionValue("mip_rel_gap", float(options.mip_gap))
    h.setOptionValue("random_seed", int(options.seed))
    if options.threads:
        h.setOptionValue("threads", int(options.threads))
    if options.node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(options.node_limit))
    lp = highspy.HighsLp()
    lp.num_col_ = model.num_cols
    lp.num_row_ = model.num_rows
    lp.col_cost_ = np.asarray(model.cost, dtype=float)
    lp.col_lower_ = np.asarray(model.col_lower, dtype=float)
    lp.col_upper_ = np.asarray(model.col_upper, dtype=float)
    lp.row_lower_ = np.asarray(model.row_lower, dtype=float)
    lp.row_upper_ = np.asarray(model.row_upper, dtype=float)
    start, index, value = _to_csr(model)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.a_matrix_.num_col_ = model.num_cols
    lp.a_matrix_.num_row_ = model.num_rows
    if np.any(model.integer):
        lp.integrality_ = [highspy.HighsVarType.kInteger if f else highspy.HighsVarType.kContinuous
                           for f in model.integer]
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        raise SolverError("HiGHS rejected the model (passModel failed); this is a bug in the encoder")
    if initial is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(np.asarray(initial, dtype=float))
        sol.value_valid = True
        h.setSolution(sol)
    if options.progress is not None and np.any(model.integer):
        h.cbMipInterrupt += _MipProgress(options.progress)
    if options.stall is not None and np.any(model.integer):
        h.cbMipInterrupt += _StallStop(options.stall)
    run_status = _run_interruptibly(h)
    seconds = time.perf_counter() - t0
    model_status = h.getModelStatus()
    name = h.modelStatusToString(model_status)
    if run_status == highspy.HighsStatus.kError:
        raise SolverError(f"HiGHS failed: {name}")
    info = h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    mapped = _status_table(highspy).get(model_status, ERROR)
    if mapped == ERROR:
        raise SolverError(f"HiGHS stopped with status {name!r}")
    if mapped is None:
        mapped = FEASIBLE if has_x else NO_SOLUTION
    x = np.asarray(h.getSolution().col_value) if has_x and mapped in (OPTIMAL, FEASIBLE) else None
    objective = h.getInfo().objective_function_value if x is not None else None
    gap = None
    if x is not None and np.any(model.integer):
        gap = 0.0 if mapped == OPTIMAL else float(info.mip_gap)
        if gap is not None and (math.isinf(gap) or math.isnan(gap)):
            gap = None
    return SolveResult(mapped, x, objective, gap, seconds, name)


def solve_lp(cost, rows, cols, vals, row_lower, row_upper, what: str) -> float:
    """The optimum of ``min cost @ x`` over ``x >= 0`` and ``row_lower <= A x <= row_upper`` (``A`` as COO
    triplets), ``inf`` when infeasible: the small LPs of the bounds. ``what`` names the LP in an error."""
    cost = np.asarray(cost, dtype=float)
    model = Model(cost, np.zeros(len(cost)), np.full(len(cost), np.inf), np.zeros(len(cost), dtype=bool),
                  np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), np.asarray(vals, dtype=float),
                  np.asarray(row_lower, dtype=float), np.asarray(row_upper, dtype=float))
    result = solve_model(model, SolverOptions(time_limit_s=600))
    if result.status == INFEASIBLE:
        return math.inf
    if result.status != OPTIMAL:
        raise SolverError(f"HiGHS could not solve {what} ({result.highs_status})")
    return float(result.objective)


# Seconds between two MIP progress lines of one solve (the first comes after this long too: short solves say
# nothing).
MIP_PROGRESS_INTERVAL_S = 5.0


class _MipProgress:
    """A HiGHS MIP callback that reports the incumbent, the dual bound and the gap, at most once per interval.

    Runs in HiGHS' solver thread; it only formats a line and hands it to ``progress``.
    """

    def __init__(self, progress: Callable[[str], None], interval_s: float | None = None):
        self.progress = progress
        self.interval_s = MIP_PROGRESS_INTERVAL_S if interval_s is None else interval_s
        self.next_s = self.interval_s

    def __call__(self, event) -> None:
        out = event.data_out
        if out.running_time < self.next_s:
            return
        self.next_s = out.running_time + self.interval_s
        self.progress(mip_progress_line(out.running_time, out.mip_primal_bound, out.mip_dual_bound, out.mip_gap,
                                        out.mip_node_count))


class _StallStop:
    """A HiGHS MIP callback that interrupts the solve when :class:`Stall` says it has settled."""

    def __init__(self, stall: Stall):
        self.stall = stall
        self.best = math.inf
        self.since_s = 0.0

    def __call__(self, event) -> None:
        out = event.data_out
        if out.mip_primal_bound < self.best:
            self.best, self.since_s = out.mip_primal_bound, out.running_time
        elif (math.isfinite(self.best) and out.mip_gap <= self.stall.gap
              and out.running_time - self.since_s >= self.stall.seconds):
            event.interrupt()


def mip_progress_line(seconds: float, incumbent: float, bound: float, gap: float, nodes: int) -> str:
    """One MIP progress line (objective units are the model's: us for makespans, rounds for step models).

    >>> mip_progress_line(12.3, 105.0, 100.0, 0.0476, 310)
    '    MIP 12 s: incumbent 105, bound 100, gap 4.76%, 310 nodes'
    >>> mip_progress_line(5.0, float("inf"), 98.5, float("inf"), 0)
    '    MIP 5 s: no incumbent yet, bound 98.5, 0 nodes'
    """
    found = f"incumbent {incumbent:.6g}" if math.isfinite(incumbent) else "no incumbent yet"
    gap_text = f", gap {100 * gap:.2f}%" if math.isfinite(incumbent) and math.isfinite(gap) else ""
    return f"    MIP {seconds:.0f} s: {found}, bound {bound:.6g}{gap_text}, {nodes} nodes"


# How long to wait for HiGHS to stop after Ctrl-C before giving up on its answer (seconds).
_CANCEL_WAIT_S = 5.0


def _run_interruptibly(h):
    """Run HiGHS in its solver thread so that Ctrl-C (or SIGTERM turned into KeyboardInterrupt by the CLI) stops
    it within about 0.1 s: the interrupt is passed to HiGHS' interrupt callbacks, and KeyboardInterrupt is raised
    once the solver has stopped. (highspy's own ``solve`` prints and exits on a repeated Ctrl-C.)"""
    h.HandleUserInterrupt = True
    h.startSolve()
    try:
        while True:
            done, status = h.wait(0.1)
            if done:
                return status
    except KeyboardInterrupt:
        h.cancelSolve()
        deadline = time.perf_counter() + _CANCEL_WAIT_S
        while time.perf_counter() < deadline and not h.wait(0.1)[0]:
            pass
        raise


def write_model(model: Model, path: str) -> None:
    """Export the model through pulp as an LP (``.lp``) or MPS (``.mps``) file for other solvers."""
    import pulp

    names = model.col_names or tuple(f"x{i}" for i in range(model.num_cols))
    prob = pulp.LpProblem("synth", pulp.LpMinimize)
    # PuLP >= 3.3 attaches variables to the problem (constructing LpVariable directly is deprecated there)
    make = getattr(prob, "add_variable", None) or pulp.LpVariable
    variables = [make(names[i], lowBound=model.col_lower[i],
                      upBound=None if np.isinf(model.col_upper[i]) else model.col_upper[i],
                      cat="Integer" if model.integer[i] else "Continuous")
                 for i in range(model.num_cols)]
    prob += pulp.lpSum(c * variables[i] for i, c in enumerate(model.cost) if c)
    order = np.argsort(model.rows, kind="stable")
    rows, cols, vals = model.rows[order], model.cols[order], model.vals[order]
    bounds = np.searchsorted(rows, np.arange(model.num_rows + 1))
    for r in range(model.num_rows):
        expr = pulp.lpSum(vals[k] * variables[cols[k]] for k in range(bounds[r], bounds[r + 1]))
        lo, hi = model.row_lower[r], model.row_upper[r]
        if lo == hi:
            prob += expr == lo, f"r{r}"
        else:
            if not np.isinf(lo):
                prob += expr >= lo, f"r{r}_lo"
            if not np.isinf(hi):
                prob += expr <= hi, f"r{r}_hi"
    if str(path).endswith(".mps"):
        prob.writeMPS(path)
    else:
        prob.writeLP(path)
