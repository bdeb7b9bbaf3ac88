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


@pytest.mark.parametrize("coll", ["alltoall", "allgather", "reducescatter"])
def test_sends_and_receives_name_the_other_end_as_msccl_tools_does(dgx1, coll):
    """The k-th message of a connection: the send's destination fields are where the receive writes, and the
    receive's source fields are where the send reads (what MSCCL-XML-Verifier matches)."""
    from collections import defaultdict
    from backends.msccl.ir import STEP_TYPES
    from support.instances import DGX1_EVERY_COLLECTIVE
    [(S, R, C)] = [(s, r, c) for name, s, r, c in DGX1_EVERY_COLLECTIVE if name == coll]
    schedule = synthesize_steps(dgx1, coll, S, R, C).schedule
    [program] = parse_msccl_xml(emit_verified_xml(schedule, dgx1, "executor").text, "x.xml")
    sends, recvs = defaultdict(list), defaultdict(list)
    for gpu in program.gpus:
        for tb in gpu.tbs:
            for st in tb.steps:
                receives, sends_data, _, _ = STEP_TYPES[st.type]
                if sends_data:
                    sends[(gpu.id, tb.send, tb.chan)].append(st)
                if receives:
                    recvs[(tb.recv, gpu.id, tb.chan)].append(st)
    plain = 0
    for conn, sent in sends.items():
        for send, recv in zip(sent, recvs[conn], strict=True):
            if send.type == "s":
                assert (send.dstbuf, send.dstoff) == (recv.dstbuf, recv.dstoff)
                plain += 1
            if recv.type == "r":
                assert (recv.srcbuf, recv.srcoff) == (send.srcbuf, send.srcoff)
    assert plain > 0


class _Expired:
    expired = True


def _count_simulations(monkeypatch):
    import backends.msccl.writer as writer
    calls = []
    real = writer._simulated_us
    monkeypatch.setattr(writer, "_simulated_us", lambda *args: (calls.append(args[0]), real(*args))[1])
    return calls


def test_an_expired_deadline_writes_the_first_fitted_variant_verified(monkeypatch, ring4, ring_schedule):
    from backends.msccl.verdict import check_text
    calls = _count_simulations(monkeypatch)
    # the ring's first variant simulates at its unmerged floor, which would settle it: without that floor, the
    # plain one may still win
    monkeypatch.setattr("backends.msccl.writer.unmerged_floor_us", lambda schedule, topology, size: 0.0)
    unhurried = emit_verified_xml(ring_schedule, ring4, "executor", 1 << 20)
    assert len(calls) > 1                  # several variants are timed when there is time
    calls.clear()
    hurried = emit_verified_xml(ring_schedule, ring4, "executor", 1 << 20, deadline=_Expired())
    assert len(calls) == 1 and hurried.lowering.label == "fused"
    assert check_text(hurried.text, "ring.xml", "executor").valid
    assert hurried.simulated_us >= unhurried.simulated_us
    assert hurried.variants_cut and not unhurried.variants_cut    # solve reports status time-limit


def _every_variant(schedule, topology, size):
    """Every fitted variant the writer may make, simulated: (sort key, simulated us, label)."""
    from backends.msccl.fit import fit_lowering, wider_fits
    from backends.msccl.simulate import simulate_program
    from backends.msccl.writer import _sort_key
    out = []
    for fuse in (True, False):
        fit = fit_lowering(schedule, topology, "executor", fuse)
        for variant in wider_fits(schedule, topology, "executor", fit) if fit.fits else []:
            time_us = simulate_program(variant.program, topology, size).time_us
            out.append((_sort_key(time_us, variant.lowering), time_us, variant.lowering.label))
    return sorted(out)


@pytest.mark.parametrize("case", ["ring-4 steps", "dgx1 ring c4", "dgx1 allreduce ring c2"])
def test_variants_left_unmade_could_not_have_won(case, ring4, dgx1, ring_schedule):
    """The writer stops making variants at a bound no variant beats: it writes what trying all of them would."""
    from backends.msccl.floor import schedule_floor_us
    from synth.synthesis.baselines import build_baseline
    topology, schedule = {"ring-4 steps": (ring4, ring_schedule),
                          "dgx1 ring c4": (dgx1, build_baseline("ring", "allgather", dgx1, 4)),
                          "dgx1 allreduce ring c2": (dgx1, build_baseline("ring", "allreduce", dgx1, 2))}[case]
    size = 1 << 20
    every = _every_variant(schedule, topology, size)
    emitted = emit_verified_xml(schedule, topology, "executor", size)
    assert (emitted.simulated_us, emitted.lowering.label) == (every[0][1], every[0][2])
    floor = schedule_floor_us(schedule, topology, size)
    assert all(time_us >= floor * (1 - 1e-12) for _, time_us, _ in every)


def test_each_phase_of_writing_is_announced(ring4, ring_schedule):
    heard = []
    emitted = emit_verified_xml(ring_schedule, ring4, "executor", 1 << 20, progress=heard.append)
    label, steps = emitted.lowering.label, sum(len(tb.steps) for g in emitted.program.gpus for tb in g.tbs)
    assert heard[0] == "    fitting the fused lowering to the executor runtime's limits (12 transfers)"
    assert f"    simulating the {label} lowering ({steps} steps)" in heard
    assert heard[-1] == f"    checking the {label} lowering as synth check does (render, parse, lint, execute)"
