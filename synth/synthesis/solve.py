"""``synth solve`` as a library call: the whole pipeline for one request, from candidates to a verified file.

:func:`solve` takes a :class:`~synth.synthesis.request.SynthesisRequest` and gathers every verified candidate
(:func:`synth.synthesis.select.verified_candidates`, ordered by replayed time). The simulator is the arbiter
(DESIGN section 6): each candidate is written as MSCCL XML through the one verified writer
(:mod:`backends.msccl.writer`: lowered with the topology, parsed back, linted and executed as ``synth check``
does) and timed by the discrete-event simulator with the runtime's FIFO depth and switch-port sharing. The
fastest *simulated* file wins, and its simulated time is the figure reported; the replay stays as the plan's
own time. Candidates whose replay (optimistic: unbounded buffers, no port contention order) is already slower
than the best simulated time are not written. The best baseline the runtime selects always competes, so the
plan is never slower than what the runtime would run anyway (with a sketch too: the summary says so when it
falls back). Texts are returned, never files: the command commits them together
(:class:`synth.fileio.OutputPlan`).

Under a deadline (``request.deadline``, ``synth solve --time-limit``) the search stops at the request's search
deadline (phases that cannot start are skipped, HiGHS calls get the time left), and candidates are written
fastest first until the command's deadline passes: the best verified file found by then is the answer, and the
solution says that the time limit cut the search (:attr:`Solution.time_limited`). With nothing verified by then,
the smallest program is still written; a caller that must stop (the CLI, after a grace:
:func:`synth.solver.deadline.hard_stop_s`) raises :class:`~synth.solver.deadline.DeadlinePassed` into the writing,
and the files verified before it are the answer (none: :class:`~synth.errors.NoSolutionError`).

Writing is the slow part at cluster scale (minutes per candidate at 64-256 GPUs), and each write is independent:
with an executor (``synth solve --workers N`` or ``--scheduler``, :mod:`synth.synthesis.parallel`) candidates are
written ahead, several at once, while the loop above still takes each file in its own order and applies its own
rule, so the choice and the file are those of the one-by-one run. At the deadline, writes still running are
dropped; files written ahead by then count.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from backends.msccl.floor import chain_floor_us, schedule_floor_us
from backends.msccl.lowering import DEFAULT_MAX_BYTES
from backends.msccl.writer import EmittedXml, check_target_holds, check_target_knows, emit_verified_xml
from synth.errors import BackendError, InputError, NoSolutionError, VerificationError
from synth.schedule.costmodel import algbw_GBps
from synth.solver.deadline import Deadline, DeadlinePassed, grace_s
from synth.solver.highs import Status
from synth.formulations.steps import encode_steps
from synth.solver.highs import write_model
from synth.synthesis.baselines import BaselineRun
from synth.synthesis.comparison import LimitComparison, compare_with_limits
from synth.synthesis.method import Method
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import (TREES_AT_LIMIT, TREES_LABEL, Candidate, timed_phase, tree_fallback_candidates,
                                    verified_candidates)
from synth.synthesis.steps import SynthesisResult

Progress = Callable[[str], None]


@dataclass(frozen=True)
class XmlRequest:
    """What the MSCCL file should say besides the request's runtime target: protocol and size range (bytes)."""

    proto: str = "Simple"
    min_bytes: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class WrittenCandidate:
    """A candidate with its verified MSCCL file and that file's simulated time (us)."""

    candidate: Candidate
    xml: EmittedXml

    @property
    def simulated_us(self) -> float:
        return self.xml.simulated_us


