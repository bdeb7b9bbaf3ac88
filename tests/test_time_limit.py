"""``--time-limit`` bounds the whole ``synth solve``: the deadline, its reach into HiGHS and every phase, and the
best verified plan written when it runs out (status ``time-limit``). Time is driven by injected clocks."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from synth.cli import main
from synth.errors import NoSolutionError
from synth.model.topology import load_topology
from synth.solver.deadline import UNBOUNDED, Deadline, DeadlinePassed, search_deadline
from synth.solver.highs import FEASIBLE, NO_SOLUTION, OPTIMAL, Model, SolverOptions, solve_model
from synth.synthesis.method import Method
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import timed_phase
from synth.synthesis.solve import TIME_LIMIT_STATUS, solve


class ManualClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def expired_deadline(budget_s: float = 30.0) -> Deadline:
    """A deadline whose whole budget has passed already."""
    clock = ManualClock()
    deadline = Deadline.after(budget_s, clock)
    clock.now += budget_s + 1
    return deadline


def test_deadline_counts_down_on_its_clock():
    clock = ManualClock()
    d = Deadline.after(20.0, clock)
    assert (d.remaining_s(), d.expired, d.cap(60.0), d.cap(5.0)) == (20.0, False, 20.0, 5.0)
    clock.now += 15
    assert (d.elapsed_s(), d.remaining_s(), d.cap(60.0)) == (15.0, 5.0, 5.0)
    assert d.reserving(3.0).remaining_s() == 2.0
    clock.now += 6
    assert (d.remaining_s(), d.expired, d.reserving(3.0).expired) == (0.0, True, True)


def test_unbounded_deadline_never_expires():
    assert (UNBOUNDED.bounded, UNBOUNDED.expired, UNBOUNDED.remaining_s(), UNBOUNDED.cap(7.0)) == (
        False, False, math.inf, 7.0)
    assert search_deadline(UNBOUNDED) is UNBOUNDED


def test_search_keeps_a_reserve_for_writing_the_file():
    assert search_deadline(Deadline(20.0)).budget_s == pytest.approx(17.0)     # 15%
    assert search_deadline(Deadline(2.0)).budget_s == pytest.approx(1.5)       # at least 0.5 s
    assert search_deadline(Deadline(0.2)).budget_s == 0.0                      # never below nothing
    assert search_deadline(Deadline(3600.0)).budget_s == pytest.approx(3540.0)  # at most 60 s


def _knapsack(n: int = 12) -> Model:
    """max sum v x  s.t.  sum w x <= W, x binary (as a minimisation)."""
    rng = np.random.default_rng(1)
    weights = rng.integers(1, 50, n).astype(float)
    return Model(cost=-rng.integers(1, 50, n).astype(float), col_lower=np.zeros(n), col_upper=np.ones(n),
                 integer=np.ones(n, dtype=bool), rows=np.zeros(n, dtype=np.int64), cols=np.arange(n),
                 vals=weights, row_lower=np.array([-np.inf]), row_upper=np.array([weights.sum() / 2]))


def test_highs_gets_at_most_the_time_left():
    model = _knapsack()
    assert SolverOptions(time_limit_s=60.0, deadline=Deadline.after(10.0)).call_limit_s <= 10.0
    assert solve_model(model, SolverOptions()).status == OPTIMAL
    late = SolverOptions(time_limit_s=60.0, deadline=expired_deadline())
    assert late.call_limit_s == 0.0
    # no time left: no search, but a feasible start is still a solution (never called optimal)
    assert solve_model(model, late).status == NO_SOLUTION
    started = solve_model(model, late, initial=np.zeros(model.num_cols))
    assert (started.status, started.objective) == (FEASIBLE, 0.0)


def test_request_hands_the_search_part_of_its_deadline_to_every_solver_call(ring4):
    clock = ManualClock()
    deadline = Deadline.after(20.0, clock)
    request = SynthesisRequest(ring4, "allgather", 1 << 20, deadline=deadline)
    assert request.search_deadline == request.options.deadline == search_deadline(deadline)
    assert request.options.deadline.budget_s == pytest.approx(17.0)
    assert SynthesisRequest(ring4, "allgather", 1 << 20).search_deadline is UNBOUNDED


def test_a_phase_that_cannot_start_in_time_is_skipped_and_says_so(ring4):
    messages = []
    request = SynthesisRequest(ring4, "allgather", 1 << 20, deadline=expired_deadline())

    def never():
        raise AssertionError("a phase ran after the time limit")

    assert timed_phase("tree packing", never, request, messages.append) == []
    assert messages == ["  tree packing: skipped (time limit reached)"]


def test_a_phase_cut_by_the_deadline_leaves_the_others_but_real_failures_still_raise(ring4):
    clock = ManualClock()
    request = SynthesisRequest(ring4, "allgather", 1 << 20, deadline=Deadline.after(10.0, clock))
    messages = []

    def cut():
        clock.now += 60                     # the solver ran out of time mid-phase
        raise NoSolutionError("the solver found no schedule within 8.5 s")

    assert timed_phase("alpha-beta", cut, request, messages.append) == []
    assert messages == ["  alpha-beta: cut by the time limit (the solver found no schedule within 8.5 s)"]
    on_time = SynthesisRequest(ring4, "allgather", 1 << 20, deadline=Deadline.after(10.0, ManualClock()))
    with pytest.raises(NoSolutionError):
        timed_phase("alpha-beta", lambda: (_ for _ in ()).throw(NoSolutionError("no")), on_time)


def test_out_of_time_the_best_baseline_is_written_with_status_time_limit():
    dgx1 = load_topology("dgx1")
    messages = []
    solution = solve(SynthesisRequest(dgx1, "allgather", 1 << 20, deadline=expired_deadline()),
                     progress=messages.append)
    assert solution.time_limited
    assert solution.chosen.candidate.label.startswith("baseline/")
    assert solution.xml.text.startswith("<algo")
    report = solution.report()
    assert (report["status"], report["plan_status"], report["time_limited"]) == (TIME_LIMIT_STATUS, "baseline",
                                                                                True)
    assert {"  step search: skipped (time limit reached)", "  alpha-beta: skipped (time limit reached)",
            "  tree packing: skipped (time limit reached)"} <= set(messages)
    # out of time, only the baseline with the fewest transfers is built (the quickest to build, lower and check),
    # and only it is written
    assert [c.label for c in solution.candidates] == ["baseline/ring/c1"]
    assert solution.request.baselines.reasons[-1].endswith("not built, the time limit was reached")
    assert sum(m.startswith("  writing ") for m in messages) == 1
    assert any(m.startswith("  baseline ") and m.endswith(": not built, the time limit was reached") for m in messages)


def test_a_search_that_ends_in_time_is_not_time_limited(ring4):
    solution = solve(SynthesisRequest(ring4, "allgather", 1 << 20, deadline=Deadline.after(3600.0)))
    assert not solution.time_limited and solution.report()["status"] != TIME_LIMIT_STATUS


def test_nothing_verified_in_time_is_no_solution():
    """An explicit method has no baseline to fall back on: out of time, nothing verified, exit code 3."""
    request = SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20, method=Method.ROUTED,
                               deadline=expired_deadline())
    with pytest.raises(NoSolutionError, match="no verified schedule within the time limit; raise --time-limit"):
        solve(request)


def test_cli_tiny_limit_writes_a_verified_plan_and_says_the_limit_cut_the_search(tmp_path):
    """ndv2 x2 searches for more than a minute unbounded; with 0.5 s only the baselines run (the search part of
    the budget is already gone after loading), and the file is written and verified."""
    out = tmp_path / "ag.xml"
    r = CliRunner().invoke(main, ["solve", "allgather", "--topology", "ndv2", "--nodes", "2", "--size", "1MB",
                                  "--time-limit", "0.5", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert (report["status"], report["time_limited"]) == ("time-limit", True)
    assert out.read_text().startswith("<algo")
    assert "status time-limit: the 0.5 s limit cut the search" in r.stderr
    check = CliRunner().invoke(main, ["check", str(out), "--target", "executor"])
    assert check.exit_code == 0, check.output


def test_hierarchy_stops_composing_at_the_deadline_and_counts_its_sub_problems():
    from synth.synthesis.hierarchy import hierarchy_plans, synthesize_hierarchy

    topology = load_topology("dgx-h100", nodes=4)
    assert len(hierarchy_plans(topology, "allgather", 1 << 20)) > 1
    messages = []
    found = synthesize_hierarchy(topology, "allgather", 1 << 20, progress=messages.append,
                                 deadline=expired_deadline())
    total = len(hierarchy_plans(topology, "allgather", 1 << 20))
    assert messages[0].startswith(f"  hierarchy: composing {total} plan(s)")
    assert len(found) == 1 and messages[1].startswith(f"  [1/{total}] ")
    assert messages[2] == f"  time limit reached: {total - 1} composition(s) not tried"


def _first_write_takes_the_budget(monkeypatch, clock, first_simulates_slower: float = 1.0):
    """Every file takes longer to write than the whole budget; the first file simulates ``first_simulates_slower``
    times its real simulated time (a plan whose file runs slower than its replay)."""
    import dataclasses
    import synth.synthesis.solve as solve_module

    real_emit = solve_module.emit_verified_xml
    calls = []

    def slow_emit(*args, **kwargs):
        clock.now += 10_000
        emitted = real_emit(*args, **kwargs)
        calls.append(emitted)
        factor = first_simulates_slower if len(calls) == 1 else 1.0
        return dataclasses.replace(emitted, simulated_us=emitted.simulated_us * factor)

    monkeypatch.setattr(solve_module, "emit_verified_xml", slow_emit)


def test_when_time_runs_out_a_baseline_replaying_faster_is_still_written(monkeypatch):
    """The deadline passes during the first write, and that file simulates slower than a baseline replays: the
    baseline (the smallest such program) is written too, so the file is never slower than what the runtime would
    run; the other candidates are left."""
    clock = ManualClock()
    _first_write_takes_the_budget(monkeypatch, clock, first_simulates_slower=3.0)
    messages = []
    solution = solve(SynthesisRequest(load_topology("fully-connected-4"), "allgather", 1 << 20,
                                      deadline=Deadline.after(3600.0, clock)), progress=messages.append)
    writes = [m for m in messages if m.startswith("  writing ")]
    assert solution.time_limited and len(writes) == 2
    assert not writes[0].startswith("  writing baseline/") and writes[1].startswith("  writing baseline/")
    assert solution.baseline is not None and solution.chosen is solution.baseline
    assert any(m.endswith("not written (a baseline still is)") for m in messages)


def test_when_time_runs_out_no_baseline_is_written_that_cannot_win(monkeypatch):
    """The deadline passes during the first write, and no baseline replays faster than that file: the command
    ends there (the time limit bounds it); the report compares with the fastest baseline's replay."""
    clock = ManualClock()
    _first_write_takes_the_budget(monkeypatch, clock)
    messages = []
    solution = solve(SynthesisRequest(load_topology("fully-connected-4"), "allgather", 1 << 20,
                                      deadline=Deadline.after(3600.0, clock)), progress=messages.append)
    writes = [m for m in messages if m.startswith("  writing ")]
    assert solution.time_limited and len(writes) == 1 and not writes[0].startswith("  writing baseline/")
    assert solution.baseline is None
    fastest_replay = min(r.report.time_us for r in solution.request.baselines.runs if r.runnable)
    assert solution.chosen.simulated_us <= fastest_replay * (1 + 1e-9)
    assert solution.report()["speedup_vs_baseline"] >= 1.0


