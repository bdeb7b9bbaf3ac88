"""``synth solve`` as a library call: the whole pipeline for one request, from candidates to a verified file.

:func:`solve` takes a :class:`~synth.synthesis.request.SynthesisRequest`, gathers every verified candidate
(:func:`synth.synthesis.select.verified_candidates`), and, when MSCCL XML is asked for, writes the fastest one
the runtime accepts through the one verified writer (:mod:`backends.msccl.writer`: lowered with the topology,
parsed back, linted and executed as ``synth check`` does, simulated). It returns texts, never files: the
command commits them together (:class:`synth.fileio.OutputPlan`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from backends.msccl.lowering import DEFAULT_MAX_BYTES
from backends.msccl.writer import EmittedXml, emit_first_accepted
from synth.errors import InputError
from synth.formulations.steps import encode_steps
from synth.solver.highs import write_model
from synth.synthesis.comparison import LimitComparison, compare_with_limits
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import Candidate, verified_candidates

Progress = Callable[[str], None]


@dataclass(frozen=True)
class XmlRequest:
    """What the MSCCL file should say: the runtime (``executor``/``legacy``), protocol and size range (bytes)."""

    target: str = "executor"
    proto: str = "Simple"
    min_bytes: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class Solution:
    """The chosen candidate (the fastest that could be written, when XML was asked for), every candidate
    considered, the verified XML, and how the choice compares with the physical limit and the baselines."""

    request: SynthesisRequest
    candidates: tuple[Candidate, ...]
    chosen: Candidate
    xml: EmittedXml | None
    comparison: LimitComparison

    def report(self) -> dict:
        """The ``--json`` report (keys documented in the README)."""
        result, replay = self.chosen.result, self.chosen.report
        topo = self.request.topology
        return {
            "status": result.status, "solve_seconds": result.solve_seconds, "gap": result.gap,
            "predicted_time_us": replay.time_us, "algbw_GBps": replay.algbw_GBps, "busbw_GBps": replay.busbw_GBps,
            "steps": result.steps, "rounds": result.rounds, "chunks": result.chunks,
            "collective": self.request.collective, "topology": topo.name, "ranks": topo.num_ranks,
            "size_bytes": self.request.size_bytes, "symmetry_order": result.symmetry_order,
            "target": self.xml.target if self.xml else None, "method": self.chosen.label,
            "simulated_time_us": self.xml.simulated_us if self.xml else None, **self.comparison.to_dict(),
        }


def solve(request: SynthesisRequest, xml: XmlRequest | None = None, progress: Progress = lambda message: None
          ) -> Solution:
    """Every verified candidate for ``request``; with ``xml``, the fastest whose MSCCL file passes the verdict.

    >>> from synth.model.topology import load_topology
    >>> s = solve(SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20), XmlRequest())
    >>> s.xml.text.startswith("<algo"), s.comparison.percent_of_limit <= 100
    (True, True)
    """
    candidates = verified_candidates(request, progress)
    chosen, emitted = candidates[0], None
    if xml is not None:
        def refused(index: int, reason: str) -> None:
            progress(f"  {candidates[index].label} ({candidates[index].report.time_us:.2f} us) cannot be written: "
                     f"{reason}")

        emitted = emit_first_accepted([c.result.schedule for c in candidates], request.topology, xml.target,
                                      request.size_bytes, refused, proto=xml.proto, min_bytes=xml.min_bytes,
                                      max_bytes=xml.max_bytes)
        chosen = candidates[emitted.candidate]
    return Solution(request, tuple(candidates), chosen, emitted, compare_with_limits(request, chosen.report.time_us))


def step_model_text(solution: Solution, suffix: str) -> str:
    """The chosen step model as LP (``.lp``) or MPS (``.mps``) text, for other solvers (``--write-model``)."""
    result = solution.chosen.result
    schedule = result.schedule
    if schedule.collective.combining or schedule.method != "steps":
        raise InputError("--write-model", "", "model export covers the step formulation of non-combining "
                         "collectives; use --method steps with Allgather/Alltoall/Broadcast/Gather/Scatter")
    model = encode_steps(solution.request.topology, schedule.collective, result.steps, result.rounds).model
    fd, path = tempfile.mkstemp(suffix=suffix)
    os.close(fd)
    try:
        write_model(model, path)
        with open(path) as fh:
            return fh.read()
    finally:
        os.unlink(path)
