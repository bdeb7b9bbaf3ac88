"""``synth pareto``: tables, frontier.json, the MSCCL bundle, workers, Dask, interruption (CliRunner)."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth.cli import main

REPO = Path(__file__).resolve().parents[1]


def run(args, **kwargs):
    return CliRunner().invoke(main, args, catch_exceptions=False, **kwargs)


def strip_timings(value):
    """frontier.json without anything that measures time (keys ending in _seconds)."""
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items() if not k.endswith("_seconds")}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def check_bundle(out: Path, low: int, high: int) -> dict:
    """Every XML passes `synth check`; ranges tile low..high; the choice is never slower than a baseline
    MSCCL can run at that size. Returns frontier.json."""
    doc = json.loads((out / "frontier.json").read_text())
    assert doc["stage"] == "done"
    files = doc["bundle"]
    assert files and sorted(p.name for p in (out / "msccl").iterdir()) == sorted(Path(f["file"]).name for f in files)
    for f in files:
        result = run(["check", str(out / f["file"])])
        assert result.exit_code == 0, result.output
    assert files[0]["min_bytes"] == low and files[-1]["max_bytes"] == high
    for a, b in zip(files, files[1:]):
        assert b["min_bytes"] == a["max_bytes"] + 1
    for size in doc["sizes"]:
        times = {t["key"]: t for t in size["timings"]}
        chosen = times[size["chosen"]]
        baselines = [t for k, t in times.items() if k.startswith("baseline-") and t["runnable"]]
        assert all(chosen["time_us"] <= t["time_us"] * (1 + 1e-9) for t in baselines), size["size_bytes"]
    readme = (out / "README.txt").read_text()
    assert "MSCCL_ALGO_DIR" in readme and "_perf -b" in readme
    return doc


def test_help():
    result = run(["pareto", "--help"])
    assert result.exit_code == 0 and "frontier" in result.output and "--scheduler" in result.output


def test_frontier_table_on_stdout():
    result = run(["pareto", "allgather", "--topology", "dgx1", "--sizes", "none", "--workers", "1", "-q"])
    assert result.exit_code == 0
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["2", "3", "2", "3/2", "optimal"] in lines and ["3", "7", "6", "7/6", "optimal"] in lines
    assert "complete" in result.stdout


def test_json_output():
    result = run(["pareto", "reducescatter", "--topology", "dgx1", "--sizes", "none", "--workers", "1", "-q",
                  "--json"])
    doc = json.loads(result.stdout)
    assert doc["frontier"] == [[2, 3, 2], [3, 7, 6]] and doc["complete"] and doc["stop_reason"] == "lower-bound"
    assert doc["versions"]["highspy"] and doc["options"]["solver"]["time_limit_s"] == 10.0
    assert all(p["status"] in ("feasible", "infeasible") for p in doc["points"])


@pytest.mark.parametrize("args, code, message", [
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], 2, "not both"),
    (["--sizes", "1GB:1KB"], 1, "Error: --sizes"),
    (["--max-steps", "1"], 1, "Error: --max-steps"),
])
def test_bad_options(args, code, message):
    result = CliRunner().invoke(main, ["pareto", "allgather", "--topology", "dgx1", "-q", *args])
    assert result.exit_code == code and message in result.output
    assert "Traceback" not in result.output


def test_dgx1_bundle(tmp_path):
    out = tmp_path / "out"
    result = run(["pareto", "allgather", "--topology", "dgx1", "--workers", "1", "--sizes", "1KB:1GB",
                  "--no-alpha-beta", "--no-solve", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    doc = check_bundle(out, 1 << 10, 1 << 30)
    assert [s["size_bytes"] for s in doc["sizes"]] == [1 << (10 + 2 * k) for k in range(11)]
    assert "Best algorithm per size" in result.stdout
    assert (out / "frontier.png").stat().st_size > 0 and (out / "frontier.svg").stat().st_size > 0


def test_every_candidate_source_on_a_ring(tmp_path):
    """Frontier points, baselines, alpha-beta schedules and `synth solve`'s plans all compete (each source
    present in the repo); the alpha-beta schedules come from the solves, once per size."""
    out = tmp_path / "out"
    result = run(["pareto", "allgather", "--topology", "ring-4", "--workers", "1", "--sizes", "1KB:16MB",
                  "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    doc = check_bundle(out, 1 << 10, 1 << 24)
    kinds = [a["kind"] for a in doc["algorithms"]]
    assert set(kinds) == {"steps", "baseline", "alphabeta", "solved"}
    assert kinds.count("alphabeta") <= len(doc["sizes"])
    assert len({a["key"] for a in doc["algorithms"]}) == len(kinds)
    assert all(s["limit_us"] and s["limit_us"] <= min(t["time_us"] for t in s["timings"]) * (1 + 1e-9)
               for s in doc["sizes"])


def test_the_bundle_is_as_fast_as_synth_solve_at_its_sizes(tmp_path):
    """dgx1 Scatter 64 MB: the step frontier and a size's alpha-beta schedule reach 93.2% of the limit, the tree
    packing `synth solve` writes 99.9%; the bundle holds that file, at the time `synth solve` reports."""
    out = tmp_path / "out"
    result = run(["pareto", "scatter", "--topology", "dgx1", "--workers", "1", "--sizes", "64MB:64MB",
                  "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    doc = check_bundle(out, 64 << 20, 64 << 20)
    solved = run(["solve", "scatter", "--topology", "dgx1", "--size", "64MB", "--json"])
    report = json.loads(solved.stdout)
    (size,) = doc["sizes"]
    chosen = next(t for t in size["timings"] if t["key"] == size["chosen"])
    assert size["chosen"].startswith("solved-trees")
    assert chosen["time_us"] == pytest.approx(report["predicted_time_us"], rel=1e-9)
    assert size["limit_us"] / chosen["time_us"] >= 0.99
    assert "trees/c" in result.stdout and "@64MB" in result.stdout


def test_ndv2_two_nodes_bundle_quick(tmp_path):
    """The acceptance command, cut short (steps 2 only, C = 1, no alpha-beta) to stay fast."""
    out = tmp_path / "out"
    result = run(["pareto", "allgather", "--topology", "ndv2", "--nodes", "2", "--sizes", "1KB:1GB",
                  "--max-steps", "3", "--max-chunks", "1", "--time-limit", "2", "--no-alpha-beta", "--no-solve",
                  "--workers", "1", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    check_bundle(out, 1 << 10, 1 << 30)


@pytest.mark.slow
def test_ndv2_two_nodes_bundle_acceptance(tmp_path):
    """`synth pareto allgather --topology ndv2 --nodes 2 --sizes 1KB:1GB -o DIR` (minutes)."""
    out = tmp_path / "out"
    result = run(["pareto", "allgather", "--topology", "ndv2", "--nodes", "2", "--sizes", "1KB:1GB",
                  "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    check_bundle(out, 1 << 10, 1 << 30)


def test_interrupt_keeps_the_points_found(tmp_path, monkeypatch):
    from synth.sweep import frontier as pareto

    real = pareto.solve_instance
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pareto, "solve_instance", interrupted)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["pareto", "allgather", "--topology", "dgx1", "--workers", "1",
                                       "-o", str(out), "-q"])
    assert result.exit_code == 130 and "interrupted" in result.output
    doc = json.loads((out / "frontier.json").read_text())
    assert doc["stage"] == "sweeping" and len(doc["points"]) == 3 and not doc["complete"]
    assert not list(out.glob(".*tmp"))


def test_workers_and_dask_give_identical_frontier_json(tmp_path, monkeypatch):
    import distributed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    docs = {}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        for label, extra in (("serial", ["--workers", "1"]), ("pool", ["--workers", "2"]),
                             ("dask", ["--scheduler", cluster.scheduler_address])):
            out = tmp_path / label
            result = run(["pareto", "allgather", "--topology", "dgx1", "--sizes", "none", "-o", str(out), "-q",
                          *extra])
            assert result.exit_code == 0, result.output
            docs[label] = strip_timings(json.loads((out / "frontier.json").read_text()))
    assert docs["dask"] == docs["serial"] == docs["pool"]
    assert docs["dask"]["frontier"] == [[2, 3, 2], [3, 7, 6]]