def _writes_stop_at(monkeypatch, call: int) -> list[str]:
    """The ``call``-th write (1-based) is where the CLI's hard stop arrives (:class:`DeadlinePassed`); the writes
    before it run as usual. Returns the labels written, in order."""
    from synth.synthesis import solve as solve_module

    real_emit, labels = solve_module.emit_verified_xml, []

    def emit(*args, **kwargs):
        labels.append(args[0].method)
        if len(labels) == call:
            raise DeadlinePassed
        return real_emit(*args, **kwargs)

    monkeypatch.setattr(solve_module, "emit_verified_xml", emit)
    return labels


def test_a_hard_stop_after_a_verified_file_keeps_it_with_status_time_limit(monkeypatch):
    writes = _writes_stop_at(monkeypatch, call=2)
    messages = []
    solution = solve(SynthesisRequest(load_topology("fully-connected-4"), "allgather", 1 << 20),
                     progress=messages.append)
    assert len(writes) == 2 and solution.time_limited
    assert solution.report()["status"] == TIME_LIMIT_STATUS
    assert solution.xml.text.startswith("<algo") and solution.chosen.candidate.result.schedule.method == writes[0]
    assert any(m.startswith("  time limit and grace passed while writing ") for m in messages)


def test_a_hard_stop_before_any_verified_file_names_what_was_being_written(monkeypatch):
    _writes_stop_at(monkeypatch, call=1)
    request = SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20, deadline=Deadline.after(2.0))
    with pytest.raises(NoSolutionError, match=r"^the 2 s time limit and 10 s of grace to finish a file ran out while "
                       r"writing \S+ \(\d+ transfers\), and no plan was verified; nothing is written\. Raise "
                       r"--time-limit \(at 4 GPUs"):
        solve(request)


