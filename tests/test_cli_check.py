"""``synth check``: exit codes, one-line errors, report lines and --json (click's CliRunner).

Every test runs the real :mod:`backends.msccl.interpret`, on small programs written here (and, where present, on
the shared third-party files).
"""

import json

import pytest
from click.testing import CliRunner

from synth.cli import main
from support.shared import ALL_FILES, INVALID_FILE, shared_msccl_xml

EXECUTOR_XML = ('<algo name="pair" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
                'inplace="1" outofplace="0" minBytes="0" maxBytes="1073741824">\n') + """\
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


def swapped_steps(gpu: int) -> str:
    """EXECUTOR_XML with the two steps of ``gpu`` in the other order (``s`` renumbered)."""
    lines = EXECUTOR_XML.splitlines(keepends=True)
    first = 3 + 6 * gpu
    lines[first:first + 2] = (lines[first + 1].replace('s="1"', 's="0"'), lines[first].replace('s="0"', 's="1"'))
    return "".join(lines)


# Both ranks send before they receive: fine with one message of buffering, a deadlock with rendezvous sends.
SEND_FIRST_XML = swapped_steps(1)
RECEIVE_FIRST_XML = swapped_steps(0)


def silent_allgather(chunks_per_rank: int) -> str:
    """An in-place 2-rank Allgather that moves nothing: every chunk of the peer is missing at the end."""
    loop = 2 * chunks_per_rank
    gpus = "".join(f'  <gpu id="{g}" i_chunks="{chunks_per_rank}" o_chunks="{loop}" s_chunks="0">\n  </gpu>\n'
                   for g in range(2))
    return (f'<algo name="silent" proto="Simple" nchannels="1" nchunksperloop="{loop}" ngpus="2" coll="allgather" '
            f'inplace="1" outofplace="0" minBytes="0" maxBytes="1073741824">\n{gpus}</algo>\n')


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


def test_valid_file_exits_zero(executor_file):
    result = run(executor_file, "--target", "executor")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == f"{executor_file}: valid: 1 algo(s), 0 error(s), 0 warning(s)"


def test_collective_option_reaches_the_interpreter(executor_file):
    result = run(executor_file, "--collective", "reduce_scatter")
    assert result.exit_code == 1
    assert "error: postcondition: gpu 1: reducescatter output o[1] of rank 1 missing" in result.stdout


def test_fifo_depth_option_reaches_the_interpreter(tmp_path):
    path = tmp_path / "send-first.xml"
    path.write_text(SEND_FIRST_XML)
    assert run(path).exit_code == 0
    result = run(path, "--fifo-depth", "0")
    assert result.exit_code == 1
    assert "(s) waits for gpu 1 to take its message on channel 0 (rendezvous)" in result.stdout


def test_shared_legacy_file_is_valid_for_both_with_a_warning():
    path = shared_msccl_xml("simple_allgather_ring_4gpu.xml")
    result = run(path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"{path}:1: warning: algo-attributes:") for line in lines)
    assert lines[-1] == f"{path}: valid: 1 algo(s), 0 error(s), 1 warning(s)"


def test_shared_legacy_file_is_invalid_for_the_executor():
    path = shared_msccl_xml("simple_allgather_ring_4gpu.xml")
    result = run(path, "--target", "executor")
    assert result.exit_code == 1
    assert "error: algo-attributes: <algo> lacks minBytes, maxBytes, outofplace" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"{path}: INVALID: 1 algo(s), 1 error(s)")
    assert "Traceback" not in result.output


def test_interpreter_findings_make_the_file_invalid(tmp_path):
    path = tmp_path / "receive-first.xml"
    path.write_text(RECEIVE_FIRST_XML)
    result = run(path)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert (f"{path}: error: deadlock: gpu 0/tb 0/step 0: wait-for cycle: gpu 0 tb 0 step 0 (r) waits for a "
            "message from gpu 1 on channel 0 -> gpu 1 tb 0 step 0 (r) waits for a message from gpu 0 on channel 0 "
            "-> back to gpu 0 tb 0 step 0 (r); 2 tb(s) never finish; it also deadlocks with the runtime's FIFO "
            "depth 2 (Simple) (both runtimes)") in lines
    assert lines[-1] == f"{path}: INVALID: 1 algo(s), 1 error(s), 0 warning(s)"


def test_long_reports_are_capped_but_counted(tmp_path):
    path = tmp_path / "silent.xml"
    path.write_text(silent_allgather(32))      # 32 chunks of the peer missing on each of 2 ranks
    result = run(path)
    lines = [line for line in result.stdout.splitlines() if "postcondition" in line]
    assert len(lines) == 51 and "14 more postcondition finding(s) like the above" in lines[-1]
    assert result.stdout.splitlines()[-1].endswith("64 error(s), 0 warning(s)")
    report = json.loads(run(path, "--json").stdout)
    assert report["algos"][0]["errors"] == 64 and len(report["algos"][0]["findings"]) == 51


def test_custom_collective_checks_no_postcondition(tmp_path):
    path = tmp_path / "silent.xml"
    path.write_text(silent_allgather(1))
    assert run(path).exit_code == 1
    result = run(path, "--collective", "custom")
    assert result.exit_code == 0, result.output


def test_lexical_errors_make_the_file_invalid(tmp_path):
    path = tmp_path / "prolog.xml"
    path.write_text('<?xml version="1.0"?>\n' + EXECUTOR_XML)
    result = run(path)
    assert result.exit_code == 1
    assert f"{path}:1: error: lexical: the file starts with an <?xml ...?> prolog" in result.stdout


def test_structural_errors_skip_execution(tmp_path):
    path = tmp_path / "peer.xml"
    path.write_text(EXECUTOR_XML.replace('send="1" recv="1"', 'send="5" recv="1"'))
    result = run(path)
    assert result.exit_code == 1
    assert "error: tb-peer: gpu 0/tb 0: send=5 is not a rank" in result.stdout
    assert "not executed: fix the errors above first" in result.stdout


@pytest.mark.parametrize("text,line,problem", [
    (EXECUTOR_XML[:-40], 11, "file ends inside <tb> opened at line 9 (truncated file?)"),
    (EXECUTOR_XML.replace('type="r"', 'type="recv"', 1), 5, "<step> type='recv' is unknown"),
    (EXECUTOR_XML.replace(' cnt="1"', "", 1), 4, "<step> lacks required attribute cnt"),
    ("not xml at all <", 1, "unexpected end of file"),
], ids=["truncated", "unknown step type", "missing attribute", "not xml"])
def test_malformed_file_prints_one_error_line(tmp_path, text, line, problem):
    path = tmp_path / "bad.xml"
    path.write_text(text)
    result = run(path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"Error: {path}:{line}: {problem}"), result.stderr
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_missing_file_is_an_input_error(tmp_path):
    result = run(tmp_path / "nope.xml")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {tmp_path / 'nope.xml'}: cannot read the file")


def test_unknown_target_is_a_usage_error(executor_file):
    assert run(executor_file, "--target", "cuda").exit_code == 2


def test_json_report(tmp_path):
    path = tmp_path / "legacy.xml"
    path.write_text(EXECUTOR_XML.replace(' outofplace="0" minBytes="0" maxBytes="1073741824"', ""))
    result = run(path, "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["file"] == str(path) and report["valid"] is True and report["target"] == "both"
    (algo,) = report["algos"]
    assert (algo["name"], algo["coll"], algo["ngpus"], algo["executed"]) == ("pair", "allgather", 2, True)
    assert [(f["kind"], f["severity"], f["runtimes"]) for f in algo["findings"]] == [
        ("algo-attributes", "warning", ["executor"])]


def test_json_report_of_an_invalid_multi_algo_file(tmp_path):
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
