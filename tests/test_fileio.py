"""Atomic output files: complete or absent, with ordinary permissions."""

import os

import pytest

from synth.fileio import write_atomic


def test_written_file_has_the_mode_a_plain_open_would_give(tmp_path):
    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.xml", "<algo/>")
        write_atomic(tmp_path / "b.png", b"\x89PNG")
    finally:
        os.umask(umask)
    assert (tmp_path / "a.xml").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.png").read_bytes() == b"\x89PNG"


def test_failure_leaves_neither_file_nor_temporary(tmp_path):
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "x.xml", 12345)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------- read_json

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.errors import InputError
from synth.fileio import MAX_JSON_DEPTH, OutputPlan, parse_json, read_json


@pytest.mark.parametrize("data,message", [
    (b"\xff\xfe{}", "x.json: byte 0: is not UTF-8 text; save the topology file as UTF-8"),
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
     f"x.json: nests {MAX_JSON_DEPTH + 1} levels deep; a topology file never nests more than {MAX_JSON_DEPTH}"),
    (b'{"ranks": 2, "ranks": 3}', "x.json: ranks: duplicate key"),
    (b'{"bw_GBps": NaN}', "x.json: NaN is not a number JSON allows; give a finite value"),
    (b'{"bw_GBps": Infinity}', "x.json: Infinity is not a number JSON allows; give a finite value"),
    (b'{"a": \n', "x.json: line 2: invalid JSON: Expecting value"),
])
def test_json_refusals_name_the_file_and_the_problem(data, message):
    with pytest.raises(InputError) as err:
        parse_json(data, "x.json", "topology")
    assert str(err.value) == message


def test_brackets_inside_strings_do_not_count_as_nesting():
    deep_string = json.dumps({"name": "[" * 500 + "\\\"{" * 100})
    assert parse_json(deep_string.encode(), "x.json")["name"].startswith("[[[")


def test_read_json_refuses_large_files_and_non_regular_files(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 100 + "0]")
    with pytest.raises(InputError, match="is larger than 64 bytes"):
        read_json(big, "topology", max_bytes=64)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        read_json(fifo, "topology")
    with pytest.raises(InputError, match="cannot read file"):
        read_json(tmp_path / "missing.json")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_any_bytes_give_a_value_or_one_input_error(data):
    try:
        parse_json(data, "fuzz.json")
    except InputError as exc:
        assert str(exc).startswith("fuzz.json") and "\n" not in str(exc).strip()


# ----------------------------------------------------------------------------------------------- OutputPlan

def test_outputs_are_checked_before_work_and_written_together(tmp_path):
    plan = OutputPlan()
    plan.declare("-o", tmp_path / "a.xml")
    plan.declare("--schedule-out", tmp_path / "s.json")
    plan.stage("-o", "<algo/>")
    plan.stage("--schedule-out", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []          # nothing before commit
    assert sorted(p.name for p in plan.commit()) == ["a.xml", "s.json"]
    assert (tmp_path / "a.xml").read_text() == "<algo/>"


@pytest.mark.parametrize("make,message", [
    (lambda d: "", "-o: the output path is empty; give a file name"),
    (lambda d: str(d / "newdir") + "/", "names a directory; give a file name inside it"),
    (lambda d: d / "missing" / "a.xml", "does not exist (or is not a directory)"),
    (lambda d: d / "file.txt" / "a.xml", "does not exist (or is not a directory)"),
    (lambda d: d, "exists and is not a regular file; refusing to replace it"),
])
def test_bad_output_paths_are_refused(tmp_path, make, message):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OutputPlan().declare("-o", make(tmp_path))


def test_a_fifo_is_never_replaced_and_two_options_never_share_a_file(tmp_path):
    fifo = tmp_path / "out.xml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        OutputPlan().declare("-o", fifo)
    plan = OutputPlan()
    plan.declare("-o", tmp_path / "x")
    with pytest.raises(InputError, match="is also given to -o"):
        plan.declare("--schedule-out", tmp_path / "." / "x")
