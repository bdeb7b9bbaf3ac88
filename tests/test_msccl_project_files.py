"""Parse, lint, interpret, simulate, ``synth check`` and ``synth run`` on MSCCL files the project writes itself.

The same behaviours are tested on the third-party files in ../shared/data when they are present; these tests
keep them covered in a plain clone. The files come from :mod:`support.programs`: a ring, a tree and all-pairs
lowered by our backend (executor format, each with a legacy twin), a hand-built LL128 ring, and an Allreduce
that reduces one contribution twice.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from click.testing import CliRunner

from backends.msccl.interpret import execute_program
from backends.msccl.lint import lint_program, lint_text
from backends.msccl.lowering import DEFAULT_MAX_BYTES
from backends.msccl.parse import load_msccl_xml, parse_msccl_xml
from backends.msccl.simulate import simulate_program
from synth.cli import main
from synth.model.topology import load_topology
from support.extras import need_torch
from support.mutants import mutant_sweep, replace_step, replace_tb
from support.programs import (BUILDERS, INVALID_FILE, LOWERED, legacy, lowered_baseline, reduced_twice_allreduce,
                              render, ring_allgather)

ALPHA_US, BW_BYTES_PER_US = 0.7, 25.0 * 1e3   # ring-N and fully-connected-N links


@pytest.fixture(scope="module")
def lowered():
    """Every support.programs.LOWERED case, lowered once: key -> program (executor format)."""
    return {key: lowered_baseline(case) for key, case in LOWERED.items()}


def without_lines(program):
    """The program with every ``line`` field 0, as generated programs have it."""
    gpus = tuple(dataclasses.replace(g, line=0, tbs=tuple(dataclasses.replace(
        tb, line=0, steps=tuple(dataclasses.replace(s, line=0) for s in tb.steps)) for tb in g.tbs))
        for g in program.gpus)
    return dataclasses.replace(program, line=0, gpus=gpus)


def kinds(findings) -> list[str]:
    return [f.kind for f in findings]


# ----------------------------------------------------------------------------------------------- parse

@pytest.mark.parametrize("key", sorted(LOWERED))
@pytest.mark.parametrize("fmt", ["executor", "legacy"])
def test_rendered_file_parses_back_to_the_program(lowered, key, fmt):
    program = lowered[key] if fmt == "executor" else legacy(lowered[key])
    text = render(program)
    (parsed,) = parse_msccl_xml(text, "p.xml")
    assert without_lines(parsed) == program
    has_executor_attributes = all(f' {a}="' in text.split("\n")[0] for a in ("outofplace", "minBytes", "maxBytes"))
    assert has_executor_attributes == (fmt == "executor")


def test_legacy_file_lacks_the_executor_attributes(msccl_files):
    (p,) = load_msccl_xml(msccl_files["legacy_ring_allgather_ring-8.xml"])
    assert (p.min_bytes, p.max_bytes, p.outofplace) == (None, None, None)
    (p,) = load_msccl_xml(msccl_files["ring_allgather_ring-8.xml"])
    assert (p.min_bytes, p.max_bytes, p.outofplace) == (0, DEFAULT_MAX_BYTES, 1)


@pytest.mark.parametrize("name", ["double-binary-tree_allreduce_fully-connected-8.xml", INVALID_FILE])
def test_line_numbers_point_at_the_elements(msccl_files, name):
    text = msccl_files[name].read_text()
    lines = text.split("\n")
    (p,) = parse_msccl_xml(text, name)
    assert lines[p.line - 1].startswith("<algo")
    for gpu in p.gpus:
        assert lines[gpu.line - 1].lstrip().startswith(f'<gpu id="{gpu.id}"')
        for tb in gpu.tbs:
            assert lines[tb.line - 1].lstrip().startswith(f'<tb id="{tb.id}"')
            for step in tb.steps:
                assert lines[step.line - 1].lstrip().startswith(f'<step s="{step.s}" type="{step.type}"')


def test_several_algo_documents_and_trailing_text_in_one_file(msccl_files):
    first = msccl_files["ring_allgather_8_ll128.xml"].read_text()
    second = msccl_files["legacy_all-pairs_alltoall_fully-connected-8.xml"].read_text()
    programs = parse_msccl_xml(first + "\n" + second + "\ntrailing words written by some tool\n", "two.xml")
    assert [p.name for p in programs] == ["test_allgather", "all-pairs_alltoall_fully-connected-8"]
    assert programs[1].line == first.count("\n") + 2
    assert programs[1].gpus[0].line == programs[1].line + 1


# ----------------------------------------------------------------------------------------------- lint

@pytest.mark.parametrize("key", sorted(LOWERED))
def test_legacy_twin_lacks_executor_attributes_and_is_otherwise_clean(lowered, key):
    program = legacy(lowered[key])
    text = render(program)
    (parsed,) = parse_msccl_xml(text, "p.xml")
    (missing,) = [f for f in lint_program(parsed, "executor") if f.kind == "algo-attributes"]
    assert missing.severity == "error" and missing.line == 1
    assert lint_program(parsed, "legacy") == []
    assert all(f.severity == "warning" for f in lint_program(parsed, "both"))
    assert lint_text(text, "p.xml") == []
    assert lint_program(lowered[key], "executor") == []


def test_mutated_file_reports_line_and_location(msccl_files):
    lines = msccl_files["ring_allgather_ring-8.xml"].read_text().split("\n")
    target = next(k for k, line in enumerate(lines) if '<tb id="1" send="2" recv="0"' in line)
    lines[target] = lines[target].replace('chan="1"', 'chan="7"')
    (program,) = parse_msccl_xml("\n".join(lines), "m.xml")
    (f,) = [f for f in lint_program(program) if f.kind == "channel"]
    assert (f.gpu, f.tb, f.line) == (1, 1, target + 1) and "nchannels=2" in f.message


def test_dependency_on_a_silent_step_is_a_lint_error(lowered):
    program = lowered["ring"]
    (copy,) = [tb for tb in program.gpus[0].tbs if tb.id == 0]
    silent = replace_tb(program, 0, 0, steps=tuple(dataclasses.replace(s, hasdep=0) for s in copy.steps))
    findings = [f for f in lint_program(silent, "legacy") if f.kind == "dependency"]
    assert [(f.gpu, f.tb, f.step, f.severity) for f in findings] == [(0, 1, 0, "error")]
    assert "waits for tb 0 step 0, which has hasdep=0 and so never signals" in findings[0].message


# ----------------------------------------------------------------------------------------------- interpret

@pytest.mark.parametrize("key", sorted(LOWERED))
def test_lowered_programs_are_valid_in_both_formats(lowered, key):
    for program in (lowered[key], legacy(lowered[key])):
        result = execute_program(program)
        assert result.ok, [str(f) for f in result.errors()[:3]]
        assert result.completed and result.deadlock_cycle == ()
        assert result.collective.name == LOWERED[key].collective


def test_reduced_twice_allreduce_names_every_doubled_contribution():
    result = execute_program(reduced_twice_allreduce(4))
    assert not result.ok
    post = [f.message for f in result.errors() if f.kind == "postcondition"]
    assert len(post) == 4 and len(result.errors()) == 4   # chunk 0 on each rank; nothing else is wrong
    assert post[0] == ("allreduce output o[0] of rank 0 contributions counted too often: rank 0's i[0] (2x); "
                       "expected i[0] of ranks 0-3 (last written by gpu 0 tb 0 step 6)")
    assert all("rank 0's i[0] (2x)" in m for m in post)
    assert result.outputs[(1, 0)] == Counter({(0, 0): 2, (1, 0): 1, (2, 0): 1, (3, 0): 1})


def test_rendezvous_sends_reject_the_ring_allgather_that_depth_one_accepts():
    program = ring_allgather(8, proto="LL128")
    assert execute_program(program, fifo_depth=1).ok
    rendezvous = execute_program(program, fifo_depth=0)
    assert "deadlock" in kinds(rendezvous.errors()) and len(rendezvous.deadlock_cycle) == 8


def test_inplace_allgather_outputs_hold_every_rank_chunk():
    result = execute_program(ring_allgather(8, proto="LL128"))
    assert result.collective.chunks_per_rank == 1
    assert all(result.outputs[(r, k)] == Counter({(k, 0): 1}) for r in range(8) for k in range(8))


def test_missing_dependency_in_a_lowered_program_is_a_race(lowered):
    result = execute_program(replace_step(lowered["ring"], 0, 1, 0, depid=-1, deps=-1))
    races = [f.message for f in result.errors() if f.kind == "race"]
    assert races and races[0] == ("tb 0 step 0 (cpy) and tb 1 step 0 (s) may run concurrently and one writes and "
                                  "the other reads o[0]; nothing orders them (add a dependency)")


def test_seeded_mutant_sweep_on_project_programs_catches_most_faults(lowered):
    programs = [BUILDERS[c]() for c in sorted(BUILDERS)] + [lowered["ring"], lowered["all-pairs"]]
    stats = mutant_sweep(programs, 300, seed=1)
    assert stats["share"] >= 0.85, stats


# ----------------------------------------------------------------------------------------------- simulate

def test_programs_time_on_matching_topologies(lowered):
    ring = simulate_program(ring_allgather(8, proto="LL128"), load_topology("ring-8"), 1 << 20)
    assert ring.protocol == "LL128" and ring.fifo_depth == 8
    assert ring.time_us == pytest.approx(7 * (ALPHA_US + (1 << 17) / BW_BYTES_PER_US))
    tree = simulate_program(lowered["tree"], load_topology("fully-connected-8"), 1 << 20)
    assert 0 < tree.time_us and all(0 < b.utilisation <= 1 for b in tree.link_busy)


# ----------------------------------------------------------------------------------------------- synth check

def check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_every_project_file_gets_its_verdict(msccl_files):
    for name, path in msccl_files.items():
        result = check(path, "--target", "legacy")
        assert "Traceback" not in result.output
        assert result.exit_code == (1 if name == INVALID_FILE else 0), (name, result.output)


def test_invalid_file_report_names_the_doubled_contribution(msccl_files):
    path = msccl_files[INVALID_FILE]
    result = check(path)
    assert result.exit_code == 1
    assert (f"{path}: error: postcondition: gpu 0: allreduce output o[0] of rank 0 contributions counted too often: "
            f"rank 0's i[0] (2x); expected i[0] of ranks 0-3 (last written by gpu 0 tb 0 step 6) (both runtimes)"
            ) in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == f"{path}: INVALID: 1 algo(s), 4 error(s), 1 warning(s)"


def test_legacy_file_is_valid_for_both_with_a_warning(msccl_files):
    path = msccl_files["legacy_ring_allgather_ring-8.xml"]
    result = check(path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"{path}:1: warning: algo-attributes:") for line in lines)
    assert lines[-1] == f"{path}: valid: 1 algo(s), 0 error(s), 1 warning(s)"


def test_legacy_file_is_invalid_for_the_executor(msccl_files):
    path = msccl_files["legacy_ring_allgather_ring-8.xml"]
    result = check(path, "--target", "executor")
    assert result.exit_code == 1
    assert "error: algo-attributes: <algo> lacks minBytes, maxBytes, outofplace" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"{path}: INVALID: 1 algo(s), 1 error(s)")


def test_json_report_of_an_invalid_multi_algo_file(msccl_files, tmp_path):
    path = tmp_path / "two.xml"
    path.write_text(msccl_files["ring_allgather_ring-8.xml"].read_text()
                    + msccl_files["legacy_all-pairs_alltoall_fully-connected-8.xml"].read_text() + "\n<copy/>\n")
    result = check(path, "--json", "--target", "executor")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert [a["name"] for a in report["algos"]] == ["ring_allgather_ring-8", "all-pairs_alltoall_fully-connected-8"]
    assert [a["valid"] for a in report["algos"]] == [True, False]
    assert {f["kind"] for f in report["algos"][1]["findings"]} == {"algo-attributes"}
    assert [f["kind"] for f in report["findings"]] == ["unknown-element"]


# ----------------------------------------------------------------------------------------------- synth run

def test_project_files_plan_cleanly(msccl_files):
    from synth.runtime.program_buffers import plan_program
    for path in msccl_files.values():
        for program in load_msccl_xml(path):
            assert plan_program(program, program.ngpus, str(path)).messages > 0


@pytest.mark.parametrize("key", sorted(LOWERED))
def test_lowered_files_run_on_8_processes(msccl_files, key):
    need_torch()
    from synth.runtime.torch_run import run_msccl_file
    reports = run_msccl_file(msccl_files[LOWERED[key].file_name], 8, timeout_s=30)
    assert sorted(r.inplace for r in reports) == ([False] if key == "all-pairs" else [False, True])
    for report in reports:
        assert report.ok, report.problems
        assert report.nprocs == 8 and report.messages > 0


def test_invalid_file_run_fails_naming_rank_and_chunk(msccl_files):
    need_torch()
    result = CliRunner().invoke(main, ["run", str(msccl_files[INVALID_FILE]), "--timeout", "30"])
    assert result.exit_code == 1
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert "rank 0: output chunk 0 is wrong: contributions counted wrongly: rank 0 2 times" in error
    assert "4 wrong output chunk(s) in all" in error
