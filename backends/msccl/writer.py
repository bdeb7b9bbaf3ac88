"""The one way synth writes MSCCL XML: every file is lowered with its topology, rendered, read back and judged.

:func:`emit_verified_xml` lowers a schedule both ways (fused ``rcs``/``rrs`` chains, and plain separate
send/receive threadblocks, which are deadlock-free even with rendezvous sends), each fitted to the runtime's limits
and the GPU's SM count by :func:`backends.msccl.fit.fit_lowering` (connections spread over channels, contiguous
chunks merged into ``cnt > 1`` steps only as far as needed; a few wider spreads besides). The simulator times
each variant on the topology at the requested size (with the runtime's FIFO depth); variants are made lazily and
no more once none still to come could sort first (a sound bound from the schedule's link and port loads; the
command's deadline also stops them once one fits), and they are judged fastest
first (a fused one wins ties within 1%: fewer threadblocks, no cross-threadblock synchronisation; a file more
than :data:`BEHIND_PLAN` slower than its plan is also tried with each connection's messages in the plan's order):
the variant is rendered, the *text* is parsed back with our parser and judged by
:func:`backends.msccl.verdict.check_text` for the target, exactly as ``synth check`` judges a file (lexical rules,
runtime rules and limits, data-exact execution). The first that passes is returned. If none passes, nothing is returned:
:class:`~synth.errors.BackendError` when the program does not fit the runtime (a limit, or a rule of the target),
:class:`~synth.errors.VerificationError` when it is wrong (a bug).

Callers (``synth solve``, ``synth baseline -o``, the pareto bundle) write only what this returns
(:func:`write_verified_xml`).
"""

from __future__ import annotations

import functools
import gc
import itertools
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from synth.errors import BackendError, InputError, VerificationError
from synth.fileio import write_atomic
from synth.model.topology import Topology
from synth.schedule.ir import Schedule
from synth.schedule.costmodel import load_bound_us

from backends.msccl.ir import (LEGACY_UNKNOWN_COLLECTIVES, MAX_ATTR_LEN, NAME_ALPHABET, Gpu, MscclProgram, Step,
                               Threadblock)
from backends.msccl.limits import LIMIT_KINDS, MAX_CNT, MAX_XML_CHILDREN
from backends.msccl.fit import (Fit, Lowering, all_in_flight_channels, fit_lowering, fused_flow_fits,
                               has_multi_chunk_messages, hopeless,
                               in_flight_channels, iter_wider_fits, lowered_fit, measure, measured_wider_fits,
                               plain_too_long, unmerged_too_long, whole_message_fit, wider_channels)
from backends.msccl.floor import schedule_floor_us, unmerged_floor_us
from backends.msccl.gathered import finish_gathered
from backends.msccl.interpret import DEFAULT_RUNTIME_FIFO_DEPTH, RUNTIME_FIFO_DEPTH
from backends.msccl.lowering import DEFAULT_MAX_BYTES, PlannedOps, render_msccl_xml
from backends.msccl.simulate import simulate_program
from backends.msccl.verdict import check_text

TIE = 0.01
# A file this much slower than its plan is also lowered with each connection's messages in the plan's order
# (:func:`_in_link_order`).
BEHIND_PLAN = 0.002
# A file this much slower than its plan is also lowered on more channels, measured until the SMs are full
# (:func:`_wider_when_behind`): its connections' messages wait behind the runtime's FIFO.
FAR_BEHIND_PLAN = 0.05
SAME = 1e-9     # relative difference of simulated times that is rounding, not speed