@dataclass(frozen=True)
class Solution:
    """The chosen candidate (fastest simulated file), every candidate considered, the verified XML, the best
    runnable baseline's file (what the runtime would do anyway), and the comparison with the physical limit.
    ``time_limited``: the request's deadline cut the search or the writing, so a better plan may exist."""

    request: SynthesisRequest
    candidates: tuple[Candidate, ...]
    chosen: WrittenCandidate
    baseline: WrittenCandidate | None
    comparison: LimitComparison
    refusals: tuple[str, ...] = ()
    time_limited: bool = False

    @property
    def xml(self) -> EmittedXml:
        return self.chosen.xml

    @property
    def fell_back_to_baseline(self) -> bool:
        """A synthesized plan existed but the runtime's own choice (a baseline) simulates faster."""
        return self.chosen.candidate.result.status == Status.BASELINE and any(
            c.result.status != Status.BASELINE for c in self.candidates)

    @functools.cached_property
    def sketch_broken(self) -> str | None:
        """How the written plan breaks the request's sketch, in words, or None (no sketch, or it keeps to it).
        Only a baseline it fell back to can: every synthesized candidate keeps to the sketch. (Checked once: the
        summary and the report both ask.)"""
        sketch = self.request.sketch_rules
        if sketch is None:
            return None
        from synth.synthesis.sketched import sketch_violation

        return sketch_violation(sketch, self.request.topology, self.chosen.candidate.result.schedule)

    @property
    def honoured_slower_than_baseline(self) -> bool:
        """An explicit ``--method`` or ``--steps``/``--rounds`` was honoured, and its file simulates slower than
        the runtime's own choice, which it could not fall back to."""
        explicit = self.request.method != Method.AUTO or self.request.fixed_steps
        return (explicit and self.baseline is not None and self.chosen is not self.baseline
                and self.baseline.simulated_us < self.chosen.simulated_us)

    def report(self) -> dict:
        """The ``--json`` report (keys documented in the README)."""
        result, replay = self.chosen.candidate.result, self.chosen.candidate.report
        topo = self.request.topology
        simulated = self.chosen.simulated_us
        size = self.request.size_bytes
        algbw = algbw_GBps(size, simulated)
        return {
            "status": TIME_LIMIT_STATUS if self.time_limited else result.status, "plan_status": result.status,
            "time_limited": self.time_limited, "solve_seconds": result.solve_seconds, "gap": result.gap,
            "predicted_time_us": simulated, "plan_time_us": replay.time_us,
            "algbw_GBps": algbw, "busbw_GBps": algbw * result.schedule.busbw_factor(),
            "steps": result.steps, "rounds": result.rounds, "chunks": result.chunks,
            "collective": self.request.collective, "topology": topo.name, "ranks": topo.num_ranks,
            "size_bytes": size, "symmetry_order": result.symmetry_order, "target": self.xml.target,
            "method": self.chosen.candidate.label, "fell_back_to_baseline": self.fell_back_to_baseline,
            "keeps_to_sketch": None if self.request.sketch is None else self.sketch_broken is None,
            **self.comparison.to_dict(),
        }


