"""Hypothesis fuzzing of every input surface (issue 14): any mutation of a valid file, any hostile option value
and any hostile output path ends in success or in one ``Error:`` line, never a traceback or a hang, and a failed
run leaves no file behind. Mutations are those of ``benchmarks/bench_fuzz.py`` (tests/support/fuzzing.py); the
benchmark runs a thousand of them, each test here a few seconds' worth."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.errors import InputError
from synth.model.sketch import load_sketch
from synth.model.topology import load_topology
from support.fuzzing import SURFACES, argv_for, mutate, option_case, path_case, reset_scratch, run_case, \
    scratch_files

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# The sketch surfaces solve when a mutant is valid: the suite reads them through the loader instead.
CLI_SURFACES = [name for name in SURFACES if "sketch" not in name]
SEEDS = {name: SURFACES[name].seeds() for name in SURFACES}


@pytest.mark.parametrize("name", CLI_SURFACES)
@FAST
@given(rng=st.randoms(use_true_random=False))
def test_mutated_files_end_in_success_or_one_error_line(tmp_path, name, rng):
    surface = SURFACES[name]
    path = tmp_path / f"case{surface.suffix}"
    path.write_bytes(mutate(rng.choice(SEEDS[name]), rng, surface.structured))
    outcome = run_case(argv_for(surface, path), limit_s=10.0)
    assert outcome.kind in ("ok", "error"), outcome.detail


@pytest.mark.parametrize("name", ["sketch", "taccl-sketch"])
@FAST
@given(rng=st.randoms(use_true_random=False))
def test_mutated_sketches_load_or_raise_an_input_error(tmp_path, name, rng):
    path = tmp_path / "case.json"
    path.write_bytes(mutate(rng.choice(SEEDS[name]), rng, True))
    try:
        load_sketch(str(path), _NDV2)
    except InputError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)


_NDV2 = load_topology("ndv2-2node-tecc")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scratch")
    return folder, scratch_files(folder)


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_hostile_option_values_end_in_success_or_one_error_line(scratch, rng):
    outcome = run_case(option_case(rng, scratch[1]), limit_s=10.0)
    assert outcome.kind in ("ok", "error"), outcome.detail


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_hostile_output_paths_are_refused_and_never_replace_a_non_regular_file(scratch, rng, monkeypatch):
    folder, files = scratch
    monkeypatch.chdir(folder)
    reset_scratch(folder)
    argv = path_case(rng, files)
    outcome = run_case(argv, limit_s=10.0)
    assert outcome.kind in ("ok", "error"), outcome.detail
    assert stat.S_ISFIFO(os.lstat(folder / "fifo").st_mode) and (folder / "dir").is_dir()
    if outcome.kind == "error":
        assert set(os.listdir(folder)) == {"dir", "file", "fifo", *(os.path.basename(p) for p in files.values())}
        assert (folder / "file").read_text() == "kept" and not any((folder / "dir").iterdir())