@dataclass(frozen=True)
class EmittedXml:
    """Text that passed the verdict for ``target``, with what it was made of.

    ``candidate`` is the index of the schedule used (:func:`emit_first_accepted`; 0 otherwise).
    ``variants_cut``: the deadline stopped the variants early, so a faster file of the schedule may exist.
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
    variants_cut: bool = False   # the deadline stopped the variants before every one that could win was made


class Expiry(Protocol):
    """When to stop optional work (:class:`synth.solver.deadline.Deadline` is one; backends do not import it)."""

    @property
    def expired(self) -> bool: ...


def _quiet(message: str) -> None:
    """No progress wanted."""


def _collector_paused(function):
    """Run ``function`` with Python's cyclic garbage collector paused (as it was before, after it).

    Writing a program makes millions of objects that hold no reference cycles (ops, steps, events), and each of the
    collector's full passes walks all of them: a fifth of the writer's CPU time at 256 and 512 GPUs. Reference
    counting still frees them; cycles made meanwhile wait for the next pass."""
    @functools.wraps(function)
    def paused(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return paused


@_collector_paused
def emit_verified_xml(schedule: Schedule, topology: Topology, target: str = "executor",
                      size_bytes: int | None = None, *, proto: str = "Simple", name: str | None = None,
                      min_bytes: int = 0, max_bytes: int = DEFAULT_MAX_BYTES, deadline: Expiry | None = None,
                      plan_us: float | None = None, progress: Callable[[str], None] = _quiet) -> EmittedXml:
    """Lower both ways with the topology, fitted; judge the fastest as ``synth check`` does; return the first that
    passes.

    Variants are made lazily, unmerged fused ones first (:func:`_variants`), and no more are made once none still
    to come can beat the fastest simulated so far: none simulates faster than the schedule's link and port loads
    allow (:func:`~backends.msccl.floor.schedule_floor_us`, whatever the channels and merging; for variants that send
    each transfer as its own message, its pipeline's fill and drain too, :func:`~backends.msccl.floor.unmerged_floor_us`),
    so a variant that simulates at that bound is not beaten, and a plain one must beat an unmerged fused one by
    :data:`TIE`. Once
    ``deadline`` (a :class:`synth.solver.deadline.Deadline`) has expired no further variant is made once one fits;
    the others are made only when every one made fails its verdict.

    ``plan_us``, the schedule's own replayed time at ``size_bytes`` (whole chunks, store-and-forward), bounds the
    variants with merged steps too: a relay forwards a merged message only once all of it has arrived, so merging
    never gets a chunk anywhere sooner than the plan; they are made only when the best variant is more than
    :data:`TIE` slower than that (:func:`_settled`).

    ``progress`` hears each phase (fitting a lowering, simulating, checking a variant): at 1024 GPUs each takes
    minutes.
    """
    if topology is None:
        raise BackendError("MSCCL XML is lowered with its topology (switch-port order); none was given")
    if schedule.gathered:
        return _emit_gathered(schedule, topology, target, size_bytes, proto=proto, name=name, min_bytes=min_bytes,
                              max_bytes=max_bytes, deadline=deadline, plan_us=plan_us, progress=progress)
    _check_collective_known(schedule, target)
    failures: list[tuple[str, bool]] = []     # (reason, is a limit of the runtime)
    planned = PlannedOps(schedule)     # every variant lowers the same per-rank ops (planned once per mode)
    reason = hopeless(schedule, topology, target, layout=planned.layout)
    if reason is not None:
        raise BackendError(f"refusing to write MSCCL XML for the {target} runtime: {reason}")
    options = dict(proto=proto, name=name, min_bytes=min_bytes, max_bytes=max_bytes, planned=planned)
    plain_long = plain_too_long(schedule)
    variants = _variants(schedule, topology, target, failures, options,
                         whole_messages=bool(size_bytes) and _alpha_bound(schedule, topology, size_bytes),
                         progress=progress, plain_long=plain_long)
    floors = _Floors(schedule, topology, size_bytes)     # no program of the schedule simulates faster
    timed: list[tuple[tuple, float | None, Fit]] = []    # (sort key, simulated us, fit), not yet judged
    programs: list[MscclProgram] = []                     # every program timed (the same one is not timed twice)
    exhausted, first_round, cut = False, True, False
    # where plain steps fit only merged, the fused lowering in link order is made before them (it may settle the
    # choice: 2 x dgx2 Reduce 1 GB, 2048 chunks, a fit search for merged plain steps of 75 s that could not win)
    order_early = bool(size_bytes) and plain_long
    while not exhausted:
        for fit, later in variants:
            if any(fit.program == p for p in programs):
                continue
            programs.append(fit.program)
            if size_bytes:
                progress(f"    simulating the {fit.lowering.label} lowering ({fit.program.num_steps} steps)")
            time_us = _simulated_us(fit.program, topology, size_bytes)
            timed.append((_sort_key(time_us, fit.lowering), time_us, fit))
            if first_round and order_early:
                ordered = _in_link_order(schedule, topology, target, timed, plan_us, options)
                if ordered is not None and not any(ordered.program == p for p in programs):
                    programs.append(ordered.program)
                    progress(f"    simulating the {ordered.lowering.label} lowering")
                    ordered_us = _simulated_us(ordered.program, topology, size_bytes)
                    timed.append((_sort_key(ordered_us, ordered.lowering), ordered_us, ordered))
            expired = deadline is not None and deadline.expired
            settled = first_round and _settled(timed, floors, later, plan_us)
            if first_round and (expired or settled):
                cut = expired and not settled
                break
        else:
            exhausted = True
        if first_round and size_bytes:
            ordered = _in_link_order(schedule, topology, target, timed, plan_us, options)
            late = itertools.chain([] if ordered is None else [ordered],
                                   _wider_when_behind(schedule, topology, target, timed, plan_us, options, progress))
            for fit in late:
                if deadline is not None and deadline.expired:
                    break
                if not any(fit.program == p for p in programs):
                    programs.append(fit.program)
                    time_us = _simulated_us(fit.program, topology, size_bytes)
                    timed.append((_sort_key(time_us, fit.lowering), time_us, fit))
        first_round = False    # every variant made so far failed its verdict: judge all the others
        timed.sort(key=lambda entry: entry[0])
        while timed:
            _, time_us, fit = timed.pop(0)
            progress(f"    checking the {fit.lowering.label} lowering as synth check does (render, parse, lint, "
                     "execute)")
            emitted, failure = _judge(fit, topology, target, time_us)
            if emitted is None and fit.lowering.max_cnt > 1:   # merged steps that wait too long: merge strictly
                strict = fit_lowering(schedule, topology, target, fit.lowering.fuse, strict_merge=True, **options)
                if strict.fits:
                    emitted, failure = _judge(strict, topology, target,
                                              _simulated_us(strict.program, topology, size_bytes))
            if emitted is not None:
                return replace(emitted, variants_cut=cut)
            failures.append(failure)
    if all(limit for _, limit in failures):
        raise BackendError(f"refusing to write MSCCL XML for the {target} runtime: {failures[-1][0]}")
    raise VerificationError("the lowered MSCCL program " + " / ".join(reason for reason, _ in failures))


def _emit_gathered(schedule: Schedule, topology: Topology, target: str, size_bytes: int | None, *, name: str | None,
                   progress: Callable[[str], None], **options) -> EmittedXml:
    """A gathered schedule's file (:mod:`backends.msccl.gathered`): the fastest verified file of the Allgather its
    transfers move (at n times the size: the same bytes), made the Allreduce's or Alltoall's and judged again as
    ``synth check`` does, postcondition and all. Its local steps take no time in the simulator, so the
    Allgather's choice of lowering is the gathered file's."""
    what = schedule.gathered.capitalize()
    stage = replace(schedule, gathered="")
    emitted = emit_verified_xml(stage, topology, target, size_bytes and int(schedule.moved_size(size_bytes)),
                                progress=progress, **options)
    try:
        program = finish_gathered(emitted.program, schedule.gathered, name)
    except BackendError as exc:
        raise BackendError(f"refusing to write MSCCL XML for the {target} runtime: {exc}") from None
    fit = measure(program, emitted.lowering, target, topology.sms_per_gpu)
    if not fit.fits:
        raise BackendError(f"refusing to write MSCCL XML for the {target} runtime: the gathered {what}'s "
                           f"local steps break a limit: {fit.reason()}")
    progress(f"    checking the gathered {what} as synth check does (render, parse, lint, execute)")
    made, failure = _judge(fit, topology, target, _simulated_us(program, topology, size_bytes))
    if made is None:
        raise VerificationError(f"the gathered {what}'s program {failure[0]}")
    return replace(made, variants_cut=emitted.variants_cut)


def _variants(schedule: Schedule, topology: Topology, target: str, failures: list[tuple[str, bool]],
              options: dict, whole_messages: bool = True, progress: Callable[[str], None] = _quiet,
              plain_long: bool = False) -> Iterator[tuple[Fit, tuple[Lowering, ...]]]:
    """The fitted lowerings, each with the kinds of lowering that may still come after it (for :func:`_settled`):
    fused without merging (each fit, then its wider spreads), plain, then fused with merged steps only when the
    unmerged fused one does not fit, and last each step's chunks between two peers as one message
    (:func:`~backends.msccl.fit.whole_message_fit`, fused then plain; with ``whole_messages``, where alphas
    dominate: :func:`_alpha_bound`, which also tries plain sends and receives on the channels that keep every
    message of a connection in flight, :func:`~backends.msccl.fit.in_flight_channels`). A merged fused program wins no ties (:func:`_favoured`), so it is searched for
    late: on dgx1 tree packings a dozen fused lowerings that never fit came before the plain one that does (20 s of
    a 30 s solve). A lowering that cannot fit is recorded in ``failures``."""
    whole = tuple(Lowering(fuse, 1, MAX_CNT, per_message=True) for fuse in (True, False)
                  ) if whole_messages and has_multi_chunk_messages(schedule) else ()
    fitting = functools.partial(_fitting, schedule, topology, target, progress=progress, **options)
    unmerged = None if unmerged_too_long(schedule, target) else fitting(True, most_cnt=1)
    if unmerged and unmerged.program is not None:
        _check_name(unmerged.program.name)
    merged_may_come = () if unmerged and unmerged.fits else (Lowering(True, max_cnt=2),)
    # (a plain lowering too long for the XML reader, ``plain_long``, comes only merged: no faster than the plan)
    plain_may_come = Lowering(False, max_cnt=2) if plain_long else Lowering(False)
    if unmerged and unmerged.fits:
        yield from _with_spreads(schedule, topology, target, unmerged, (plain_may_come,) + whole, options)
    if plain_long:      # unmerged plain steps, with a few flows fused to fit the XML reader
        progress("    fusing flows of the plain lowering to fit the runtimes' XML reader")
        for fit in fused_flow_fits(schedule, topology, target, **options):
            yield fit, (plain_may_come,) + merged_may_come + whole
    plain = fitting(False)
    _check_name(plain.program.name)
    if plain.fits:
        fifo_depth = RUNTIME_FIFO_DEPTH.get(options["proto"], DEFAULT_RUNTIME_FIFO_DEPTH)
        channels = in_flight_channels(schedule, topology, plain, fifo_depth) if whole_messages else None
        # where alphas dominate, also each connection on the channels that keep its messages past the FIFO
        in_flight = replace(plain.lowering, channels=all_in_flight_channels(schedule, fifo_depth), balanced=False,
                            in_flight=True) if whole_messages and plain.lowering.max_cnt == 1 else None
        wide_lowerings = tuple(lowering for lowering in (
            replace(plain.lowering, channels=channels) if channels is not None else None, in_flight) if lowering)
        # (they still come: without them a plain lowering that settles nothing else cut them off, and TE-CCL's
        # two DGX-2 nodes' routed Allgather 1 KB, 16 messages per network link, kept a fused file at 5.92 us
        # where plain in flight runs as planned, 3.30 us)
        yield from _with_spreads(schedule, topology, target, plain, wide_lowerings + merged_may_come + whole,
                                 options)
        for k, lowering in enumerate(wide_lowerings):
            wide = lowered_fit(schedule, topology, target, lowering, **options)
            if wide.fits:
                yield wide, wide_lowerings[k + 1:] + merged_may_come + whole
    else:
        failures.append((f"{plain.lowering.label} lowering breaks a runtime rule: {plain.reason()}", True))
    if not (unmerged and unmerged.fits):
        merged = fitting(True)
        if merged.fits:
            yield from _with_spreads(schedule, topology, target, merged, whole, options)
        else:
            failures.append((f"{merged.lowering.label} lowering breaks a runtime rule: {merged.reason()}", True))
    for k, lowering in enumerate(whole):
        fit = whole_message_fit(schedule, topology, target, lowering.fuse, **options)
        if fit is not None:
            yield fit, whole[k + 1:]


def _fitting(schedule: Schedule, topology: Topology, target: str, fuse: bool, progress: Callable[[str], None],
             **options) -> Fit:
    """:func:`~backends.msccl.fit.fit_lowering`, announced."""
    merging = "" if options.get("most_cnt") == 1 else ", merging steps if it must"
    progress(f"    fitting the {'fused' if fuse else 'plain'} lowering to the {target} runtime's limits "
             f"({len(schedule.transfers)} transfers{merging})")
    return fit_lowering(schedule, topology, target, fuse, **options)


def _in_link_order(schedule: Schedule, topology: Topology, target: str, timed: list, plan_us: float | None,
                   options: dict) -> Fit | None:
    """The fastest variant timed so far lowered again with each connection's messages in the schedule's order
    across its channels (:func:`~backends.msccl.lowering._order_connections`), when it simulates more than
    :data:`BEHIND_PLAN` slower than the plan (``plan_us``) and that lowering fits; else None. Where channels let a
    rank's own data overtake the partial sums it relays, the file falls behind its plan (dgx1 Reduce 1 GB: 0.7%;
    in order, as planned); elsewhere the extra waits only cost, so it is not made."""
    if plan_us is None or not timed:
        return None
    _, best_us, best = min(timed, key=lambda entry: entry[0])
    lowering = best.lowering
    if best_us is None or best_us <= plan_us * (1 + BEHIND_PLAN) or lowering.per_message or lowering.in_link_order:
        return None
    lowering = replace(lowering, in_link_order=True)
    fit = lowered_fit(schedule, topology, target, lowering, **options)
    return fit if fit.fits else None


def _wider_when_behind(schedule: Schedule, topology: Topology, target: str, timed: list, plan_us: float | None,
                       options: dict, progress: Callable[[str], None] = _quiet) -> Iterator[Fit]:
    """The fastest variant timed so far on more channels, measured until the SMs are full
    (:func:`~backends.msccl.fit.measured_wider_fits`), when it simulates more than :data:`FAR_BEHIND_PLAN` slower
    than its plan (``plan_us``): messages that queue behind the runtime's FIFO, which the plan does not model, are
    in flight on more channels. Lazily, so the caller times each before the next is lowered."""
    if plan_us is None or not timed:
        return
    _, best_us, best = min(timed, key=lambda entry: entry[0])
    if best_us is None or best_us <= plan_us * (1 + FAR_BEHIND_PLAN) or best.lowering.per_message:
        return
    progress(f"    the {best.lowering.label} lowering simulates {100 * (best_us / plan_us - 1):.0f}% behind its plan: "
             "trying more channels")
    yield from measured_wider_fits(schedule, topology, target, best, **options)


def _alpha_bound(schedule: Schedule, topology: Topology, size_bytes: int) -> bool:
    """Whether the schedule's busiest link or port is busy at ``size_bytes`` for less than the largest alpha it
    pays (:func:`~synth.schedule.costmodel.load_bound_us` without latency): then whole messages (one alpha each)
    can beat chunks that pay it again and again; beyond, the pipelining the fit search keeps is worth more."""
    alpha_us = max((topology.link(t.src, t.dst).alpha_us for t in schedule.transfers), default=0.0)
    busy_us = load_bound_us(((t.src, t.dst) for t in schedule.transfers), topology,
                            schedule.collective.chunk_bytes(size_bytes), MAX_CNT, latency=False)
    return busy_us < alpha_us


def _with_spreads(schedule: Schedule, topology: Topology, target: str, fit: Fit, later: tuple[Lowering, ...],
                  options: dict) -> Iterator[tuple[Fit, tuple[Lowering, ...]]]:
    """``fit`` and its wider spreads, each with what may still come after it: the wider ones, then ``later``."""
    wider = tuple(replace(fit.lowering, channels=c) for c in wider_channels(topology, fit))
    yield fit, wider + later
    for variant in iter_wider_fits(schedule, topology, target, fit, **options):
        yield variant, tuple(w for w in wider if w.channels > variant.lowering.channels) + later


def _sort_key(time_us: float | None, lowering: Lowering) -> tuple:
    """Fastest first; a plain variant must be clearly faster to beat a fused one (fewer tbs, no cross-tb waits)
    unless the fused one merged steps (its pipelining already cost what the simulator shows); then fewer
    channels."""
    effective = 0.0 if time_us is None else time_us * (1 - TIE) if _favoured(lowering) else time_us
    return (effective, not lowering.fuse, lowering.channels)


def _settled(timed: list, floors: _Floors, later: tuple[Lowering, ...], plan_us: float | None = None) -> bool:
    """Whether no variant still to come (of the kinds ``later``) can be chosen for being faster than the best
    timed: none simulates faster than the schedule's floor (:func:`~backends.msccl.floor.schedule_floor_us`; one
    that sends each transfer as its own message, no faster than :func:`~backends.msccl.floor.unmerged_floor_us`,
    asked for only when the first does not settle it), and none with merged steps faster than ``plan_us`` either
    (when given), which they are not worth lowering for unless the best is more than :data:`TIE` slower (a
    merged program trades pipelining for fitting: dgx1 Broadcast 1 GB, plain 0.02% slower than planned, merged
    51%). Equal times settle it, up to the simulator's rounding (a variant as fast is not worth another
    lowering)."""
    best = min(entry[0][0] for entry in timed)

    def beaten(lowering: Lowering, floor_us: float) -> bool:
        return best <= _sort_key(floor_us, lowering)[0] * (1 + SAME)

    merged_floor_us = max(floors.any_us, (plan_us or 0.0) * (1 + TIE))
    # the unmerged floor is never above the plan (the replay is one timing it bounds): not worth making otherwise
    return all(beaten(lowering, merged_floor_us) if lowering.max_cnt > 1 else
               beaten(lowering, floors.any_us) or ((plan_us is None or beaten(lowering, plan_us))
                                                   and beaten(lowering, floors.unmerged_us)) for lowering in later)


class _Floors:
    """The schedule's floors at ``size_bytes`` (:mod:`backends.msccl.floor`), each computed when first asked for
    (0 without a size: nothing is timed then)."""

    def __init__(self, schedule: Schedule, topology: Topology, size_bytes: int | None):
        self.schedule, self.topology, self.size_bytes = schedule, topology, size_bytes

    @functools.cached_property
    def any_us(self) -> float:
        return schedule_floor_us(self.schedule, self.topology, self.size_bytes) if self.size_bytes else 0.0

    @functools.cached_property
    def unmerged_us(self) -> float:
        return unmerged_floor_us(self.schedule, self.topology, self.size_bytes) if self.size_bytes else 0.0


def _favoured(lowering: Lowering) -> bool:
    """Whether a variant wins simulated ties within :data:`TIE`: a fused lowering that merged no steps (dgx2
    Broadcast 1 GB: fused with ``cnt <= 2`` simulated 0.7% slower than plain with ``cnt = 1`` and was chosen)."""
    return lowering.fuse and lowering.max_cnt == 1


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
    parsed = [r.program for r in report.algos]
    if len(parsed) != 1 or not same_program(parsed[0], program):   # the text says something else: never written
        return None, (f"{label} lowering reads back as a different program", False)
    parsed = program     # equal but for source lines, as a generated program has them
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
    check_target_holds(schedule.collective.num_ranks, target)


def check_target_holds(num_ranks: int, target: str) -> None:
    """Refuse, before any work, more GPUs than the runtimes' XML reader holds in one algorithm
    (:data:`~backends.msccl.limits.MAX_XML_CHILDREN`)."""
    if num_ranks > MAX_XML_CHILDREN:
        raise BackendError(f"{num_ranks} GPUs: the {target} runtime's XML reader holds at most {MAX_XML_CHILDREN} "
                           "<gpu> elements in an <algo> (MAX_SUBS; more overwrite its memory), so no MSCCL file "
                           "for this machine can load")


def check_target_knows(name: str, target: str) -> None:
    """Refuse, before any work, a collective the target runtime's loader does not know (legacy: gather,
    scatter)."""
    if target == "legacy" and name in LEGACY_UNKNOWN_COLLECTIVES:
        raise BackendError(f"the legacy runtime knows no {name} (its loader refuses the file); write it for the "
                           "executor (--target executor)")


def write_verified_xml(path: str | Path, emitted: EmittedXml) -> None:
    """Write text that :func:`emit_verified_xml` returned, atomically."""
    write_atomic(Path(path), emitted.text)


def _compared(cls, *children: str):
    """A getter of a program part's own fields: every dataclass field but its children and its source line."""
    return attrgetter(*(f.name for f in fields(cls) if f.name not in (*children, "line")))


_PROGRAM_FIELDS = _compared(MscclProgram, "gpus")
_GPU_FIELDS = _compared(Gpu, "tbs")
_TB_FIELDS = _compared(Threadblock, "steps")
_STEP_FIELDS = _compared(Step)


def same_program(a: MscclProgram, b: MscclProgram) -> bool:
    """Whether two programs say the same but for source lines (compared field by field, without
    building copies)."""
    if _PROGRAM_FIELDS(a) != _PROGRAM_FIELDS(b) or len(a.gpus) != len(b.gpus):
        return False
    for ga, gb in zip(a.gpus, b.gpus):
        if _GPU_FIELDS(ga) != _GPU_FIELDS(gb) or len(ga.tbs) != len(gb.tbs):
            return False
        for ta, tb in zip(ga.tbs, gb.tbs):
            if _TB_FIELDS(ta) != _TB_FIELDS(tb) or len(ta.steps) != len(tb.steps):
                return False
            if list(map(_STEP_FIELDS, ta.steps)) != list(map(_STEP_FIELDS, tb.steps)):
                return False
    return True
