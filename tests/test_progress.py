"""Progress of long runs: the CLI's heartbeat, HiGHS' MIP lines from the solver boundary, stderr vs stdout."""

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
from click.testing import CliRunner

import synth.solver.highs as highs
from synth.cli import main
from synth.cli._progress import ProgressLog
from synth.solver.deadline import Deadline
from synth.solver.highs import Model, SolverOptions, Stall, _MipProgress, _StallStop, mip_progress_line, solve_model


class ManualClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_heartbeat_restates_the_phase_only_after_eight_silent_seconds():
    # eight, so that lines come at least every 10 s while a long C call holds the heartbeat thread a while
    clock, lines = ManualClock(), []
    log = ProgressLog(Deadline.after(60.0, clock), echo=lines.append)
    clock.now = 2.0
    log("  alpha-beta (auto)")
    clock.now = 9.9
    log.beat()
    assert lines == ["[   2.0s]   alpha-beta (auto)"]
    clock.now = 12.0
    log.beat()
    clock.now = 13.0
    log.beat()                              # the heartbeat itself counts as output
    assert lines[1:] == ["[  12.0s]   ... still in alpha-beta (auto), 48 s left"]
    clock.now = 61.0
    log.beat()
    assert lines[-1] == "[  61.0s]   ... still in alpha-beta (auto), past the time limit"


def test_solver_lines_do_not_replace_the_phase():
    clock, lines = ManualClock(), []
    log = ProgressLog(Deadline.after(float("inf"), clock), echo=lines.append)
    log("  tree packing")
    log("    MIP 5 s: incumbent 105, bound 100, gap 4.76%, 310 nodes")
    clock.now = 30.0
    log.beat()
    assert lines[-1] == "[  30.0s]   ... still in tree packing"


def test_heartbeat_thread_beats_while_the_work_is_silent_and_stops_after():
    lines = []
    with ProgressLog(interval_s=0.05, echo=lines.append):
        time.sleep(0.4)
    assert any("still in starting" in line for line in lines)
    count = len(lines)
    time.sleep(0.2)
    assert len(lines) == count
    assert not any(t.name == "synth-heartbeat" for t in threading.enumerate())


def _event(seconds, primal=105.0, dual=100.0, gap=0.0476, nodes=3):
    return SimpleNamespace(data_out=SimpleNamespace(running_time=seconds, mip_primal_bound=primal,
                                                    mip_dual_bound=dual, mip_gap=gap, mip_node_count=nodes))


def test_mip_progress_is_throttled_to_one_line_per_interval():
    lines = []
    callback = _MipProgress(lines.append, interval_s=5.0)
    for t in (0.1, 1.0, 4.9, 5.0, 6.0, 9.9, 10.0, 10.1):
        callback(_event(t))
    assert lines == [mip_progress_line(5.0, 105.0, 100.0, 0.0476, 3), mip_progress_line(10.0, 105.0, 100.0,
                                                                                          0.0476, 3)]
    assert lines[0] == "    MIP 5 s: incumbent 105, bound 100, gap 4.76%, 3 nodes"


def test_a_settled_mip_is_interrupted_only_within_the_gap_after_the_quiet_time():
    """:class:`synth.solver.highs.Stall`: ndv2 x4 Allreduce 1 KB held an incumbent 0.0001% from its bound for 105 s."""
    stall = _StallStop(Stall(gap=1e-4, seconds=10.0))
    stopped = []

    def feed(seconds, primal, gap):
        event = _event(seconds, primal=primal, gap=gap)
        event.interrupt = lambda: stopped.append(seconds)
        stall(event)

    feed(1.0, 9.0, 0.1)             # an incumbent, far from its bound
    feed(12.0, 9.0, 0.1)            # quiet for 11 s, but the gap is wide
    feed(13.0, 8.16793, 1.2e-6)     # improved: the quiet time starts again
    feed(22.0, 8.16793, 1.2e-6)     # 9 s quiet
    assert stopped == []
    feed(23.0, 8.16793, 1.2e-6)     # 10 s quiet and within the gap
    assert stopped == [23.0]


def test_solve_model_reports_mip_progress_through_the_options(monkeypatch):
    """HiGHS' MIP callback reaches ``options.progress`` (interval 0: every callback); LPs say nothing."""
    monkeypatch.setattr(highs, "MIP_PROGRESS_INTERVAL_S", 0.0)
    rng = np.random.default_rng(0)
    n, m = 40, 8
    a = rng.integers(1, 100, (m, n)).astype(float)
    rows, cols = np.nonzero(a)
    model = Model(cost=-rng.integers(1, 100, n).astype(float), col_lower=np.zeros(n), col_upper=np.ones(n),
                  integer=np.ones(n, dtype=bool), rows=rows, cols=cols, vals=a[rows, cols],
                  row_lower=np.full(m, -np.inf), row_upper=a.sum(axis=1) / 2)
    lines = []
    solve_model(model, SolverOptions(progress=lines.append))
    assert lines and all(line.startswith("    MIP ") and " bound " in line for line in lines)
    relaxed = Model(**{**model.__dict__, "integer": np.zeros(n, dtype=bool)})
    lines.clear()
    solve_model(relaxed, SolverOptions(progress=lines.append))
    assert lines == []


def test_solve_progress_goes_to_stderr_and_stdout_keeps_the_json():
    r = CliRunner().invoke(main, ["solve", "allgather", "--topology", "ring-4", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["status"] in ("optimal", "feasible", "baseline") and report["time_limited"] is False
    progress = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert progress and all(line[1:8].strip().endswith("s") for line in progress)
    assert any("alpha-beta" in line for line in progress)
