"""Execute MSCCL programs on real processes with ``torch.distributed`` and compare with the reference result.

``synth run FILE.xml --nprocs N`` starts N local processes (gloo on CPU), gives every rank random
integer-valued inputs (float64, so sums are exact in any order) and runs the rank's threadblocks the way the
MSCCL runtimes do (DESIGN section 7):

- one Python thread per threadblock runs its steps in order;
- a step with ``depid``/``deps`` waits until threadblock ``depid`` has completed a step ``>= deps`` that has
  ``hasdep=1`` (only those publish); ``nop`` steps only wait;
- the k-th send-type step of a threadblock on connection (sender, receiver, channel) is delivered to the k-th
  receive-type step of the receiving threadblock: every message carries a tag made of the channel and k, so
  messages cannot overtake each other; a send is a snapshot of its data, and at most the protocol's FIFO
  depth of sends (2 for Simple, 8 for LL/LL128) may be unacknowledged per threadblock;
- step data: ``s`` sends src, ``r`` writes the message to dst, ``rcs`` writes and forwards it, ``rrs``
  forwards message + src, ``rrc`` writes message + src to dst, ``rrcs`` does both, ``cpy`` copies src to dst,
  ``re`` sets dst = dst + src.

Chunk ``j`` of a buffer is a row of ``chunk_elements`` values. Output and scratch start as NaN, so a chunk
nothing writes is caught. In-place programs alias ``i`` and ``o`` at the collective's in-place offsets.
At the end every rank compares its output with the collective computed by torch from the same inputs
(concatenation, sum, slices); rooted collectives use ``root`` (MSCCL files do not name one; default 0).

Before any process starts, :func:`synth.runtime.program_buffers.plan_program` checks what the runtime would trip over and
bounds the work, raising :class:`~synth.errors.InputError` that names gpu, threadblock and step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from backends.msccl.ir import STEP_TYPES

from synth.errors import InputError, VerificationError
from synth.runtime.program_buffers import ProgramPlan, plan_program
from synth.runtime.launch import require_torch, run_ranks

FIFO_DEPTH = {"Simple": 2, "LL": 8, "LL128": 8}
MAX_PROGRAMS_PER_RUN = 256
MAX_PROBLEMS_PER_RANK = 8
MAX_ELEMENTS_PER_RANK = 1 << 24  # float64 values one rank allocates for one run (128 MiB)


@dataclass(frozen=True)
class RunReport:
    """Outcome of one program on real processes: ok, or the problems each rank found."""

    name: str
    source: str
    collective: str
    inplace: bool
    nprocs: int
    ok: bool
    problems: tuple[str, ...]
    messages: int
    run_s: float          # slowest rank's time from its first step to its last (seconds)
    wrong_chunks: int = 0  # output chunks (over all ranks) that differ from the reference

    def summary(self) -> str:
        mode = "in-place" if self.inplace else "out-of-place"
        what = f"{self.wrong_chunks} wrong output chunk(s)" if self.wrong_chunks else f"{len(self.problems)} problem(s)"
        verdict = "ok" if self.ok else f"FAILED ({what})"
        return (f"{verdict}: {self.name} ({self.collective}, {mode}) on {self.nprocs} processes, "
                f"{self.messages} messages, {self.run_s * 1e3:.1f} ms")

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "collective": self.collective, "inplace": self.inplace,
                "nprocs": self.nprocs, "ok": self.ok, "problems": list(self.problems), "messages": self.messages,
                "run_ms": self.run_s * 1e3, "wrong_chunks": self.wrong_chunks}


# ----------------------------------------------------------------------------------------------- running

@dataclass(frozen=True)
class RunOptions:
    """How to run: seed of the inputs, values per chunk, per-wait timeout (s), root of rooted collectives."""

    seed: int = 0
    chunk_elements: int = 16
    timeout_s: float = 60.0
    root: int = 0


def run_msccl_programs(programs, nprocs: int | None = None, backend: str = "gloo", seed: int = 0,
                       chunk_elements: int = 16, timeout_s: float = 60.0, root: int = 0,
                       source: str = "<program>") -> list[RunReport]:
    """Run MSCCL programs one after the other on the same ``nprocs`` processes.

    Every mode a program claims (``inplace=1`` runs in place; otherwise out of place; files that also say
    ``outofplace="1"`` run both ways) is a separate run. Returns one :class:`RunReport` per run; use
    :func:`raise_on_failure` to turn failures into a :class:`~synth.errors.VerificationError`.
    """
    require_torch("synth run")
    programs = list(programs)
    if not programs:
        raise InputError(source, "algo", "no <algo> to run")
    nprocs = nprocs or programs[0].ngpus
    plans = []
    for p in programs:
        modes = [True] if p.inplace == 1 else []
        if p.outofplace == 1 or p.inplace != 1:
            modes.append(False)
        plans += [plan_program(p, nprocs, source, inplace=m) for m in modes]
    for plan in plans:
        chunks = max(b.unified_chunks + b.input_chunks + b.output_chunks + b.scratch_chunks for b in plan.buffers)
        if chunks * chunk_elements > MAX_ELEMENTS_PER_RANK:
            raise InputError(source, "--chunk-elements", f"{chunks} chunks x {chunk_elements} values per rank is "
                             f"more than the {MAX_ELEMENTS_PER_RANK} a run allocates; use fewer chunk elements")
    if len(plans) > MAX_PROGRAMS_PER_RUN:
        raise InputError(source, "algo", f"more than {MAX_PROGRAMS_PER_RUN} runs in one launch")
    if not 0 <= root < nprocs:
        raise InputError("--root", "", f"root {root} is not a rank (0..{nprocs - 1})")
    options = RunOptions(seed, chunk_elements, timeout_s, root)
    outcomes = run_ranks(_rank_main, nprocs, (tuple(plans), options), backend=backend,
                         timeout_s=timeout_s * (len(plans) + 1))
    return _combine(plans, outcomes, nprocs)


def run_msccl_file(path, nprocs: int | None = None, **kwargs) -> list[RunReport]:
    """Parse an MSCCL XML file (backends.msccl.parse) and run every ``<algo>`` in it."""
    from backends.msccl.parse import load_msccl_xml
    return run_msccl_programs(load_msccl_xml(path), nprocs, source=str(Path(path)), **kwargs)


def raise_on_failure(reports: list[RunReport]) -> None:
    """Raise VerificationError naming the first failing rank and chunk, if any run failed."""
    bad = [r for r in reports if not r.ok]
    if not bad:
        return
    first = bad[0]
    mode = "in-place" if first.inplace else "out-of-place"
    total = (f"{first.wrong_chunks} wrong output chunk(s) in all" if first.wrong_chunks
             else f"{len(first.problems)} problem(s) in all")
    others = f"; {len(bad) - 1} other run(s) failed too" if len(bad) > 1 else ""
    raise VerificationError(f"{first.source}: {first.name} ({mode}) failed on real processes: "
                            f"{first.problems[0]} ({total}{others})")


def _combine(plans, outcomes, nprocs) -> list[RunReport]:
    reports = []
    for j, plan in enumerate(plans):
        problems, run_s, wrong = [], 0.0, 0
        for o in outcomes:
            if not o.ok:
                problems.append(f"rank {o.rank}: {o.error}")
                continue
            res = o.value[j] if j < len(o.value) else {"problems": ["not run (an earlier run failed)"], "run_s": 0}
            problems += res["problems"]
            run_s = max(run_s, res["run_s"])
            wrong += res.get("wrong", 0)
        reports.append(RunReport(plan.program.name, plan.source, plan.collective, plan.inplace, nprocs,
                                 not problems, tuple(problems), plan.messages, run_s, wrong))
    return reports


def _rank_main(rank: int, nprocs: int, plans, options: RunOptions) -> list[dict]:
    """Child process body: run every plan in turn; stop after one that left the connections unusable."""
    import torch.distributed as dist
    results = []
    for job, plan in enumerate(plans):
        res = _run_one(rank, job, plan, options)
        results.append(res)
        if res["broken"]:
            break
        dist.barrier()
    return results


class _Abort(Exception):
    pass


class _RankRun:
    """Shared state of one rank's threadblocks: buffers, published flags, first error."""

    def __init__(self, rank, job, plan: ProgramPlan, options: RunOptions, inputs):
        import torch
        self.torch = torch
        self.rank, self.job, self.plan, self.options = rank, job, plan, options
        b = plan.buffers[rank]
        nan = float("nan")
        S = options.chunk_elements
        if b.inplace:
            unified = torch.full((b.unified_chunks, S), nan, dtype=torch.float64)
            unified[b.input_offset:b.input_offset + b.input_chunks] = inputs[rank]
            self.bufs = {"i": unified[b.input_offset:b.input_offset + b.input_chunks],
                         "o": unified[b.output_offset:b.output_offset + b.output_chunks]}
        else:
            self.bufs = {"i": inputs[rank].clone(), "o": torch.full((b.output_chunks, S), nan, dtype=torch.float64)}
        self.bufs["s"] = torch.full((b.scratch_chunks, S), nan, dtype=torch.float64)
        self.flags = {tb.id: -1 for tb in self.gpu.tbs}
        self.cond = threading.Condition()
        self.errors: list[str] = []
        self.deadline = time.monotonic() + options.timeout_s

    @property
    def gpu(self):
        return next(g for g in self.plan.program.gpus if g.id == self.rank)

    def fail(self, message: str) -> None:
        with self.cond:
            self.errors.append(message)
            self.cond.notify_all()

    def wait_flag(self, tb_id: int, step: int) -> None:
        with self.cond:
            while self.flags[tb_id] < step:
                if self.errors:
                    raise _Abort()
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waited {self.options.timeout_s:g} s for tb {tb_id} to publish step {step}")
                self.cond.wait(timeout=min(left, 0.5))

    def publish(self, tb_id: int, step: int) -> None:
        with self.cond:
            self.flags[tb_id] = step
            self.cond.notify_all()

    def tag(self, chan: int, k: int) -> int:
        return (self.job << 22) | (chan << 16) | k


