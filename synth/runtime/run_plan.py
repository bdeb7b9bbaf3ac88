"""Static checks and buffer layout for running an MSCCL program on real processes (``synth run``).

:func:`plan_program` checks, before any process starts, what the runtimes would trip over: peers and
channels, one threadblock per (peer, channel, direction), ``s`` equal to the step's position, offsets within
buffers, dependencies on flags that are never published, and unmatched or size-mismatched messages on every
(sender, receiver, channel) connection. It bounds the work and numbers every message on its connection, and
raises :class:`~synth.errors.InputError` naming gpu, threadblock and step. It needs no PyTorch.

Buffer sizes follow the collective (DESIGN section 7), in chunks, for ``nchunksperloop = L`` on ``n`` ranks:
Allgather/Gather take ``L/n`` in and give ``L`` out, ReduceScatter/Scatter the reverse, the others ``L`` and
``L``; in-place runs alias ``i`` and ``o`` at rank ``r``'s block ``r*L/n`` (Allgather, Gather: input inside
the output; ReduceScatter, Scatter: output inside the input). Scratch has the declared ``s_chunks``.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.msccl.ir import STEP_TYPES, MscclProgram

from synth.errors import InputError

SUPPORTED = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter")
MAX_CHANNEL = 63                 # message tags hold 6 bits of channel (the runtimes allow 32 channels)
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
    per_rank = chunks // ngpus
    sizes = {"allgather": (per_rank, chunks), "gather": (per_rank, chunks), "reducescatter": (chunks, per_rank),
             "scatter": (chunks, per_rank)}
    i_chunks, o_chunks = sizes.get(collective, (chunks, chunks))
    in_off = rank * per_rank if inplace and collective in ("allgather", "gather") else 0
    out_off = rank * per_rank if inplace and collective in ("reducescatter", "scatter") else 0
    return BufferPlan(i_chunks, o_chunks, scratch, inplace, in_off, out_off)


def _buffer_size(plan: BufferPlan, buf: str) -> int:
    return {"i": plan.input_chunks, "o": plan.output_chunks, "s": plan.scratch_chunks}[buf]


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
    if chunks < 1 or (coll not in ("allreduce", "broadcast", "reduce") and chunks % n):
        raise InputError(source, "algo.nchunksperloop", f"{chunks} chunks do not split evenly over {n} ranks")
    gpu_ids = sorted(g.id for g in program.gpus)
    if gpu_ids != list(range(n)):
        raise InputError(source, "gpu", f"expected one <gpu> for each id 0..{n - 1}, got {gpu_ids[:10]}")
    if inplace is None:
        inplace = program.inplace == 1
    total_steps = sum(len(tb.steps) for g in program.gpus for tb in g.tbs)
    if total_steps > MAX_STEPS:
        raise InputError(source, "step", f"{total_steps} steps is more than the {MAX_STEPS} a run allows")
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
        _check_gpu(g, n, buffers[g.id], source, seq, sends, recvs)
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


def _check_gpu(g, n: int, plan: BufferPlan, source: str, seq: dict, sends: dict, recvs: dict) -> None:
    tb_ids = [tb.id for tb in g.tbs]
    if sorted(tb_ids) != list(range(len(tb_ids))):
        raise InputError(source, f"gpu {g.id}", f"threadblock ids must be 0..{len(tb_ids) - 1}")
    seen = {}
    for tb in g.tbs:
        where = f"gpu {g.id}/tb {tb.id}"
        if not 0 <= tb.chan <= MAX_CHANNEL:
            raise InputError(source, f"{where}.chan", f"channel {tb.chan} is outside 0..{MAX_CHANNEL}")
        for peer, direction in ((tb.send, "send"), (tb.recv, "recv")):
            if peer == -1:
                continue
            if not 0 <= peer < n or peer == g.id:
                raise InputError(source, f"{where}.{direction}", f"peer {peer} is not another rank (0..{n - 1})")
            key = (peer, tb.chan, direction)
            if key in seen:
                raise InputError(source, f"{where}.{direction}", f"tb {seen[key]} already {direction}s with gpu "
                                 f"{peer} on channel {tb.chan}; the runtime allows one tb per (peer, channel, "
                                 "direction)")
            seen[key] = tb.id
        for k, step in enumerate(tb.steps):
            _check_step(g.id, tb, k, step, plan, len(tb_ids), source, seq, sends, recvs)
            if step.depid != -1:
                target = next(t for t in g.tbs if t.id == step.depid)
                if not any(st.hasdep for st in target.steps[step.deps:]):
                    raise InputError(source, f"{where}/step {k}", f"waits for tb {step.depid} step {step.deps}, "
                                     "but no step of that tb from there on has hasdep=1, so the flag never comes")


def _check_step(gpu, tb, k, step, plan, ntbs, source, seq, sends, recvs) -> None:
    where = f"gpu {gpu}/tb {tb.id}/step {k}"
    if step.s != k:
        raise InputError(source, where, f"s=\"{step.s}\" must equal the step's position {k}")
    if step.type not in STEP_TYPES:
        raise InputError(source, f"{where}.type", f"unknown step type {step.type!r}")
    receives, sends_data, reduces, writes = STEP_TYPES[step.type]
    if step.depid != -1 and not (0 <= step.depid < ntbs and step.depid != tb.id and step.deps >= 0):
        raise InputError(source, f"{where}.depid", f"depends on tb {step.depid} step {step.deps}, which does not "
                         "exist")
    if step.type == "nop":
        return
    if step.cnt < 1:
        raise InputError(source, f"{where}.cnt", f"must be at least 1, got {step.cnt}")
    uses_src = not receives or reduces
    for used, buf, off, name in ((uses_src, step.srcbuf, step.srcoff, "src"),
                                 (writes, step.dstbuf, step.dstoff, "dst")):
        if not used:
            continue
        size = _buffer_size(plan, buf)
        if off < 0 or off + step.cnt > size:
            raise InputError(source, f"{where}.{name}off", f"chunks {off}..{off + step.cnt - 1} of buffer {buf!r} "
                             f"are outside its {size} chunk(s)")
    if sends_data:
        if tb.send == -1:
            raise InputError(source, where, f"{step.type!r} sends but the tb has send=-1")
        _append(sends, "send", (gpu, tb.send, tb.chan), (gpu, tb.id, k), step.cnt, seq, source, where)
    if receives:
        if tb.recv == -1:
            raise InputError(source, where, f"{step.type!r} receives but the tb has recv=-1")
        _append(recvs, "recv", (tb.recv, gpu, tb.chan), (gpu, tb.id, k), step.cnt, seq, source, where)


def _append(table, direction, conn, ref, cnt, seq, source, where) -> None:
    """Record the step ``ref`` as the next message of ``conn`` (sender, receiver, channel)."""
    queue = table.setdefault(conn, [])
    if len(queue) >= MAX_MESSAGES_PER_CONNECTION:
        raise InputError(source, where, f"more than {MAX_MESSAGES_PER_CONNECTION} messages on one connection")
    seq[ref + (direction,)] = len(queue)
    queue.append((ref, cnt))
