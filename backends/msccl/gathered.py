"""A gathered Allreduce's program: the Allgather of every rank's whole input, then a local sum on each rank.

At small sizes an Allreduce costs its alphas, and a relay that adds what it forwards into its own buffer can
forward only the sum it holds: on a ring of 8 the partial sums need a reduce and a broadcast, 8 hops, where the
alpha diameter is 4. Forwarding every rank's input untouched (an Allgather of whole buffers, n times the bytes,
nothing at 1 KB) and adding the n buffers at the end takes the diameter (:attr:`synth.schedule.ir.Schedule.gathered`).

The Allgather's program is lowered as any other; :func:`reduce_gathered` then makes it the Allreduce file:

- the Allgather's output buffer becomes scratch (after the scratch it had), but for the rank's own block, which
  is its input (the Allreduce's input and output are one buffer of ``C`` chunks, as the Allgather's input);
- a copy of the rank's own input into its block of the output copies it into the Allreduce's output instead
  (steps may wait for it, so it stays a step that signals);
- one more threadblock per GPU waits for every other threadblock's last step (``nop`` steps, one dependency
  each), copies the input to the output (a no-op in place) and adds the ``n - 1`` gathered buffers into it
  (``re``, ``cnt = C``).

Waiting for every threadblock keeps the sum from writing the buffer an in-place send is still reading; the
simulator times local steps as free (a local reduce of a few KB runs at memory bandwidth), so the file takes the
Allgather's time.

>>> from synth.model.topology import load_topology
>>> from synth.synthesis.baselines import build_baseline
>>> from backends.msccl.lowering import lower_to_msccl
>>> from backends.msccl.interpret import execute_program
>>> ring = load_topology("ring-4")
>>> stage = lower_to_msccl(build_baseline("shortest-path", "allgather", ring), ring)
>>> program = reduce_gathered(stage)
>>> program.coll, program.nchunksperloop, [tb.steps[-1].type for tb in program.gpus[0].tbs][-1]
('allreduce', 1, 're')
>>> execute_program(program).ok
True
"""

from __future__ import annotations

from dataclasses import replace

from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock, safe_name
from synth.errors import BackendError


def reduce_gathered(program: MscclProgram, name: str | None = None) -> MscclProgram:
    """The Allreduce program of an Allgather ``program`` that gathers every rank's whole input (module docstring).

    ``name``: the algorithm's name (default: the Allgather's, ``allgather`` read as ``allreduce_gathered``).
    Raises BackendError for a program that is not an Allgather, or whose merged step spans a rank's own block
    and another's (its own block becomes the input buffer, the others scratch).
    """
    if program.collective != "allgather":
        raise BackendError(f"a gathered Allreduce is made from an Allgather program, not {program.coll}")
    n = program.ngpus
    per_rank = program.nchunksperloop // n       # C: the chunks of one rank's input
    scratch = {gpu.id: gpu.s_chunks for gpu in program.gpus}

    def moved(rank: int, buffer: str, offset: int, cnt: int) -> tuple[str, int]:
        if buffer != "o":
            return buffer, offset
        own = rank * per_rank
        if own <= offset and offset + cnt <= own + per_rank:
            return "i", offset - own
        if offset < own + per_rank and own < offset + cnt:
            raise BackendError(f"GPU {rank}: a step of {cnt} chunks at output {offset} holds its own block and "
                               "another rank's, so no gathered Allreduce can be made of it")
        return "s", scratch[rank] + offset

    gpus = []
    for gpu in program.gpus:
        tbs = []
        for tb in gpu.tbs:
            steps = []
            for st in tb.steps:
                if st.type == "nop":
                    steps.append(st)
                    continue
                src_rank = tb.recv if st.type == "r" else gpu.id     # a receive names the sender's slot
                dst_rank = tb.send if st.type == "s" else gpu.id     # a send names the receiver's slot
                sb, so = moved(src_rank, st.srcbuf, st.srcoff, st.cnt)
                db, do = moved(dst_rank, st.dstbuf, st.dstoff, st.cnt)
                if st.type == "cpy" and (sb, so) == (db, do):     # the own block's copy: to the output
                    db = "o"
                steps.append(Step(st.s, st.type, sb, so, db, do, st.cnt, st.depid, st.deps, st.hasdep))
            tbs.append(replace(tb, steps=tuple(steps), line=0))
        tbs = _published_last(tbs)
        tbs.append(_sum_threadblock(gpu.id, tbs, n, per_rank, scratch[gpu.id]))
        gpus.append(Gpu(gpu.id, per_rank, per_rank, scratch[gpu.id] + n * per_rank, tuple(tbs)))
    default = program.name.replace("allgather", "allreduce_gathered", 1)
    return replace(program, name=safe_name(name or default), coll="allreduce", nchunksperloop=per_rank,
                   gpus=tuple(gpus), line=0)


def _published_last(tbs: list[Threadblock]) -> list[Threadblock]:
    """The threadblocks with their last step published (``hasdep=1``), for the sum to wait on."""
    out = []
    for tb in tbs:
        if tb.steps and not tb.steps[-1].hasdep:
            tb = replace(tb, steps=tb.steps[:-1] + (replace(tb.steps[-1], hasdep=1),))
        out.append(tb)
    return out


def _sum_threadblock(rank: int, tbs: list[Threadblock], n: int, per_rank: int, first_scratch: int
                     ) -> Threadblock:
    """The local threadblock: wait for every other's last step, copy input to output, add the gathered buffers."""
    waits = [(tb.id, len(tb.steps) - 1) for tb in tbs if tb.steps]
    steps = [Step(k, "nop", "i", 0, "o", 0, 1, tb, last, 0) for k, (tb, last) in enumerate(waits[:-1])]
    depid, deps = waits[-1] if waits else (-1, -1)
    steps.append(Step(len(steps), "cpy", "i", 0, "o", 0, per_rank, depid, deps, 0))
    for peer in range(n):
        if peer != rank:
            steps.append(Step(len(steps), "re", "s", first_scratch + peer * per_rank, "o", 0, per_rank))
    return Threadblock(len(tbs), -1, -1, 0, tuple(steps))