def _run_tb(run: _RankRun, tb) -> None:
    import torch.distributed as dist
    torch = run.torch
    S = run.options.chunk_elements
    depth = FIFO_DEPTH.get(run.plan.program.proto, 2)
    wait = timedelta(seconds=run.options.timeout_s)
    outstanding = deque()
    k = -1
    try:
        for k, step in enumerate(tb.steps):
            if step.depid != -1:
                run.wait_flag(step.depid, step.deps)
            if run.errors:
                raise _Abort()
            receives, sends, reduces, writes = STEP_TYPES[step.type]
            value = None
            if receives:
                message = torch.empty(step.cnt * S, dtype=torch.float64)
                kk = run.plan.seq[(run.rank, tb.id, k, "recv")]
                dist.irecv(message, src=tb.recv, tag=run.tag(tb.chan, kk)).wait(wait)
                value = message.view(step.cnt, S)
                if reduces:
                    value = value + run.bufs[step.srcbuf][step.srcoff:step.srcoff + step.cnt]
            elif step.type == "re":
                value = run.bufs[step.dstbuf][step.dstoff:step.dstoff + step.cnt] + \
                    run.bufs[step.srcbuf][step.srcoff:step.srcoff + step.cnt]
            elif step.type in ("s", "cpy"):
                value = run.bufs[step.srcbuf][step.srcoff:step.srcoff + step.cnt].clone()
            if writes:
                run.bufs[step.dstbuf][step.dstoff:step.dstoff + step.cnt] = value
            if sends:
                data = value.reshape(-1).clone()
                kk = run.plan.seq[(run.rank, tb.id, k, "send")]
                outstanding.append((dist.isend(data, dst=tb.send, tag=run.tag(tb.chan, kk)), data))
                if len(outstanding) > depth:
                    outstanding.popleft()[0].wait(wait)
            if step.hasdep:
                run.publish(tb.id, k)
        while outstanding:
            outstanding.popleft()[0].wait(wait)
    except _Abort:
        return
    except Exception as exc:  # a timeout or a transport error: name where it happened
        text = str(exc).splitlines()[0][:300] if str(exc) else exc.__class__.__name__
        run.fail(f"rank {run.rank}: tb {tb.id} step {k} ({tb.steps[k].type if 0 <= k < len(tb.steps) else '-'}): "
                 f"{text}")