def solve(request: SynthesisRequest, xml: XmlRequest = XmlRequest(), progress: Progress = lambda message: None,
          executor: cf.Executor | None = None, slots: int = 0) -> Solution:
    """Every verified candidate for ``request``; the one whose MSCCL file simulates fastest wins.

    ``executor`` (:func:`synth.synthesis.parallel.open_executor`) writes up to ``slots`` candidates at once, ahead
    of the loop that chooses; the loop still takes them in its own order and under its own rule, so the choice,
    the file and the report are those of writing them here one by one (None).

    >>> from synth.model.topology import load_topology
    >>> s = solve(SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20))
    >>> s.xml.text.startswith("<algo"), s.comparison.percent_of_limit <= 100
    (True, True)
    >>> s.report()["predicted_time_us"] >= s.report()["plan_time_us"] * 0.999
    True
    """
    check_target_knows(request.collective, request.target)     # before any search
    check_target_holds(request.topology.num_ranks, request.target)
    candidates = [c for c in verified_candidates(request, progress, tree_fallbacks=False)
                  if c.result.status != Status.BASELINE]
    baselines = _runnable_baselines(request)
    candidates += baselines                 # the runtime's own choices always compete (sketches too)
    candidates.sort(key=lambda c: c.report.time_us)
    # Under auto (with or without a sketch) the runtime's own choice may win; an explicit method or (S, R, C)
    # is honoured, and the baselines are only the comparison.
    may_fall_back = request.method == Method.AUTO and not request.fixed_steps

    def is_baseline(c: Candidate) -> bool:
        return any(c is b for b in baselines)

    def may_win(c: Candidate) -> bool:
        return may_fall_back or not is_baseline(c)

    def eligible(w: WrittenCandidate) -> bool:
        return may_win(w.candidate)

    time_limited = request.search_deadline.expired
    writer = _Writer(request, xml, progress, executor, slots)
    written: list[WrittenCandidate] = []
    refusals: list[str] = []
    unloadable: set[str] = set()    # baselines the runtime cannot load: never the comparison
    broken: list[str] = []          # candidates whose lowering failed its own check (a bug; never written)

    def best_us() -> float:
        return min((w.simulated_us for w in written if eligible(w)), default=math.inf)

    writing: list[Candidate] = []   # the candidate whose file is being waited for, if any

    def take(candidate: Candidate, deadline: Deadline | None = None) -> bool:
        """Record ``candidate``'s file (waiting at most until ``deadline``); False when the deadline came first."""
        writing[:] = [candidate]
        try:
            emitted = writer.wait(candidate, deadline)
        except BackendError as exc:
            refusals.append(f"{candidate.label}: {exc}")
            if is_baseline(candidate):
                unloadable.add(candidate.label)
            progress(f"  {candidate.label} cannot be written: {exc}")
            return True
        except VerificationError as exc:    # a bug of the lowering: that file is never written, the others compete
            broken.append(f"{candidate.label}: {exc}")
            progress(f"  {candidate.label} failed its verification and is skipped (please report): {exc}")
            return True
        if emitted is None:
            return False
        progress(f"  {candidate.label}: plan {candidate.report.time_us:.2f} us, simulated "
                 f"{emitted.simulated_us:.2f} us")
        written.append(WrittenCandidate(candidate, emitted))
        return True

    def write_in_order(pending: list[Candidate]) -> None:
        """Write ``pending`` (fastest replay first) under the rules above."""
        nonlocal time_limited
        while pending:
            if request.deadline.expired:
                time_limited = True
                # files written ahead by now still count: in the loop's order and under its rule
                for candidate in [c for c in pending if writer.finished(c)]:
                    pending.remove(candidate)
                    if candidate.report.time_us < best_us() or is_baseline(candidate):
                        take(candidate)
                if best_us() < math.inf:
                    # past the limit a baseline is still written only where its replay beats every file (never
                    # slower than the runtime's own choice): the smallest such program, the quickest to write.
                    # Otherwise the report compares with the fastest baseline's replay, and the command ends.
                    safety = [] if any(is_baseline(w.candidate) for w in written) else sorted(
                        (c for c in pending if is_baseline(c) and c.report.time_us < best_us()),
                        key=_program_size)[:1]
                    if len(pending) > len(safety):
                        progress(f"  time limit reached: {len(pending) - len(safety)} slower candidate(s) not written"
                                 + (" (a baseline still is)" if safety else ""))
                    pending = safety
                    writer.keep(pending)
                    if not pending:
                        break
                # out of time with nothing written yet: the smallest program first (the quickest to write, and
                # the likeliest to fit the runtime)
                pending.sort(key=lambda c: (not may_win(c), _program_size(c)))
            best = best_us()
            candidate = pending.pop(0)
            if candidate.report.time_us >= best and not is_baseline(candidate):
                writer.keep(pending)
                continue                        # its optimistic replay is already slower than a simulated file
            if is_baseline(candidate) and _cannot_beat_written(candidate, written, is_baseline, eligible, request,
                                                               progress):
                writer.keep(pending)
                continue
            if request.deadline.expired:
                take(candidate)
                continue
            # written ahead on the executor: first what the loop will surely write (the baselines), then what it may
            # (a replay slower than a simulated file now stays slower: the best only improves)
            writer.ahead([candidate] + [c for c in pending if is_baseline(c)]
                         + [c for c in pending if c.report.time_us < best and not is_baseline(c)])
            if not take(candidate, request.deadline):
                pending.insert(0, candidate)    # the time ran out while it was written: the branch above decides

    try:
        write_in_order(list(candidates))
        fallbacks = _tree_fallbacks(request, candidates, best_us(), progress)
        if fallbacks:
            candidates += fallbacks
            write_in_order(sorted(fallbacks, key=lambda c: c.report.time_us))
    except DeadlinePassed:      # the caller's hard stop: the files verified so far are the answer
        writer.keep([])
        if not any(eligible(w) for w in written):
            what = (f"while writing {writing[0].label} ({len(writing[0].result.schedule.transfers)} transfers)"
                    if writing else "before any file was written")
            raise NoSolutionError(
                f"the {request.deadline.budget_s:g} s time limit and {grace_s(request.deadline):g} s of grace to "
                f"finish a file ran out {what}, and no plan was verified; nothing is written. Raise --time-limit "
                f"(at {request.topology.num_ranks} GPUs, writing and checking one plan can take minutes)") from None
        time_limited = True
        where = f" while writing {writing[0].label}" if writing else ""
        progress(f"  time limit and grace passed{where}: the best file verified so far is the answer")

    if not any(eligible(w) for w in written):
        if broken:
            raise VerificationError("no candidate could be written: " + "; ".join(broken + refusals))
        raise BackendError("no candidate fits the runtime's limits: " + "; ".join(refusals))
    chosen = min((w for w in written if eligible(w)),
                 key=lambda w: w.simulated_us * (1 + GATHERED_TIE * bool(w.candidate.result.schedule.gathered)))
    time_limited = time_limited or any(w.xml.variants_cut for w in written)   # a faster file may exist
    base = min((w for w in written if is_baseline(w.candidate)), key=lambda w: w.simulated_us,
               default=None)
    comparison = compare_with_limits(
        request, chosen.simulated_us, None if base is None else (base.candidate.label.removeprefix("baseline/"),
                                                                 base.simulated_us),
        [(r.name, r.chunks_per_way) for r in request.baselines.runs if baseline_label(r) in unloadable]
        if unloadable else ())
    return Solution(request, tuple(candidates), chosen, base, comparison, tuple(refusals + broken), time_limited)