def test_the_cli_hard_stop_interrupts_work_that_never_looks_at_the_clock(monkeypatch):
    import time

    from synth.cli._common import hard_stop
    from synth.solver import deadline as deadline_module

    monkeypatch.setattr(deadline_module, "HARD_STOP_GRACE_MIN_S", 0.05)
    started = time.monotonic()
    with pytest.raises(DeadlinePassed):
        with hard_stop(Deadline.after(0.05)):
            while time.monotonic() - started < 5.0:
                pass
    assert time.monotonic() - started < 2.0
    with hard_stop(Deadline.after(0.05)):   # left in time: disarmed, nothing arrives later
        pass
    time.sleep(0.2)
    with hard_stop(UNBOUNDED):
        pass


def test_cli_out_of_time_before_any_plan_exits_3_and_writes_nothing(monkeypatch, tmp_path):
    """The writing outlasts the limit and its grace: one line naming the file being written, exit code 3, no file."""
    import time

    from synth.solver import deadline as deadline_module
    from synth.synthesis import solve as solve_module

    monkeypatch.setattr(deadline_module, "HARD_STOP_GRACE_MIN_S", 0.5)
    monkeypatch.setattr(solve_module, "emit_verified_xml", lambda *args, **kwargs: time.sleep(30))
    out = tmp_path / "ag.xml"
    started = time.monotonic()
    # the search keeps 0.5 s of the 2 s for writing (it stops by itself), so the stop comes while writing even
    # on a loaded machine
    r = CliRunner().invoke(main, ["solve", "allgather", "--topology", "ring-4", "--time-limit", "2", "-o",
                                  str(out)])
    assert r.exit_code == 3, r.output
    assert time.monotonic() - started < 12.0
    assert not out.exists()
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: the 2 s time limit and 0.5 s of grace to finish a file ran out while writing ")


def test_the_hard_stop_leaves_a_callers_sooner_timer_alone_and_rearms_a_later_one():
    import signal

    from synth.cli._common import hard_stop

    class Outer(BaseException):
        pass

    def outer(signum, frame):
        raise Outer

    previous = signal.signal(signal.SIGALRM, outer)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)       # sooner than the hard stop: it still goes off
        with pytest.raises(Outer):
            with hard_stop(Deadline.after(30.0)):
                signal.pause()
        signal.setitimer(signal.ITIMER_REAL, 60.0)      # later: re-armed with its time left on leaving
        with hard_stop(Deadline.after(30.0)):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 50.0 < left <= 60.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