def make_inputs(plan: ProgramPlan, options: RunOptions):
    """Every rank's input (chunks x chunk_elements, float64 integers in [-1000, 1000)), reproducible by seed."""
    import torch
    out = []
    for r, b in enumerate(plan.buffers):
        gen = torch.Generator().manual_seed(options.seed * 1_000_003 + r)
        out.append(torch.randint(-1000, 1000, (b.input_chunks, options.chunk_elements), generator=gen,
                                 dtype=torch.int64).to(torch.float64))
    return out


def reference_output(collective: str, rank: int, inputs, root: int = 0):
    """What ``rank``'s output buffer must hold, computed by torch from all ranks' inputs (None: unchecked)."""
    import torch
    n = len(inputs)
    if collective in ("allgather", "gather"):
        return torch.cat(inputs) if collective == "allgather" or rank == root else None
    if collective in ("allreduce", "reduce"):
        return torch.stack(inputs).sum(0) if collective == "allreduce" or rank == root else None
    if collective == "reducescatter":
        total = torch.stack(inputs).sum(0)
        return total.chunk(n)[rank]
    if collective == "alltoall":
        return torch.cat([x.chunk(n)[rank] for x in inputs])
    if collective == "broadcast":
        return inputs[root].clone()
    return inputs[root].chunk(n)[rank]  # scatter


