"""Static checks and buffer layout for running an MSCCL program on real processes (``synth run``).

:func:`plan_program` checks, before any process starts, what the runtimes would trip over: the rules and limits
``synth check`` applies (:func:`backends.msccl.lint.lint_program`: peers, channels, one threadblock per (peer,
channel, direction), offsets within buffers, dependencies on flags that are never published) and unmatched or
size-mismatched messages on every (sender, receiver, channel) connection. It bounds the work and numbers every
message on its connection, and raises :class:`~synth.errors.InputError` naming gpu, threadblock and step. It
needs no PyTorch.

Buffer sizes and in-place offsets follow the collective (:mod:`backends.msccl.conventions`); scratch has the
declared ``s_chunks``.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.msccl import conventions
from backends.msccl.ir import STEP_TYPES, MscclProgram
from backends.msccl.lint import lint_program

from synth.errors import InputError

SUPPORTED = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter")
MAX_MESSAGES_PER_CONNECTION = 1 << 16
MAX_STEPS = 500_000              # steps over all ranks of one program
MAX_CHUNKS_PER_RANK = 1 << 20    # chunks one rank's buffers hold (in-place buffer, i, o, s)


@dataclass(frozen=True)
class BufferPlan:
    """Per rank, in chunks: input and output sizes, scratch size, and in-place offsets into one buffer."""

    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    inplace: bool
    input_offset: int
    output_offset: int

    @property
    def unified_chunks(self) -> int:
        return max(self.input_offset + self.input_chunks, self.output_offset + self.output_chunks)


@dataclass(frozen=True)
class ProgramPlan:
    """A checked program ready to run: per rank buffers and per step message sequence numbers."""

    program: MscclProgram
    source: str
    collective: str
    inplace: bool
    buffers: tuple[BufferPlan, ...]
    seq: dict            # (gpu, tb id, step index, "send"|"recv") -> k, the step's position on its connection
    messages: int        # messages one run sends


# ----------------------------------------------------------------------------------------------- planning

def buffer_plan(collective: str, rank: int, ngpus: int, chunks: int, scratch: int, inplace: bool) -> BufferPlan:
    """Buffer sizes (chunks) of one rank for a program with ``nchunksperloop = chunks``."""
    sizes = conventions.buffer_chunks(collective, chunks, ngpus)
    in_off, out_off = conventions.inplace_offsets(collective, rank, chunks, ngpus) if inplace else (0, 0)
    return BufferPlan(int(sizes.input), int(sizes.output), scratch, inplace, int(in_off), int(out_off))


def plan_program(program: MscclProgram, nprocs: int, source: str = "<program>",
                 inplace: bool | None = None) -> ProgramPlan:
    """Check ``program`` for a run on ``nprocs`` processes; raise InputError naming gpu/tb/step otherwise."""
    coll = program.collective
    if coll not in SUPPORTED:
        raise InputError(source, "algo.coll", f"collective {program.coll!r} cannot be run; supported: "
                         f"{', '.join(SUPPORTED)}")
    n = program.ngpus
    if n != nprocs:
        raise InputError(source, "algo.ngpus", f"the program is for {n} GPUs; run it with --nprocs {n}")
    chunks = program.nchunksperloop
    sizes = conventions.buffer_chunks(coll, chunks, n)
    if sizes is None or sizes.input.denominator != 1 or sizes.output.denominator != 1:
        raise InputError(source, "algo.nchunksperloop", f"{chunks} chunks do not split evenly over {n} ranks")
    gpu_ids = sorted(g.id for g in program.gpus)
    if gpu_ids != list(range(n)):
        raise InputError(source, "gpu", f"expected one <gpu> for each id 0..{n - 1}, got {gpu_ids[:10]}")
    if inplace is None:
        inplace = program.inplace == 1
    total_steps = program.num_steps
    if total_steps > MAX_STEPS:
        raise InputError(source, "step", f"{total_steps} steps is more than the {MAX_STEPS} a run allows")
    errors = [f for f in lint_program(program, "both", cap=False) if f.severity == "error"]
    if errors:
        where = errors[0].location()
        raise InputError(source, where or "algo", errors[0].message)
    buffers = []
    for g in sorted(program.gpus, key=lambda g: g.id):
        if g.s_chunks < 0:
            raise InputError(source, f"gpu {g.id}.s_chunks", f"must not be negative, got {g.s_chunks}")
        plan = buffer_plan(coll, g.id, n, chunks, g.s_chunks, inplace)
        if plan.unified_chunks + plan.input_chunks + plan.output_chunks + plan.scratch_chunks > \
                MAX_CHUNKS_PER_RANK:
            raise InputError(source, f"gpu {g.id}", "buffers are too large to run")
        buffers.append(plan)
    seq, sends, recvs = {}, {}, {}
    for g in program.gpus:
        _number_messages(g, source, seq, sends, recvs)
    for conn in sorted(set(sends) | set(recvs)):
        a, b = sends.get(conn, []), recvs.get(conn, [])
        src, dst, chan = conn
        if len(a) != len(b):
            raise InputError(source, f"gpu {src}->gpu {dst} channel {chan}",
                             f"{len(a)} message(s) sent but {len(b)} received; every send needs a receive")
        for k, ((sref, scnt), (rref, rcnt)) in enumerate(zip(a, b)):
            if scnt != rcnt:
                raise InputError(source, f"gpu {src}->gpu {dst} channel {chan}",
                                 f"message {k} has cnt {scnt} at the sender ({_ref(sref)}) but {rcnt} at the "
                                 f"receiver ({_ref(rref)})")
    messages = sum(len(v) for v in sends.values())
    return ProgramPlan(program, source, coll, inplace, tuple(buffers), seq, messages)


def _ref(ref) -> str:
    return f"gpu {ref[0]}/tb {ref[1]}/step {ref[2]}"


def _number_messages(g, source: str, seq: dict, sends: dict, recvs: dict) -> None:
    """Number every message on its connection (the lint has already checked peers, offsets and flags)."""
    for tb in g.tbs:
        for k, step in enumerate(tb.steps):
            receives, sends_data, _, _ = STEP_TYPES[step.type]
            where = f"gpu {g.id}/tb {tb.id}/step {k}"
            if sends_data:
                _append(sends, "send", (g.id, tb.send, tb.chan), (g.id, tb.id, k), step.cnt, seq, source, where)
            if receives:
                _append(recvs, "recv", (tb.recv, g.id, tb.chan), (g.id, tb.id, k), step.cnt, seq, source, where)


def _append(table, direction, conn, ref, cnt, seq, source, where) -> None:
    """Record the step ``ref`` as the next message of ``conn`` (sender, receiver, channel)."""
    queue = table.setdefault(conn, [])
    if len(queue) >= MAX_MESSAGES_PER_CONNECTION:
        raise InputError(source, where, f"more than {MAX_MESSAGES_PER_CONNECTION} messages on one connection")
    seq[ref + (direction,)] = len(queue)
    queue.append((ref, cnt))
