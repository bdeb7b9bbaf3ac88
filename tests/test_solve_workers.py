"""``synth solve --workers/--scheduler``: candidates written ahead on workers give the sequential run's file.

The choice itself is checked on :func:`synth.synthesis.solve.solve` with made-up candidates whose writes finish in
a shuffled order (threads), against the same candidates written one by one; the CLI tests check the files and
reports byte for byte on a real pool and on Dask.
"""

import concurrent.futures as cf
import json
import random
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from synth.cli import main
from synth.errors import BackendError
from synth.model.topology import load_topology
from synth.solver.deadline import Deadline
from synth.solver.highs import Status
from synth.synthesis import parallel, solve as solve_module
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import Candidate

# --------------------------------------------------------------------------------- the choice, with made-up writes


@dataclass(frozen=True)
class FakeXml:
    """What the loop reads of a written file: its simulated time (us), and whether the deadline cut its variants."""

    simulated_us: float
    variants_cut: bool = False


@dataclass(frozen=True)
class FakeSchedule:
    """What a fake write needs: the simulated time it reports (None: refused), how long it takes, and a size."""

    simulated_us: float | None
    seconds: float
    transfers: tuple = ()
    release: threading.Event | None = None
    gathered: bool = False


def fake_emit(schedule, topology, target, size_bytes, **options):
    if schedule.release is not None:
        schedule.release.wait(10)
    time.sleep(schedule.seconds)
    if schedule.simulated_us is None:
        raise BackendError(f"refusing {schedule.simulated_us}")
    return FakeXml(schedule.simulated_us)


def candidate(label, replay_us, simulated_us, seconds=0.0, baseline=False, release=None):
    status = Status.BASELINE if baseline else Status.FEASIBLE
    schedule = FakeSchedule(simulated_us, seconds, (0,) * len(label), release)
    return Candidate(label, SimpleNamespace(status=status, schedule=schedule), SimpleNamespace(time_us=replay_us))


@pytest.fixture(scope="module")
def ring4_request():
    return SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20, include_baselines=False)


def run_solve(monkeypatch, request, found, baselines, executor=None, slots=0):
    """solve() on these candidates; returns the solution and the lines that record each write, in order."""
    monkeypatch.setattr(solve_module, "verified_candidates", lambda request, progress, **_: list(found))
    monkeypatch.setattr(solve_module, "_runnable_baselines", lambda request: list(baselines))
    monkeypatch.setattr(solve_module, "schedule_floor_us", lambda schedule, topology, size: 0.0)  # all may win
    monkeypatch.setattr(solve_module, "chain_floor_us", lambda schedule, topology, size: 0.0)
    monkeypatch.setattr(solve_module, "emit_verified_xml", fake_emit)
    lines = []
    solution = solve_module.solve(request, progress=lines.append, executor=executor, slots=slots)
    return solution, [line for line in lines if "simulated" in line or "cannot be written" in line]


def random_case(rng: random.Random):
    """Candidates with tied replays, writes that are slower or (rarely) faster than the replay, refusals."""
    found, baselines = [], []
    for k in range(rng.randint(2, 7)):
        replay = rng.choice([10.0, 11.0, 12.0, 14.0])
        simulated = None if rng.random() < 0.15 else replay * rng.choice([0.95, 1.0, 1.0, 1.1, 1.3])
        is_base = rng.random() < 0.3
        (baselines if is_base else found).append(candidate(f"{'b' if is_base else 'c'}{k}", replay, simulated,
                                                           rng.random() * 0.004, is_base))
    return found, baselines


@pytest.mark.parametrize("seed", range(12))
def test_written_ahead_in_any_order_the_choice_is_the_sequential_one(monkeypatch, ring4_request, seed):
    found, baselines = random_case(random.Random(seed))
    for request in (ring4_request, SynthesisRequest(ring4_request.topology, "allgather", 1 << 20, steps=2,
                                                    rounds=3, chunks=2, include_baselines=False)):
        outcomes = []
        for slots in (0, 2, 3):
            with cf.ThreadPoolExecutor(slots or 1) as executor:
                try:
                    solution, lines = run_solve(monkeypatch, request, found, baselines,
                                                executor if slots else None, slots)
                except BackendError as exc:
                    outcomes.append(str(exc))
                    continue
            outcomes.append((solution.chosen.candidate.label, solution.chosen.simulated_us,
                             solution.baseline and solution.baseline.candidate.label, solution.refusals, lines))
        assert outcomes[1] == outcomes[0] and outcomes[2] == outcomes[0]


