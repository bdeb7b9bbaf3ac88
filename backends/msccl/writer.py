"""The one way synth writes MSCCL XML: every file is lowered with its topology, rendered, read back and judged.

:func:`emit_verified_xml` lowers a schedule both ways (fused ``rcs``/``rrs`` chains, and plain separate
send/receive threadblocks, which are deadlock-free even with rendezvous sends), each fitted to the runtime's limits
and the GPU's SM count by :func:`backends.msccl.fit.fit_lowering` (connections spread over channels, contiguous
chunks merged into ``cnt > 1`` steps only as far as needed; a few wider spreads besides). The simulator times
every variant on the topology at the requested size (with the runtime's FIFO depth), and they are judged fastest
first (a fused one wins ties within 1%: fewer threadblocks, no cross-threadblock synchronisation): the variant is
rendered, the *text* is parsed back with our parser and judged by :func:`backends.msccl.verdict.check_text` for
the target, exactly as ``synth check`` judges a file (lexical rules, runtime rules and limits, data-exact
execution). The first that passes is returned. If none passes, nothing is returned:
:class:`~synth.errors.BackendError` when the program does not fit the runtime (a limit, or a rule of the target),
:class:`~synth.errors.VerificationError` when it is wrong (a bug).

Callers (``synth solve``, ``synth baseline -o``, the pareto bundle) write only what this returns
(:func:`write_verified_xml`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from synth.errors import BackendError, InputError, VerificationError
from synth.fileio import write_atomic
from synth.model.topology import Topology
from synth.schedule.ir import Schedule

from backends.msccl.ir import LEGACY_UNKNOWN_COLLECTIVES, MAX_ATTR_LEN, NAME_ALPHABET, MscclProgram
from backends.msccl.limits import LIMIT_KINDS
from backends.msccl.fit import Fit, Lowering, fit_lowering, hopeless, wider_fits
from backends.msccl.lowering import DEFAULT_MAX_BYTES, render_msccl_xml
from backends.msccl.simulate import simulate_program
from backends.msccl.verdict import check_text

TIE = 0.01


@dataclass(frozen=True)
class EmittedXml:
    """Text that passed the verdict for ``target``, with what it was made of.

    ``candidate`` is the index of the schedule used (:func:`emit_first_accepted`; 0 otherwise).
    """

    text: str
    program: MscclProgram
    target: str
    fused: bool
    threadblocks: int
    channels: int
    simulated_us: float | None   # with the runtime's FIFO depth; None without a size
    candidate: int = 0
    lowering: Lowering | None = None


def emit_verified_xml(schedule: Schedule, topology: Topology, target: str = "executor",
                      size_bytes: int | None = None, *, proto: str = "Simple", name: str | None = None,
                      min_bytes: int = 0, max_bytes: int = DEFAULT_MAX_BYTES) -> EmittedXml:
    """Lower both ways with the topology, fitted; judge the fastest as ``synth check`` does; return the first that
    passes."""
    if topology is None:
        raise BackendError("MSCCL XML is lowered with its topology (switch-port order); none was given")
    _check_collective_known(schedule, target)
    failures: list[tuple[str, bool]] = []     # (reason, is a limit of the runtime)
    reason = hopeless(schedule, topology)
    if reason is not None:
        raise BackendError(f"refusing to write MSCCL XML for the {target} runtime: {reason}")
    options = dict(proto=proto, name=name, min_bytes=min_bytes, max_bytes=max_bytes)
    fits: list[Fit] = []
    for fuse in (True, False):
        fit = fit_lowering(schedule, topology, target, fuse, **options)
        _check_name(fit.program.name)
        if fit.fits:
            fits += wider_fits(schedule, topology, target, fit, **options)
        else:
            failures.append((f"{fit.lowering.label} lowering breaks a runtime rule: {fit.reason()}", True))
    timed = [(_simulated_us(fit.program, topology, size_bytes), fit) for fit in fits]
    # fastest first; a plain variant must be clearly faster to beat a fused one (fewer tbs, no cross-tb waits),
    # unless the fused one merged steps (its pipelining already cost what the simulator shows)
    timed.sort(key=lambda pair: (pair[0] * (1 - TIE) if _favoured(pair[1]) and pair[0] is not None
                                 else pair[0] or 0.0, not pair[1].lowering.fuse, pair[1].lowering.channels))
    for time_us, fit in timed:
        emitted, failure = _judge(fit, topology, target, time_us)
        if emitted is None and fit.lowering.max_cnt > 1:   # merged steps that wait too long: merge strictly
            strict = fit_lowering(schedule, topology, target, fit.lowering.fuse, strict_merge=True, **options)
            if strict.fits:
                emitted, failure = _judge(strict, topology, target,
                                          _simulated_us(strict.program, topology, size_bytes))
        if emitted is not None:
            return emitted
        failures.append(failure)
    if all(limit for _, limit in failures):
        raise BackendError(f"refusing to write MSCCL XML for the {target} runtime: {failures[-1][0]}")
    raise VerificationError("the lowered MSCCL program " + " / ".join(reason for reason, _ in failures))


def _favoured(fit: Fit) -> bool:
    """Whether ``fit`` wins simulated ties within :data:`TIE`: a fused lowering that merged no steps (dgx2
    Broadcast 1 GB: fused with ``cnt <= 2`` simulated 0.7% slower than plain with ``cnt = 1`` and was chosen)."""
    return fit.lowering.fuse and fit.lowering.max_cnt == 1


def _simulated_us(program, topology: Topology, size_bytes: int | None) -> float | None:
    """The simulator's time with the runtime's FIFO depth; None without a size, inf when it does not finish
    (the verdict then says why)."""
    if not size_bytes:
        return None
    try:
        return simulate_program(program, topology, size_bytes).time_us
    except VerificationError:
        return float("inf")


def _judge(fit: Fit, topology: Topology, target: str, time_us: float | None
           ) -> tuple[EmittedXml | None, tuple[str, bool]]:
    """Render a fitted program (timed at ``time_us``), judge the text as ``synth check`` does; or say why it
    failed."""
    label = fit.lowering.label
    program = fit.program
    text = render_msccl_xml(program)
    try:
        report = check_text(text, f"<{label} lowering>", target, sms=topology.sms_per_gpu)
    except InputError as exc:   # our own text does not parse back: a bug, never written
        return None, (f"{label} lowering does not parse back: {exc}", False)
    errors = report.errors()
    if errors:
        limit = any(f.kind in LIMIT_KINDS or f.runtimes != ("executor", "legacy") for f in errors)
        what = "breaks a runtime rule" if limit else "fails its check"
        return None, (f"{label} lowering {what}: " + "; ".join(str(f) for f in errors[:3]), limit)
    parsed = [without_lines(r.program) for r in report.algos]
    if parsed != [program]:   # the text says something else than the program: never written
        return None, (f"{label} lowering reads back as a different program", False)
    [parsed] = parsed
    return EmittedXml(text, parsed, target, fit.lowering.fuse, sum(len(g.tbs) for g in parsed.gpus),
                      parsed.nchannels, time_us, lowering=fit.lowering), ("", False)


def _check_name(name: str) -> None:
    unsafe = sorted(set(name) - NAME_ALPHABET)
    if unsafe or len(name) > MAX_ATTR_LEN:
        raise BackendError(f"algorithm name {name!r} holds characters the MSCCL lexers cannot take "
                           f"({''.join(unsafe)!r}) or is over {MAX_ATTR_LEN} characters; use letters, digits "
                           "and _-.,:=+()")


def emit_first_accepted(schedules: Sequence[Schedule], topology: Topology, target: str = "executor",
                        size_bytes: int | None = None,
                        on_refusal: Callable[[int, str], None] = lambda index, reason: None, *,
                        proto: str = "Simple", min_bytes: int = 0, max_bytes: int = DEFAULT_MAX_BYTES) -> EmittedXml:
    """The first of ``schedules`` (callers order them fastest first) whose XML the runtime accepts and the
    verdict passes; ``on_refusal(index, reason)`` hears about each one skipped."""
    refusals = []
    if schedules:   # every candidate is the same collective: refuse once, with the reason
        _check_collective_known(schedules[0], target)
    for index, schedule in enumerate(schedules):
        try:
            emitted = emit_verified_xml(schedule, topology, target, size_bytes, proto=proto, min_bytes=min_bytes,
                                        max_bytes=max_bytes)
        except BackendError as exc:
            refusals.append(f"candidate {index + 1}: {exc}")
            on_refusal(index, str(exc))
            continue
        return replace(emitted, candidate=index)
    raise BackendError("no candidate fits the runtime's limits: " + "; ".join(refusals))


def _check_collective_known(schedule: Schedule, target: str) -> None:
    check_target_knows(schedule.collective.name, target)


def check_target_knows(name: str, target: str) -> None:
    """Refuse, before any work, a collective the target runtime's loader does not know (legacy: gather,
    scatter)."""
    if target == "legacy" and name in LEGACY_UNKNOWN_COLLECTIVES:
        raise BackendError(f"the legacy runtime knows no {name} (its loader refuses the file); write it for the "
                           "executor (--target executor)")


def write_verified_xml(path: str | Path, emitted: EmittedXml) -> None:
    """Write text that :func:`emit_verified_xml` returned, atomically."""
    write_atomic(Path(path), emitted.text)


def without_lines(program: MscclProgram) -> MscclProgram:
    """The program with every source line set to 0, as a generated one has them, to compare with a parsed one."""
    gpus = tuple(replace(g, line=0, tbs=tuple(replace(tb, line=0, steps=tuple(replace(st, line=0) for st in tb.steps))
                                              for tb in g.tbs)) for g in program.gpus)
    return replace(program, line=0, gpus=gpus)
