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