def _tree_fallbacks(request: SynthesisRequest, candidates: list[Candidate], best_us: float, progress: Progress
                    ) -> list[Candidate]:
    """Tree packings with fewer chunks per rank (:func:`synth.synthesis.select.tree_fallback_candidates`), made
    only when no file written is within :data:`~synth.synthesis.select.TREES_AT_LIMIT` of the limit (the own
    count's file may not fit the runtime, or simulate slower than planned). Their coarser integer packing and
    pipelining never beat the own count's plan there (dgx1 Allgather 1 GB: 256 chunks replay at 99.5% of the
    limit, 64 at 98.9%, 16 at 98.2%), and they cost as much to make as the own count."""
    trees = [c for c in candidates if c.label.startswith(TREES_LABEL)]
    if request.chunks or len(trees) != 1 or best_us <= request.bound.search_limit_us * (1 + TREES_AT_LIMIT):
        return []
    return timed_phase("tree packing with fewer chunks",
                       lambda: tree_fallback_candidates(request, trees[0], progress), request, progress)


# A gathered Allreduce (synth.schedule.ir.Schedule.gathered) wins only when its file is faster by more than this
# share: a tie goes to a file that moves fewer bytes (dgx-a100 Allreduce 1 KB gathered over all-pairs sends what
# the direct exchange sends, in the same time).
GATHERED_TIE = 1e-6


# What a local worker imports before it forks to write candidates (:func:`synth.synthesis.parallel.local_pool`).
WRITER_PRELOAD = ("backends.msccl.writer",)


class _Writer:
    """Writes candidates' files for :func:`solve`: here when the loop asks for one, or ahead of it on an
    executor, up to ``slots`` at once. Candidates are keyed by identity (the loop's own objects)."""

    def __init__(self, request: SynthesisRequest, xml: XmlRequest, progress: Progress,
                 executor: cf.Executor | None, slots: int):
        self.request, self.xml, self.progress = request, xml, progress
        self.executor = executor
        self.slots = max(1, slots) if executor is not None else 0
        self.futures: dict[int, cf.Future] = {}

    def _job(self, candidate: Candidate, here: bool = False) -> Callable[[], EmittedXml]:
        """Writing ``candidate``'s file (in this process when ``here``), as a call that can be pickled to a
        worker; announced here. The command's deadline stops the writer's optional variants where its clock
        means the same: here, or in a local worker on this machine's monotonic clock."""
        self.progress(f"  writing {candidate.label} as MSCCL XML (lower, lint, execute, simulate)")
        request, xml = self.request, self.xml
        same_clock = here or (isinstance(self.executor, cf.ProcessPoolExecutor)
                              and request.deadline.clock is time.monotonic)
        return functools.partial(emit_verified_xml, candidate.result.schedule, request.topology, request.target,
                                 request.size_bytes, proto=xml.proto, min_bytes=xml.min_bytes,
                                 max_bytes=xml.max_bytes, deadline=request.deadline if same_clock else None,
                                 plan_us=candidate.report.time_us, **({"progress": self.progress} if here else {}))

    def ahead(self, upcoming: list[Candidate]) -> None:
        """Keep up to ``slots`` writes in flight, taken from ``upcoming`` in its order."""
        if self.executor is None:
            return
        busy = sum(1 for f in self.futures.values() if not f.done())
        for candidate in upcoming:
            if busy >= self.slots:
                break
            if id(candidate) not in self.futures:
                self.futures[id(candidate)] = self.executor.submit(self._job(candidate))
                busy += 1

    def finished(self, candidate: Candidate) -> bool:
        """Its file was written ahead (or refused) and is waiting to be taken."""
        future = self.futures.get(id(candidate))
        return future is not None and future.done() and not future.cancelled()

    def keep(self, wanted: list[Candidate]) -> None:
        """Cancel the writes ahead that are not for ``wanted`` (one already running ends with the pool)."""
        keys = {id(c) for c in wanted}
        for key in [k for k in self.futures if k not in keys]:
            self.futures.pop(key).cancel()

    def wait(self, candidate: Candidate, deadline: Deadline | None = None) -> EmittedXml | None:
        """``candidate``'s file, raising what writing it raised; None when ``deadline`` passes first. A write
        not started ahead runs here (then the deadline does not cut it)."""
        future = self.futures.get(id(candidate))
        if future is None:
            return self._job(candidate, here=True)()
        try:
            result = future.result(None if deadline is None or not deadline.bounded else deadline.remaining_s())
        except cf.TimeoutError:
            return None
        finally:
            if future.done():
                del self.futures[id(candidate)]
        return result


