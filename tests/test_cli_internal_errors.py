"""A bug of ours ends in one line and exit code 70, never a traceback (the traceback only when asked for)."""

import pytest
from click.testing import CliRunner

import synth.cli.topo
from synth.cli import main
from synth.cli._common import EXIT_INTERNAL


def _broken(*args, **kwargs):
    raise KeyError(140410282273744)


def test_an_unexpected_exception_is_one_error_line_with_exit_code_70(monkeypatch):
    monkeypatch.setattr(synth.cli.topo, "load_topology", _broken)
    monkeypatch.delenv("SYNTH_TRACEBACK", raising=False)
    result = CliRunner().invoke(main, ["topo", "show", "dgx1"])
    assert result.exit_code == EXIT_INTERNAL
    assert result.output.strip().splitlines() == [
        "Error: internal error in synth topo show (KeyError: 140410282273744); no output was written. Please report it "
        "with the command line; SYNTH_TRACEBACK=1 shows the traceback"]


def test_the_traceback_is_shown_when_asked_for(monkeypatch):
    monkeypatch.setattr(synth.cli.topo, "load_topology", _broken)
    monkeypatch.setenv("SYNTH_TRACEBACK", "1")
    result = CliRunner().invoke(main, ["topo", "show", "dgx1"])
    assert isinstance(result.exception, KeyError)


@pytest.mark.parametrize("args, code", [(["solve", "--bogus"], 2), (["topo", "show", "no-such-machine"], 1)])
def test_usage_and_input_errors_keep_their_codes(args, code):
    assert CliRunner().invoke(main, args).exit_code == code