def test_a_replay_slower_than_a_written_file_is_not_taken_even_when_written_ahead(monkeypatch, ring4_request):
    found = [candidate("fast", 10.0, 10.5), candidate("slow", 11.0, 10.1), candidate("slower", 12.0, 9.0)]
    with cf.ThreadPoolExecutor(3) as executor:
        solution, lines = run_solve(monkeypatch, ring4_request, found, [], executor, 3)
    assert solution.chosen.candidate.label == "fast"   # "slow" and "slower" may have been written; not taken
    assert [line.split(":")[0].strip() for line in lines] == ["fast"]


def test_at_the_deadline_pending_writes_are_dropped_and_the_best_written_file_wins(monkeypatch):
    release = threading.Event()
    found = [candidate("stuck", 10.0, 10.0, release=release), candidate("quick", 11.0, 20.0)]
    baselines = [candidate("base", 12.0, 30.0, baseline=True)]
    request = SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20, include_baselines=False,
                               deadline=Deadline.after(0.6))
    executor = cf.ThreadPoolExecutor(3)
    try:
        started = time.monotonic()
        solution, lines = run_solve(monkeypatch, request, found, baselines, executor, 3)
        assert time.monotonic() - started < 5
    finally:
        release.set()
        executor.shutdown(wait=True)
    assert solution.time_limited and solution.chosen.candidate.label == "quick"
    assert solution.baseline.candidate.label == "base"
    assert not any(line.strip().startswith("stuck") for line in lines)


# ----------------------------------------------------------------------------------------------------- the CLI

def run(args):
    return CliRunner().invoke(main, args)


# (S, R, C) fixed on DGX-1: one synthesized candidate and the three fastest baselines, all written
FIXED = ["solve", "allgather", "--topology", "dgx1", "--steps", "2", "--rounds", "3", "--chunks", "2", "--json"]
TIMINGS = ("solve_seconds", "output")


def solve_files(tmp_path, label, extra):
    out = tmp_path / f"{label}.xml"
    result = run([*FIXED, "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    report = {k: v for k, v in json.loads(result.stdout).items() if k not in TIMINGS}
    return out.read_bytes(), report


def test_workers_write_the_same_file_and_report(tmp_path):
    serial = solve_files(tmp_path, "serial", ["--workers", "1"])
    assert solve_files(tmp_path, "pool", ["--workers", "2"]) == serial


def test_help_lists_workers_and_scheduler():
    result = run(["solve", "--help"])
    assert result.exit_code == 0
    assert "--workers INTEGER RANGE" in result.output and "--scheduler ADDRESS" in result.output


@pytest.mark.parametrize("args,code,message", [
    (["--scheduler", "tcp://:x"], 1, "Error: --scheduler: cannot read address 'tcp://:x'; write e.g. tcp://host:8786"),
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], 2, "Error: give --workers or --scheduler, not both"),
    (["--workers", "0"], 2, "Error: Invalid value for '--workers': 0 is not in the range 1<=x<=256."),
])
def test_bad_workers_options_are_refused_before_any_work(args, code, message):
    result = run(["solve", "allgather", "--topology", "dgx1", *args])
    assert result.exit_code == code
    assert result.output.strip().splitlines()[-1] == message
    assert "synth: allgather" not in result.output


def test_an_unreachable_scheduler_is_one_line_before_the_search(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(parallel, "CONNECT_TIMEOUT_S", 0.5)
    result = run(["solve", "allgather", "--topology", "dgx1", "--scheduler", "tcp://127.0.0.1:1"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: --scheduler: cannot reach the Dask scheduler at 'tcp://127.0.0.1:1' (")
    assert last.endswith("); start one with `dask scheduler` and `dask worker ADDRESS`, or drop --scheduler")
    assert "trying steps" not in result.output and "writing" not in result.output


def test_dask_writes_the_same_file_and_report(tmp_path):
    distributed = pytest.importorskip("distributed")
    serial = solve_files(tmp_path, "serial", [])
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                                  dashboard_address=None) as cluster:
        assert solve_files(tmp_path, "dask", ["--scheduler", cluster.scheduler_address]) == serial


def test_ctrl_c_stops_the_workers_and_writes_nothing(tmp_path, monkeypatch):
    seen = []

    def interrupted(self, candidate, deadline=None):
        seen.extend(self.executor._processes.values())     # the pool's processes, started by the writes ahead
        raise KeyboardInterrupt

    monkeypatch.setattr(solve_module._Writer, "wait", interrupted)
    out = tmp_path / "ag.xml"
    result = run([*FIXED, "--workers", "2", "-o", str(out)])
    assert result.exit_code == 130
    assert result.output.strip().splitlines()[-1] == "Error: interrupted (Ctrl-C); no output was written"
    assert seen and not any(p.is_alive() for p in seen)
    assert list(tmp_path.iterdir()) == []