# The ``--json`` status of a plan found when the time limit cut the search (the plan's own status is kept as
# ``plan_status``).
TIME_LIMIT_STATUS = "time-limit"


def _cannot_beat_written(candidate: Candidate, written: list[WrittenCandidate],
                         is_baseline: Callable[[Candidate], bool], eligible: Callable[[WrittenCandidate], bool],
                         request: SynthesisRequest, progress: Progress) -> bool:
    """Whether no file of this baseline can simulate faster than a baseline file already written or, before any
    is, than the fastest file that may be chosen: its link and port loads alone take longer
    (:func:`backends.msccl.floor.schedule_floor_us`), or the longest chain of its messages
    (:func:`~backends.msccl.floor.chain_floor_us`, where alphas dominate): sound bounds, where the replay is not. Such a file changes
    neither the choice nor the best-baseline figure (without a baseline file, the report compares with the
    fastest runnable baseline's replay, which its file could only exceed), and at 256 GPUs writing one costs
    minutes (a halving-doubling Allreduce 8x slower than the hierarchical one; at 512 GPUs the flat ring, 7.6x
    slower than the hierarchy, took longer to write than the hierarchy itself)."""
    baselines = [w for w in written if is_baseline(w.candidate)]
    done = baselines or [w for w in written if eligible(w)]
    if not done:
        return False
    best = min(done, key=lambda w: w.simulated_us)
    schedule = candidate.result.schedule
    floor = max(schedule_floor_us(schedule, request.topology, request.size_bytes),
                chain_floor_us(schedule, request.topology, request.size_bytes))
    # with no baseline file yet, one that could tie is still written: the report then shows the tie
    if floor < best.simulated_us or (not baselines and math.isclose(floor, best.simulated_us, rel_tol=1e-9)):
        return False
    progress(f"  {candidate.label} not written: its messages alone need {floor:.2f} us, and "
             f"{best.candidate.label} simulates at {best.simulated_us:.2f} us")
    return True


def _program_size(candidate: Candidate) -> tuple[int, float]:
    """How much writing a candidate costs, roughly (its transfers), then its replayed time: the order of writes
    once the deadline has passed."""
    return len(candidate.result.schedule.transfers), candidate.report.time_us


# How many of the fastest runnable baselines (by replay) are written and simulated: the replay can misorder them.
BASELINES_SIMULATED = 3


def _runnable_baselines(request: SynthesisRequest) -> list[Candidate]:
    """The fastest baselines the runtime selects at power-of-two sizes (by replay), as candidates."""
    if not request.include_baselines:
        return []
    runs = sorted((r for r in request.baselines.runs if r.runnable), key=lambda r: r.report.time_us)
    out = []
    for run in runs[:BASELINES_SIMULATED]:
        s = run.schedule
        result = SynthesisResult(s, Status.BASELINE, 0.0, None, 1, s.steps, s.rounds, s.collective.chunks_per_rank)
        out.append(Candidate(baseline_label(run), result, run.report))
    return out


def baseline_label(run: BaselineRun) -> str:
    """How candidates and reports name a baseline run."""
    return f"baseline/{run.name}/c{run.chunks_per_way}"


def step_model_text(solution: Solution, suffix: str) -> str:
    """The chosen step model as LP (``.lp``) or MPS (``.mps``) text, for other solvers (``--write-model``)."""
    result = solution.chosen.candidate.result
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
