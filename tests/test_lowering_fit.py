"""Fitting MSCCL programs into the runtime: the SM ceiling on threadblocks per GPU, merged ``cnt > 1`` steps,
connections spread over channels, and the fast fit estimate the writer and synthesis use (DESIGN section 7)."""

import json
from dataclasses import replace

from click.testing import CliRunner

from backends.msccl.limits import runtime_limits
from backends.msccl.lint import lint_program
from backends.msccl.verdict import check_program
from synth.cli import main
from synth.model.topology import load_topology
from support.programs import render, ring_allgather

THREE_TBS_MESSAGE = "3 threadblocks; all must be co-resident (one per SM) and the GPU has 2 SMs, so at most 2"


# --- SM ceiling ---------------------------------------------------------------------------------------------

def test_more_threadblocks_than_sms_is_a_limit_on_every_gpu():
    program = ring_allgather(4, channels=3)        # 3 tbs per gpu
    found = [f for f in runtime_limits(program, sms=2) if f.kind == "tbs-per-gpu"]
    assert [(f.gpu, f.message, f.runtimes) for f in found] == [(g, THREE_TBS_MESSAGE, ("executor", "legacy"))
                                                                for g in range(4)]
    assert runtime_limits(program, sms=3) == []
    assert runtime_limits(program) == []            # unknown GPU: nothing to check


def test_the_verdict_judges_threadblocks_against_the_sms_it_is_given():
    program = ring_allgather(4, channels=3)
    assert check_program(program, "executor", sms=3).valid
    report = check_program(program, "executor", sms=2)
    assert not report.valid and {str(f) for f in report.findings if f.severity == "error"} == {
        f"error: tbs-per-gpu: gpu {g}: {THREE_TBS_MESSAGE} (both runtimes)" for g in range(4)}


def test_unknown_sms_keeps_the_typical_warning():
    wide = ring_allgather(2, channels=81)          # 81 tbs per gpu; no SM count given
    warnings = [f for f in lint_program(wide, "legacy") if f.kind == "tb-count"]
    assert len(warnings) == 2 and all(f.severity == "warning" for f in warnings)
    assert not [f for f in lint_program(wide, "legacy", sms=132) if f.kind in ("tb-count", "tbs-per-gpu")]


def run_check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_check_takes_the_sm_count_from_an_option_or_a_topology(tmp_path):
    path = tmp_path / "ring.xml"
    path.write_text(render(ring_allgather(4, channels=3)))
    refused = run_check(path, "--target", "executor", "--sms", 2)
    assert refused.exit_code == 1
    assert f"{path}:2: error: tbs-per-gpu: gpu 0: {THREE_TBS_MESSAGE} (both runtimes)" in refused.output
    assert run_check(path, "--target", "executor", "--sms", 3).exit_code == 0
    topo = tmp_path / "small_gpus.json"
    topo.write_text(json.dumps(replace(load_topology("ring-4"), sms_per_gpu=2).to_dict()))
    assert THREE_TBS_MESSAGE in run_check(path, "--target", "executor", "--topology", topo).output
    assert run_check(path, "--target", "executor", "--topology", "dgx1").exit_code == 0   # 80 SMs
    unknown = run_check(path, "--topology", "ring-4")
    assert unknown.exit_code == 1
    assert "topology ring-4 does not say how many SMs its GPUs have; give --sms N" in unknown.output
