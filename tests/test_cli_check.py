"""``synth check``: exit codes, one-line errors, report lines and --json (click's CliRunner).

Most tests replace the interpreter by a stub so they test the command's plumbing alone; the last ones run the
real :mod:`backends.msccl.interpret` on the shared files.
"""

import json
import sys
import types

import pytest
from click.testing import CliRunner

from synth.cli import main
from backends.msccl.findings import Finding
from support.shared import ALL_FILES, INVALID_FILE, shared_msccl_xml

EXECUTOR_XML = ('<algo name="pair" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
                'inplace="0" outofplace="1" minBytes="0" maxBytes="1073741824">\n') + """\
  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""


class StubInterpreter:
    """Stands in for backends.msccl.interpret: records calls, returns the findings a test asks for."""

    def __init__(self):
        self.calls = []
        self.findings = ()

    def execute_program(self, program, collective=None, fifo_depth=None):
        self.calls.append((program.name, collective, fifo_depth))
        errors = any(f.severity == "error" for f in self.findings)
        return types.SimpleNamespace(findings=tuple(self.findings), ok=not errors)


@pytest.fixture
def stub(monkeypatch):
    interpreter = StubInterpreter()
    module = types.ModuleType("backends.msccl.interpret")
    module.execute_program = interpreter.execute_program
    monkeypatch.setitem(sys.modules, "backends.msccl.interpret", module)
    import synth
    monkeypatch.setattr(synth, "interpret", module, raising=False)
    return interpreter


def run(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


@pytest.fixture
def executor_file(tmp_path):
    path = tmp_path / "pair.xml"
    path.write_text(EXECUTOR_XML)
    return path


def test_check_has_help_text():
    result = CliRunner().invoke(main, ["check", "--help"])
    assert result.exit_code == 0
    assert "--target" in result.output and "--fifo-depth" in result.output and "--json" in result.output


def test_valid_file_exits_zero(stub, executor_file):
    result = run(executor_file, "--target", "executor")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == f"{executor_file}: valid: 1 algo(s), 0 error(s), 0 warning(s)"
    assert stub.calls == [("pair", None, None)]


def test_options_reach_the_interpreter(stub, executor_file):
    assert run(executor_file, "--collective", "reduce_scatter", "--fifo-depth", "0").exit_code == 0
    assert stub.calls == [("pair", "reducescatter", 0)]


def test_shared_legacy_file_is_valid_for_both_with_a_warning(stub):
    path = shared_msccl_xml("simple_allgather_ring_4gpu.xml")
    result = run(path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"{path}:1: warning: algo-attributes:") for line in lines)
    assert lines[-1] == f"{path}: valid: 1 algo(s), 0 error(s), 1 warning(s)"


def test_shared_legacy_file_is_invalid_for_the_executor(stub):
    path = shared_msccl_xml("simple_allgather_ring_4gpu.xml")
    result = run(path, "--target", "executor")
    assert result.exit_code == 1
    assert "error: algo-attributes: <algo> lacks minBytes, maxBytes, outofplace" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"{path}: INVALID: 1 algo(s), 1 error(s)")
    assert "Traceback" not in result.output


def test_interpreter_findings_make_the_file_invalid(stub, executor_file):
    stub.findings = (Finding("deadlock", "every tb waits", gpu=0, tb=0, step=1, line=5),
                     Finding("race", "maybe", "warning", gpu=1))
    result = run(executor_file)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert f"{executor_file}:5: error: deadlock: gpu 0/tb 0/step 1: every tb waits (both runtimes)" in lines
    assert f"{executor_file}: warning: race: gpu 1: maybe (both runtimes)" in lines
    assert lines[-1] == f"{executor_file}: INVALID: 1 algo(s), 1 error(s), 1 warning(s)"


def test_long_reports_are_capped_but_counted(stub, executor_file):
    stub.findings = tuple(Finding("postcondition", f"chunk {k} wrong", gpu=0) for k in range(60))
    result = run(executor_file)
    lines = [line for line in result.stdout.splitlines() if "postcondition" in line]
    assert len(lines) == 51 and "10 more postcondition finding(s) like the above" in lines[-1]
    assert result.stdout.splitlines()[-1].endswith("60 error(s), 0 warning(s)")
    report = json.loads(run(executor_file, "--json").stdout)
    assert report["algos"][0]["errors"] == 60 and len(report["algos"][0]["findings"]) == 51


def test_custom_collective_is_passed_through(stub, executor_file):
    assert run(executor_file, "--collective", "custom").exit_code == 0
    assert stub.calls == [("pair", "custom", None)]


def test_lexical_errors_make_the_file_invalid(stub, tmp_path):
    path = tmp_path / "prolog.xml"
    path.write_text('<?xml version="1.0"?>\n' + EXECUTOR_XML)
    result = run(path)
    assert result.exit_code == 1
    assert f"{path}:1: error: lexical: the file starts with an <?xml ...?> prolog" in result.stdout


def test_structural_errors_skip_execution(stub, tmp_path):
    path = tmp_path / "peer.xml"
    path.write_text(EXECUTOR_XML.replace('send="1" recv="1"', 'send="5" recv="1"'))
    result = run(path)
    assert result.exit_code == 1
    assert stub.calls == []
    assert "error: tb-peer: gpu 0/tb 0: send=5 is not a rank" in result.stdout
    assert "not executed: fix the errors above first" in result.stdout


@pytest.mark.parametrize("text,line,problem", [
    (EXECUTOR_XML[:-40], 11, "file ends inside <tb> opened at line 9 (truncated file?)"),
    (EXECUTOR_XML.replace('type="r"', 'type="recv"', 1), 5, "<step> type='recv' is unknown"),
    (EXECUTOR_XML.replace(' cnt="1"', "", 1), 4, "<step> lacks required attribute cnt"),
    ("not xml at all <", 1, "unexpected end of file"),
], ids=["truncated", "unknown step type", "missing attribute", "not xml"])
def test_malformed_file_prints_one_error_line(stub, tmp_path, text, line, problem):
    path = tmp_path / "bad.xml"
    path.write_text(text)
    result = run(path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"Error: {path}:{line}: {problem}"), result.stderr
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_missing_file_is_an_input_error(stub, tmp_path):
    result = run(tmp_path / "nope.xml")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {tmp_path / 'nope.xml'}: cannot read the file")


def test_unknown_target_is_a_usage_error(stub, executor_file):
    assert run(executor_file, "--target", "cuda").exit_code == 2


def test_json_report(stub, executor_file):
    stub.findings = (Finding("race", "maybe", "warning", gpu=1),)
    result = run(executor_file, "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["file"] == str(executor_file) and report["valid"] is True and report["target"] == "both"
    (algo,) = report["algos"]
    assert (algo["name"], algo["coll"], algo["ngpus"], algo["executed"]) == ("pair", "allgather", 2, True)
    assert algo["findings"] == [Finding("race", "maybe", "warning", gpu=1).to_dict()]


def test_json_report_of_an_invalid_multi_algo_file(stub, tmp_path):
    path = tmp_path / "two.xml"
    path.write_text(EXECUTOR_XML + shared_msccl_xml("dgx1_reducescatter_s2_r3_c2.xml").read_text() + "\n<copy/>\n")
    result = run(path, "--json", "--target", "executor")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert [a["name"] for a in report["algos"]] == ["pair", "ReduceScatter(n=8)-DGX1-steps=2,rounds=3,chunks=2"]
    assert [a["valid"] for a in report["algos"]] == [True, False]
    assert {f["kind"] for f in report["algos"][1]["findings"]} == {"algo-attributes", "coll"}
    assert [f["kind"] for f in report["findings"]] == ["unknown-element"]


# --- with the real interpreter ----------------------------------------------------------------------------

VERDICTS = {name: name != INVALID_FILE for name in ALL_FILES}


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_shared_files_get_the_readme_verdict(name):
    result = run(shared_msccl_xml(name), "--target", "legacy")
    assert "Traceback" not in result.output
    assert result.exit_code == (0 if VERDICTS[name] else 1), result.output
