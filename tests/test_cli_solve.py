"""`synth solve` and `synth topo` through click's CliRunner: outputs, reports, errors and exit codes."""

import json

import pytest
from click.testing import CliRunner

from synth.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_solve_writes_xml_and_json_report(tmp_path):
    out = tmp_path / "ag.xml"
    sched = tmp_path / "ag.json"
    r = run("solve", "allgather", "--topology", "dgx1", "--steps", "2", "--rounds", "3", "--chunks", "2",
            "-o", str(out), "--schedule-out", str(sched), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    for key in ("status", "solve_seconds", "predicted_time_us", "algbw_GBps", "steps", "rounds", "chunks", "output"):
        assert key in report
    assert report["status"] == "optimal" and (report["steps"], report["chunks"]) == (2, 2)
    assert out.read_text().startswith("<algo ")
    assert json.loads(sched.read_text())["format"] == "synth-schedule/1"


@pytest.mark.parametrize("coll", ["allgather", "reducescatter"])
def test_infeasible_request_exits_3_and_writes_nothing(tmp_path, coll):
    out = tmp_path / "x.xml"
    r = run("solve", coll, "--topology", "dgx1", "--steps", "3", "--rounds", "6", "--chunks", "6", "-o", str(out))
    assert r.exit_code == 3
    assert r.stderr.strip().splitlines()[-1].startswith("Error: no ")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("topology", ["ring-4", "dgx1"])
def test_default_search_is_never_slower_than_a_runnable_baseline(topology, tmp_path):
    """The figure reported is the written file's simulated time, never above the runtime's own choice's."""
    out = tmp_path / "ag.xml"
    r = run("solve", "allgather", "--topology", topology, "--json", "-o", str(out))
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["status"] in ("optimal", "feasible", "baseline")
    assert report["predicted_time_us"] <= report["baseline_us"] * (1 + 1e-9)
    assert report["limit_us"] <= report["predicted_time_us"] and 0 < report["percent_of_limit"] <= 100
    simulated = run("simulate", str(out), "--topology", topology, "--size", "1MB")
    assert f"{report['predicted_time_us']:.3f} us" in simulated.output


def test_without_baselines_the_search_returns_a_solver_schedule():
    r = run("solve", "allgather", "--topology", "ring-4", "--json", "--no-baseline")
    report = json.loads(r.stdout)
    assert report["status"] == "optimal" and report["steps"] == 2 and report["baseline"] is None


@pytest.mark.parametrize("args,code,message", [
    (["solve", "allgather", "--topology", "nope"], 1, "Error: --topology: unknown topology 'nope'"),
    (["solve", "allgather", "--topology", "dgx1", "--size", "lots"], 1, "Error: --size: cannot read size 'lots'"),
    (["solve", "allgatherx", "--topology", "dgx1"], 2, "Invalid value for 'COLLECTIVE'"),
    (["solve", "allreduce", "--topology", "dgx1", "--steps", "3", "--rounds", "6"], 1, "even number of steps"),
])
def test_bad_input_gives_one_error_line(args, code, message):
    r = run(*args)
    assert r.exit_code == code
    assert message in r.output
    assert "Traceback" not in r.output


def test_bad_topology_file_names_file_and_field(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"ranks": 2, "links": [{"src": 0, "dst": 1, "bw_GBps": 10}]}')
    r = run("solve", "allgather", "--topology", str(f))
    assert r.exit_code == 1
    assert f"Error: {f}: links[0].alpha_us: missing" in r.output


def test_malformed_json_topology(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"ranks": 2, ')
    r = run("topo", "show", str(f))
    assert r.exit_code == 1 and f"Error: {f}: line 1: invalid JSON" in r.output


def test_disconnected_topology_is_rejected(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"ranks": 3, "defaults": {"alpha_us": 1, "bw_GBps": 1},'
                 ' "links": [{"src": 0, "dst": 1, "bidirectional": true}]}')
    r = run("solve", "allgather", "--topology", str(f))
    assert r.exit_code == 1 and "disconnected" in r.output


def test_every_command_has_help():
    r = run("--help")
    assert r.exit_code == 0
    for name in main.list_commands(None):
        sub = run(name, "--help")
        assert sub.exit_code == 0 and len(sub.output) > 80, name


def test_sketch_guided_routed_solve_on_two_nodes(tmp_path):
    out = tmp_path / "ag.xml"
    r = run("solve", "allgather", "--topology", "ndv2-2node-tecc", "--size", "64MB", "--method", "routed",
            "--sketch", "ndv2-tecc-relay", "-o", str(out), "--json", "--time-limit", "20")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["method"].startswith("alpha-beta") and report["percent_of_limit"] > 90
    assert out.read_text().startswith("<algo ")


def test_a_sketch_admits_every_source_whose_plan_keeps_to_it(tmp_path):
    # a rail sketch (GPU i talks to GPU i of the other node) admits the rooted composition over the rails: at
    # 1 GB it is at the limit, where the sketch-guided search alone reached 24% of it
    out = tmp_path / "bc.xml"
    r = run("solve", "broadcast", "--topology", "dgx-a100", "--nodes", "2", "--size", "1GB",
            "--sketch", "dgx-a100-rail", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["method"].startswith("rooted/") and report["keeps_to_sketch"] is True
    assert report["percent_of_limit"] > 98 and report["speedup_vs_baseline"] > 1
    assert "the sketch-guided search skipped" in r.stderr


def test_plans_that_break_the_sketch_are_left_out(tmp_path):
    # ndv2-nic-relay: only GPU 1 of a node sends to another node (to its GPU 0); the rooted composition sends
    # from the root's GPU 0 and must not compete
    from synth.model.topology import load_topology
    from synth.schedule.ir import load_schedule

    out, sched = tmp_path / "bc.xml", tmp_path / "bc.json"
    r = run("solve", "broadcast", "--topology", "ndv2", "--nodes", "2", "--size", "64MB", "--sketch",
            "ndv2-nic-relay", "-o", str(out), "--schedule-out", str(sched), "--json")
    assert r.exit_code == 0, r.output
    assert ("rooted/c256 does not keep to the sketch (it sends 0 -> 8, a link the sketch ndv2-nic-relay does "
            "not allow): left out") in r.stderr
    report = json.loads(r.stdout)
    assert report["keeps_to_sketch"] is True and not report["method"].startswith("rooted/")
    topo = load_topology("ndv2", 2)
    crossings = {(t.src % 8, t.dst % 8) for t in load_schedule(sched).transfers
                 if topo.node_of(t.src) != topo.node_of(t.dst)}
    assert crossings == {(1, 0)}


def test_a_baseline_that_breaks_the_sketch_is_written_only_as_the_fallback_and_said_so(tmp_path):
    # ndv2 x2 Broadcast 1 KB: the runtime's shortest paths (0 -> 8 through the NIC) beat every plan that keeps
    # to ndv2-nic-relay (only GPU 1 sends across)
    r = run("solve", "broadcast", "--topology", "ndv2", "--nodes", "2", "--size", "1KB", "--sketch",
            "ndv2-nic-relay", "-o", str(tmp_path / "bc.xml"), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["fell_back_to_baseline"] and report["keeps_to_sketch"] is False
    assert ("note: the baseline written does not keep to the sketch (it sends 0 -> 8, a link the sketch "
            "ndv2-nic-relay does not allow)") in r.stderr


def test_a_bad_sketch_is_refused_before_any_search(tmp_path):
    sketch = tmp_path / "bad.json"
    sketch.write_text('{"format": "synth-sketch/1", "name": "x", "internode": {"connections": {"1": [99]}}}')
    r = run("solve", "allgather", "--topology", "ndv2", "--nodes", "2", "--size", "1MB", "--sketch", str(sketch),
            "-o", str(tmp_path / "ag.xml"))
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines()[-1] == (f"Error: {sketch}: internode.connections.1: unknown GPU 99; local "
                                                 "GPUs are 0..7")
    assert "hierarchy" not in r.stderr and not (tmp_path / "ag.xml").exists()


def test_an_explicit_method_under_a_sketch_runs_alone_and_keeps_to_it(tmp_path):
    # the hierarchy's cross-rail variant (x3: GPU i to GPU i+2 of the other node) breaks the rail sketch
    r = run("solve", "allgather", "--topology", "dgx-h100", "--nodes", "2", "--size", "64MB", "--method",
            "hierarchy", "--sketch", "dgx-h100-rail", "-o", str(tmp_path / "ag.xml"), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["method"].startswith("hierarchy/") and report["keeps_to_sketch"] is True
    assert "/x3 does not keep to the sketch (it sends 0 -> 10, a link the sketch dgx-h100-rail" in r.stderr
    assert "alpha-beta" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--method", "routed", "--steps", "2", "--rounds", "3"], "--steps: --steps/--rounds belong to the step"),
    (["--method", "steps", "--sketch", "ndv2-tecc-relay"], "--sketch: sketches guide the alpha-beta"),
])
def test_contradictory_method_options_are_rejected(args, message):
    r = run("solve", "allgather", "--topology", "dgx1", *args)
    assert r.exit_code == 1 and f"Error: {message}" in r.output


def test_an_explicit_method_slower_than_the_runtime_says_so():
    # ring-4 Allgather 1 KB: the trees' file simulates at 2.105 us, the runtime's shortest-path baseline at 1.413 us
    r = run("solve", "allgather", "--topology", "ring-4", "--size", "1KB", "--method", "trees", "--json")
    report = json.loads(r.stdout)
    assert r.exit_code == 0 and report["method"].startswith("trees/")
    assert report["baseline_us"] < report["predicted_time_us"] and report["speedup_vs_baseline"] < 1
    assert "verified candidate(s) that --method trees allows)" in r.stderr
    assert (f"note: --method trees is honoured, but the runtime's own baseline/{report['baseline']} simulates faster "
            f"({report['baseline_us']:.3f} us against {report['predicted_time_us']:.3f} us); leave --method trees "
            "out to let it compete") in r.stderr


def test_auto_picks_the_fastest_verified_candidate():
    r = run("solve", "allgather", "--topology", "dgx1", "--json")
    report = json.loads(r.stdout)
    assert r.exit_code == 0
    assert "fastest simulated of" in r.stderr
    simulated = [float(line.rsplit("simulated ", 1)[1].split()[0]) for line in r.stderr.splitlines()
                 if ": plan " in line and "simulated" in line]
    assert report["predicted_time_us"] == pytest.approx(min(simulated), abs=0.01)
    assert report["plan_time_us"] <= report["predicted_time_us"] * 1.001


def test_outputs_are_checked_before_any_work_and_a_failed_run_leaves_none(tmp_path):
    """A bad second output path is refused at once (no solve), and the first output is never written."""
    out = tmp_path / "ag.xml"
    r = CliRunner().invoke(main, ["solve", "allgather", "--topology", "dgx1", "-o", str(out),
                                  "--schedule-out", str(tmp_path / "nodir" / "s.json")])
    assert r.exit_code == 1 and "does not exist" in r.output and "trying steps" not in r.output
    assert list(tmp_path.iterdir()) == []
    same = CliRunner().invoke(main, ["solve", "allgather", "--topology", "dgx1", "-o", str(out),
                                     "--schedule-out", str(out)])
    assert same.exit_code == 1 and "is also given to -o" in same.output
    empty = CliRunner().invoke(main, ["solve", "allgather", "--topology", "dgx1", "-o", ""])
    assert empty.exit_code == 1 and "the output path is empty" in empty.output


def test_xml_schedule_and_model_are_written_together(tmp_path):
    r = CliRunner().invoke(main, ["solve", "allgather", "--topology", "dgx1", "--steps", "2", "--rounds", "3",
                                  "--chunks", "2", "--method", "steps", "-o", str(tmp_path / "a.xml"),
                                  "--schedule-out", str(tmp_path / "a.json"), "--write-model",
                                  str(tmp_path / "a.lp")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.lp", "a.xml"]
    assert (tmp_path / "a.lp").read_text().startswith("\\*") and "<algo" in (tmp_path / "a.xml").read_text()


def test_a_step_search_that_runs_out_of_time_does_not_stop_auto(monkeypatch):
    """auto keeps the other sources when the step search finds nothing in time (it used to exit 3)."""
    from synth.errors import NoSolutionError
    from synth.model.topology import load_topology
    from synth.synthesis import select
    from synth.synthesis.request import SynthesisRequest

    def no_time(*args, **kwargs):
        raise NoSolutionError("the solver found no schedule within 60 s")

    monkeypatch.setattr(select, "synthesize_steps", no_time)
    found = select.verified_candidates(SynthesisRequest(load_topology("dgx1"), "allgather", 1 << 20))
    assert found and all(c.label != "steps" for c in found)


def test_multinode_auto_skips_the_step_search():
    from synth.model.topology import load_topology
    from synth.synthesis import select
    from synth.synthesis.request import SynthesisRequest

    messages = []
    select.verified_candidates(SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20), messages.append)
    assert any("trying steps" in m for m in messages)
    messages.clear()
    select.verified_candidates(SynthesisRequest(load_topology("ndv2-2node-tecc"), "allgather", 1 << 20,
                                                method="auto"), messages.append)
    assert not any("trying steps" in m for m in messages)


def test_root_for_a_collective_without_one_is_refused():
    r = CliRunner().invoke(main, ["solve", "allgather", "--topology", "dgx1", "--root", "3"])
    assert r.exit_code == 1
    assert "Error: --root: allgather has no root; drop --root (only broadcast, reduce, gather, scatter take one)" \
        in r.output


def test_legacy_gather_is_refused_before_any_search():
    r = CliRunner().invoke(main, ["solve", "gather", "--topology", "ring-8", "--target", "legacy"])
    assert r.exit_code == 1 and "trying steps" not in r.output
    assert r.output.strip().splitlines()[-1] == ("Error: the legacy runtime knows no gather (its loader refuses the "
                                                 "file); write it for the executor (--target executor)")


def test_an_explicit_step_request_is_written_even_when_a_baseline_simulates_faster(tmp_path):
    """(S, R, C) given: that schedule is written; the baselines are only the comparison."""
    r = run("solve", "allgather", "--topology", "dgx1", "--steps", "3", "--rounds", "7", "--chunks", "6", "--json",
            "-o", str(tmp_path / "a.xml"))
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["method"] == "steps" and report["steps"] == 3 and not report["fell_back_to_baseline"]
