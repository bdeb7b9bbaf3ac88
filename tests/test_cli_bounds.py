"""`synth bounds` and `synth baseline` through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synth.cli import main
from synth.schedule.replay import verify
from synth.schedule.ir import load_schedule
from synth.model.topology import load_topology


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_bounds_json():
    r = run("bounds", "allgather", "--topology", "ndv2-2node-tecc", "--size", "1000000000", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == {"collective", "topology", "size_bytes", "bandwidth_us", "latency_us", "limit_us",
                        "binding", "hops", "chunk_path_us", "method", "algbw_GBps", "direct_us",
                        "crossing_us", "drain_us"}
    assert out["bandwidth_us"] == pytest.approx(40e3)
    assert out["latency_us"] == pytest.approx(4.1)
    assert out["binding"] == "bandwidth" and out["size_bytes"] == 10**9


def test_bounds_summary_on_stderr_with_nodes():
    r = run("bounds", "alltoall", "-t", "ndv2", "--nodes", "2", "--size", "1GB")
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    assert "ndv2x2" in r.stderr and "concurrent-flow LP" in r.stderr and "bandwidth binds" in r.stderr


def test_baseline_json_and_schedule_out(tmp_path):
    out_file = tmp_path / "ring.json"
    r = run("baseline", "ring", "allgather", "-t", "ring-4", "--size", "1MB", "--chunks", "2", "--json",
            "--schedule-out", str(out_file))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) >= {"baseline", "collective", "topology", "size_bytes", "chunks_per_rank", "time_us",
                        "algbw_GBps", "busbw_GBps", "limit_us", "fraction_of_limit", "steps", "transfers"}
    assert out["baseline"] == "ring" and out["chunks_per_rank"] == 2
    assert 0 < out["fraction_of_limit"] <= 1
    topo = load_topology("ring-4")
    assert verify(load_schedule(out_file), topo, 1 << 20).time_us == pytest.approx(out["time_us"])


def test_baseline_best_summary():
    r = run("baseline", "best", "allreduce", "-t", "dgx-a100", "--size", "64MB")
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and "of the limit" in r.stderr


def test_baseline_xml_output(tmp_path):
    xml = tmp_path / "ag.xml"
    r = run("baseline", "ring", "allgather", "-t", "dgx1", "--size", "1MB", "-o", str(xml))
    assert r.exit_code == 0, r.output
    assert xml.read_text().startswith("<algo ")


def test_baseline_with_xml_reports_the_simulated_file(tmp_path):
    """With -o the figure is the written file as the runtime would run it; the replay stays as plan_time_us.
    dgx1's double binary tree replays at 38.19 us and its file simulates at 34.35 us."""
    from backends.msccl.parse import load_msccl_xml
    from backends.msccl.simulate import simulate_program
    xml = tmp_path / "ar.xml"
    r = run("baseline", "double-binary-tree", "allreduce", "-t", "dgx1", "--size", "1MB", "--json", "-o", str(xml))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    [program] = load_msccl_xml(xml)
    simulated = simulate_program(program, load_topology("dgx1"), 1 << 20).time_us
    assert out["timed_by"] == "simulated file" and out["time_us"] == pytest.approx(simulated)
    assert out["plan_time_us"] > out["time_us"] * 1.05     # the replay differs: the test tells the two apart
    assert out["fraction_of_limit"] == pytest.approx(out["limit_us"] / simulated)


@pytest.mark.parametrize("target", ["executor", "legacy"])
def test_baseline_xml_is_lowered_with_the_topology_and_passes_check(tmp_path, target):
    """The file is the verified writer's: switch-port order kept (lowered without the topology it simulated 1.85x
    slower than the replay), and `synth check` for the target accepts it."""
    from backends.msccl.parse import load_msccl_xml
    from backends.msccl.simulate import simulate_program
    xml, sched = tmp_path / "ag.xml", tmp_path / "ag.json"
    r = run("baseline", "all-pairs", "allgather", "-t", "dgx-a100", "--size", "16MB", "--target", target,
            "-o", str(xml), "--schedule-out", str(sched))
    assert r.exit_code == 0, r.output
    assert run("check", str(xml), "--target", target).exit_code == 0
    topo = load_topology("dgx-a100")
    replay = verify(load_schedule(sched), topo, 16 << 20).time_us
    [program] = load_msccl_xml(xml)
    assert abs(simulate_program(program, topo, 16 << 20).time_us - replay) <= 0.01 * replay


@pytest.mark.parametrize("args, message", [
    (("baseline", "spiral", "allgather", "-t", "ring-4", "--size", "1MB"), "unknown baseline 'spiral'"),
    (("baseline", "all-pairs", "allgather", "-t", "ring-4", "--size", "1MB"), "no direct link 0->2"),
    (("bounds", "allsum", "-t", "ring-4", "--size", "1MB"), "unknown collective"),
    (("bounds", "allgather", "-t", "ring-4", "--size", "lots"), "cannot read size"),
])
def test_errors_are_one_line_exit_1(args, message):
    r = run(*args)
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: ") and message in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("command", ["bounds", "baseline"])
def test_help(command):
    r = run(command, "--help")
    assert r.exit_code == 0 and "--topology" in r.stdout and "--size" in r.stdout


@pytest.mark.parametrize("target", ["executor", "legacy"])
def test_baseline_best_writes_only_what_the_runtime_runs(tmp_path, target):
    """dgx1 Alltoall: the fastest baseline has nchunksperloop 192 (never selected at power-of-two sizes);
    `best -o` writes the fastest one the runtime runs and holds, and `synth check` accepts it for the target."""
    from backends.msccl.parse import load_msccl_xml
    xml = tmp_path / "a2a.xml"
    r = run("baseline", "best", "alltoall", "-t", "dgx1", "--size", "1MB", "--target", target, "-o", str(xml),
            "--json")
    assert r.exit_code == 0, r.output
    assert run("check", str(xml), "--target", target).exit_code == 0
    [program] = load_msccl_xml(xml)
    assert program.nchunksperloop & (program.nchunksperloop - 1) == 0
    fastest = json.loads(run("baseline", "best", "alltoall", "-t", "dgx1", "--size", "1MB", "--json").stdout)
    assert fastest["chunks_per_rank"] * 8 == 192 and json.loads(r.stdout)["time_us"] >= fastest["time_us"]


def test_bounds_prints_the_drain_bound_where_it_gives_the_limit():
    # dgx-h100 Allgather 1 MB: 7/8 MB through a GPU's 450 GB/s port (2.039 us), and the last byte still travels
    # a 0.6 us alpha: 2.639 us, the time our plan takes
    r = run("bounds", "allgather", "-t", "dgx-h100", "--size", "1MB")
    assert r.exit_code == 0, r.output
    assert "drain bound               2.639 us" in r.stderr
    assert "limit                     2.639 us  (bandwidth binds, with the last byte's alpha" in r.stderr
