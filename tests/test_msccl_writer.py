"""The verified writer: names that cannot break the runtimes' lexers, text read back as the same program."""

import dataclasses

import pytest

from backends.msccl.parse import parse_msccl_xml
from backends.msccl.writer import emit_verified_xml
from synth.errors import BackendError, VerificationError
from synth.synthesis.steps import synthesize_steps


@pytest.fixture(scope="module")
def ring_schedule(ring4):
    return synthesize_steps(ring4, "allgather", 3, 3, 1).schedule


@pytest.mark.parametrize("hostile", ['box" evil="1', "box<1>", "a&b", "two\nlines", "tab\there", "x'y"])
def test_hostile_topology_names_are_written_in_the_safe_alphabet(ring4, ring_schedule, hostile):
    schedule = dataclasses.replace(ring_schedule, topology=hostile)
    emitted = emit_verified_xml(schedule, ring4, "executor")
    [program] = parse_msccl_xml(emitted.text, "ring.xml")
    assert program.name == emitted.program.name
    assert not set(program.name) & set("\"<>&\n\t' ")
    assert emitted.text.count("\n") == emitted.text.count("<")   # one element per line, nothing injected
    assert 'evil="' not in emitted.text


@pytest.mark.parametrize("hostile", ['synth" evil="1', "a<b", "a&amp;b", "two\nlines"])
def test_a_hostile_explicit_name_is_refused(ring4, ring_schedule, hostile):
    with pytest.raises(BackendError, match="holds characters the MSCCL lexers cannot take"):
        emit_verified_xml(ring_schedule, ring4, "executor", name=hostile)


def test_the_writer_needs_the_topology(ring_schedule):
    with pytest.raises(BackendError, match="lowered with its topology"):
        emit_verified_xml(ring_schedule, None, "executor")


def test_text_that_reads_back_as_another_program_is_refused(monkeypatch, ring4, ring_schedule):
    import backends.msccl.writer as writer
    real = writer.render_msccl_xml
    monkeypatch.setattr(writer, "render_msccl_xml", lambda program: real(program).replace('name="', 'name="x', 1))
    with pytest.raises(VerificationError, match="fused lowering reads back as a different program"):
        emit_verified_xml(ring_schedule, ring4, "executor")
