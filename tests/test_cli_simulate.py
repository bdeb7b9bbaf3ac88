"""`synth simulate` through click's CliRunner: summaries, --json, --trace, schedules and errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synth.cli import main
from synth.model.collectives import make_collective
from synth.schedule.ir import Schedule, Transfer
from support import programs
from support.shared import INVALID_FILE as SHARED_INVALID_FILE, shared_msccl_xml


@pytest.fixture
def ring_xml(msccl_files):
    """The hand-built in-place LL128 ring Allgather on 8 ranks, written by support.programs."""
    return str(msccl_files["ring_allgather_8_ll128.xml"])


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_json_report_has_the_figures(ring_xml):
    r = run("simulate", ring_xml, "--topology", "ring-8", "--size", "1MB", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    hop_us = 0.7 + (1 << 17) / 25e3
    assert report["time_us"] == pytest.approx(7 * hop_us)
    assert report["size_bytes"] == 1 << 20
    assert report["algbw_GBps"] == pytest.approx((1 << 20) / report["time_us"] / 1e3)
    assert report["busbw_GBps"] == pytest.approx(report["algbw_GBps"] * 7 / 8)
    assert report["valid"] and len(report["programs"]) == 1
    assert "check: valid" in r.stderr and "GB/s" in r.stderr


def test_human_summary_goes_to_stderr_only(ring_xml):
    r = run("simulate", ring_xml, "--topology", "ring-8", "--size", "64KB", "--alpha-occupies")
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    assert "64KB" in r.stderr and "alpha occupies links" in r.stderr


def test_trace_file_is_written(ring_xml, tmp_path):
    out = tmp_path / "trace.json"
    r = run("simulate", ring_xml, "--topology", "ring-8", "--trace", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert any(e["ph"] == "X" and e["cat"] == "link" for e in doc["traceEvents"])
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


@pytest.mark.parametrize("source,topology", [("project", "ring-4"), ("shared", "fully-connected-8")])
def test_invalid_program_is_timed_with_a_warning(msccl_files, source, topology):
    path = msccl_files[programs.INVALID_FILE] if source == "project" else shared_msccl_xml(SHARED_INVALID_FILE)
    r = run("simulate", str(path), "--topology", topology, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["valid"] is False
    assert "warning: the program fails its check" in r.stderr


def test_schedule_json_is_lowered_and_timed(tmp_path):
    n = 4
    coll = make_collective("allgather", n)
    transfers = tuple(Transfer(c, (c + k) % n, (c + k + 1) % n, k) for c in range(n) for k in range(n - 1))
    schedule = Schedule(coll, "ring-4", transfers, steps=n - 1)
    path = tmp_path / "ring.json"
    path.write_text(schedule.to_json())
    r = run("simulate", str(path), "--topology", "ring-4", "--size", "1MB", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["valid"]
    assert report["time_us"] == pytest.approx(3 * (0.7 + (1 << 18) / 25e3))


@pytest.mark.parametrize("args,message", [
    (["--topology", "ring-4"], "has 8 GPUs but topology ring-4 has 4 ranks"),
    (["--topology", "ring-8", "--size", "lots"], "Error: --size: cannot read size 'lots'"),
    (["--topology", "nope"], "Error: --topology: unknown topology 'nope'"),
])
def test_bad_input_is_one_error_line(ring_xml, args, message):
    r = run("simulate", ring_xml, *args)
    assert r.exit_code == 1
    assert message in r.stderr and "Traceback" not in r.output
    assert r.stderr.strip().splitlines()[-1].startswith("Error: ")


def test_missing_file_and_bad_xml_are_errors(tmp_path):
    r = run("simulate", str(tmp_path / "none.xml"), "--topology", "ring-4")
    assert r.exit_code == 1 and "Error: " in r.stderr
    bad = tmp_path / "bad.xml"
    bad.write_text("<algo name='x'")
    r = run("simulate", str(bad), "--topology", "ring-4")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ")


def test_help_text():
    r = run("simulate", "--help")
    assert r.exit_code == 0 and "--alpha-occupies" in r.output and "--trace" in r.output
