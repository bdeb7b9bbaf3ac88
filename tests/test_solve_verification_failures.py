"""A candidate whose lowering fails its own verification is skipped (never written); the others still compete."""

import pytest

import synth.synthesis.solve as solve_module
from synth.errors import VerificationError
from synth.model.topology import load_topology
from synth.synthesis.request import SynthesisRequest


def test_a_candidate_failing_verification_is_skipped_and_a_verified_one_written(monkeypatch):
    real = solve_module.emit_verified_xml
    failed = []

    def emit(schedule, *args, **kwargs):
        if not schedule.method.startswith("baseline") and not failed:
            failed.append(schedule.method)
            raise VerificationError("the lowered MSCCL program fused lowering fails its check: deadlock")
        return real(schedule, *args, **kwargs)

    monkeypatch.setattr(solve_module, "emit_verified_xml", emit)
    solution = solve_module.solve(SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20))
    assert failed and solution.xml.text.startswith("<algo")
    assert any("fails its check: deadlock" in r for r in solution.refusals)


def test_when_every_candidate_fails_verification_the_error_says_so(monkeypatch):
    def emit(schedule, *args, **kwargs):
        raise VerificationError("deadlock")

    monkeypatch.setattr(solve_module, "emit_verified_xml", emit)
    with pytest.raises(VerificationError, match="no candidate could be written: .*deadlock"):
        solve_module.solve(SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20))
