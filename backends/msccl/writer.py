"""Emit MSCCL XML that has been executed, not just generated.

Both lowerings of a schedule (fused ``rcs``/``rrs`` chains, and plain separate send/receive threadblocks, which
are deadlock-free even with rendezvous sends; spread over more channels when a connection has more messages
than a threadblock may hold steps) are run by the step-level interpreter (exact data, deadlock and
race checks). Of those that pass and respect the runtime limits, the one the simulator times fastest on the
topology at the requested size (with the runtime's FIFO depth) is returned; the fused one wins ties within 1%
(fewer threadblocks and no cross-threadblock synchronisation). If neither passes it is a bug, and nothing is
written.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.msccl.lowering import channels_needed, check_limits, lower_to_msccl, render_msccl_xml

from synth.errors import BackendError, VerificationError
from backends.msccl.interpret import execute_program
from synth.schedule.ir import Schedule
from backends.msccl.simulate import simulate_program

TIE = 0.01


@dataclass(frozen=True)
class EmittedXml:
    text: str
    fused: bool
    threadblocks: int
    channels: int
    simulated_us: float | None   # with the runtime's FIFO depth; None without a topology


def emit_verified_xml(schedule: Schedule, target: str = "executor", topology=None, size_bytes: int | None = None,
                      **lower_options) -> EmittedXml:
    """Lower both ways, check limits, execute, time; return the best variant that passes."""
    failures, passing = [], []
    variants = [(True, 1), (False, 1)]
    for fuse, channels in variants:
        program = lower_to_msccl(schedule, topology=topology, target=target, fuse=fuse, channels=channels,
                                 **lower_options)
        limits = check_limits(program, target)
        if limits and not fuse and channels == 1 and channels_needed(program, target) > 1:
            variants.append((False, channels_needed(program, target) + 1))  # +1: round robin is not exact
        if limits:
            failures.append("breaks a runtime limit: " + "; ".join(limits[:3]))
            continue
        result = execute_program(program)
        if not result.ok:
            errors = [str(f) for f in result.findings if f.severity == "error"]
            failures.append(f"{'fused' if fuse else 'plain'} lowering fails execution: " + "; ".join(errors[:2]))
            continue
        time_us = simulate_program(program, topology, size_bytes).time_us if topology and size_bytes else None
        passing.append(EmittedXml(render_msccl_xml(program), fuse, sum(len(g.tbs) for g in program.gpus),
                                  program.nchannels, time_us))
    if not passing:
        if all("runtime limit" in f for f in failures):
            raise BackendError(f"refusing to write MSCCL XML that {failures[-1]}")
        raise VerificationError("the lowered MSCCL program " + " / ".join(failures))
    best = passing[0]
    for other in passing[1:]:   # a later (plain) variant must be clearly faster to beat the fused one
        if other.simulated_us is not None and best.simulated_us is not None \
                and other.simulated_us < best.simulated_us * (1 - TIE):
            best = other
    return best