def _run_one(rank: int, job: int, plan: ProgramPlan, options: RunOptions) -> dict:
    inputs = make_inputs(plan, options)
    run = _RankRun(rank, job, plan, options, inputs)
    threads = [threading.Thread(target=_run_tb, args=(run, tb), daemon=True, name=f"tb{tb.id}")
               for tb in run.gpu.tbs]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive() and not run.errors and time.monotonic() < run.deadline + 1.0:
            t.join(timeout=0.2)
    if run.errors:
        for t in threads:
            t.join(timeout=0.1)  # let the others notice the failure; stuck receives are left behind
    elapsed = time.perf_counter() - start
    stuck = [t.name for t in threads if t.is_alive()]
    if run.errors or stuck:
        problems = list(run.errors[:MAX_PROBLEMS_PER_RANK])
        if stuck and not run.errors:
            problems.append(f"rank {rank}: threadblocks {', '.join(stuck)} did not finish within "
                            f"{options.timeout_s:g} s")
        return {"problems": problems, "run_s": elapsed, "broken": True}
    want = reference_output(plan.collective, rank, inputs, options.root)
    got = run.bufs["o"]
    problems, wrong = ([], 0) if want is None else _compare(rank, got, want, inputs, plan.collective)
    return {"problems": problems, "run_s": elapsed, "broken": False, "wrong": wrong}


def _compare(rank: int, got, want, inputs, collective: str) -> tuple[list[str], int]:
    import torch
    problems, wrong = [], 0
    for j in range(want.shape[0]):
        if torch.equal(got[j], want[j]):
            continue
        wrong += 1
        if len(problems) < MAX_PROBLEMS_PER_RANK:
            why = _explain(got[j], want[j], inputs, _reduced_index(collective, rank, j, len(inputs), want.shape[0]))
            problems.append(f"rank {rank}: output chunk {j} is wrong: {why}")
    if wrong > len(problems):
        problems.append(f"rank {rank}: {wrong - len(problems)} more wrong output chunk(s)")
    return problems, wrong


def _reduced_index(collective: str, rank: int, j: int, n: int, out_chunks: int) -> int | None:
    """Input index every rank contributes to output chunk ``j`` of a combining collective (else None)."""
    if collective in ("allreduce", "reduce"):
        return j
    if collective == "reducescatter":
        return rank * out_chunks + j
    return None


def _explain(got, want, inputs, reduced: int | None) -> str:
    """Say what a wrong chunk holds: nothing, a contribution too many or too few, or just the values."""
    import torch
    if torch.isnan(got).any():
        return "never written (still holds the NaN it started with)"
    diff = got - want
    if reduced is not None and diff.numel() >= len(inputs):
        basis = torch.stack([x[reduced] for x in inputs], dim=1)          # elements x ranks
        coef = torch.linalg.lstsq(basis, diff.unsqueeze(1)).solution.squeeze(1)
        rounded = coef.round()
        if torch.allclose(basis @ rounded, diff) and rounded.abs().sum() > 0:
            groups: dict[int, list[str]] = {}
            for q, c in enumerate(rounded.tolist()):
                if c:
                    groups.setdefault(1 + int(c), []).append(str(q))
            parts = [f"rank{'s' if len(qs) > 1 else ''} {', '.join(qs)} {times} time{'' if times == 1 else 's'}"
                     for times, qs in sorted(groups.items(), reverse=True)]
            return f"contributions counted wrongly: {'; '.join(parts)} (each rank's must count once)"
    for q, x in enumerate(inputs):
        for k in range(x.shape[0]):
            if torch.equal(diff, x[k]):
                return f"rank {q}'s input chunk {k} is included once too often"
            if torch.equal(-diff, x[k]):
                return f"rank {q}'s input chunk {k} is missing"
    show = lambda t: "[" + ", ".join(f"{v:g}" for v in t.tolist()[:4]) + "]"
    return f"expected {show(want)}, got {show(got)}"
