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
- one more threadblock per GPU (a chain of them where the steps outgrow one) waits for every other threadblock's
  last step (``nop`` steps, one dependency each), copies the input to the output (a no-op in place) and adds the
  ``n - 1`` gathered buffers into it (``re``, ``cnt = C``).

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
from backends.msccl.limits import MAX_CNT, MAX_STEPS_EXECUTOR
from synth.errors import BackendError
from synth.schedule.ir import GATHERED_PICK, GATHERED_SUM


def reduce_gathered(program: MscclProgram, name: str | None = None) -> MscclProgram:
    """The Allreduce program of an Allgather ``program`` that gathers every rank's whole input (module docstring).

    ``name``: the algorithm's name (default: the Allgather's, ``allgather`` read as ``allreduce_gathered``).
    Raises BackendError for a program that is not an Allgather, or whose merged step spans a rank's own block
    and another's (its own block becomes the input buffer, the others scratch).
    """
    return _gathered(program, GATHERED_SUM, 1, name)


def pick_gathered(program: MscclProgram, name: str | None = None) -> MscclProgram:
    """The Alltoall program of an Allgather ``program`` that gathers every rank's whole input: each Allgather
    chunk (1/C of an input) is n of the Alltoall's chunks (``nchunksperloop`` n C, C per pair of ranks), and each
    rank copies its block of every input it gathered into its output. ``name`` and errors as
    :func:`reduce_gathered`; a step of more than 71 / n chunks (``cnt``) cannot be scaled and is refused.

    >>> from synth.model.topology import load_topology
    >>> from synth.synthesis.baselines import build_baseline
    >>> from backends.msccl.lowering import lower_to_msccl
    >>> from backends.msccl.interpret import execute_program
    >>> ring = load_topology("ring-4")
    >>> program = pick_gathered(lower_to_msccl(build_baseline("shortest-path", "allgather", ring), ring))
    >>> program.coll, program.nchunksperloop, execute_program(program).ok
    ('alltoall', 4, True)
    """
    return _gathered(program, GATHERED_PICK, program.ngpus, name)


def finish_gathered(program: MscclProgram, computes: str, name: str | None = None) -> MscclProgram:
    """The gathered ``computes`` program (:attr:`synth.schedule.ir.Schedule.gathered`) of the Allgather
    ``program``: :func:`reduce_gathered` or :func:`pick_gathered`."""
    return (reduce_gathered if computes == GATHERED_SUM else pick_gathered)(program, name)


def _gathered(program: MscclProgram, computes: str, scale: int, name: str | None) -> MscclProgram:
    """``program``'s Allgather made the gathered ``computes`` program, every chunk ``scale`` of its chunks."""
    what = computes.capitalize()
    if program.collective != "allgather":
        raise BackendError(f"a gathered {what} is made from an Allgather program, not {program.coll}")
    n = program.ngpus
    per_rank = program.nchunksperloop // n       # C: the Allgather's chunks of one rank's input
    widest = max((st.cnt for gpu in program.gpus for tb in gpu.tbs for st in tb.steps), default=1)
    if widest * scale > MAX_CNT:
        raise BackendError(f"a step of {widest} chunks is {widest * scale} of the gathered {what}'s, over the "
                           f"runtimes' cnt <= {MAX_CNT}")
    scratch = {gpu.id: gpu.s_chunks * scale for gpu in program.gpus}

    def moved(rank: int, buffer: str, offset: int, cnt: int) -> tuple[str, int]:
        if buffer != "o":
            return buffer, offset * scale
        own = rank * per_rank
        if own <= offset and offset + cnt <= own + per_rank:
            return "i", (offset - own) * scale
        if offset < own + per_rank and own < offset + cnt:
            raise BackendError(f"GPU {rank}: a step of {cnt} chunks at output {offset} holds its own block and "
                               f"another rank's, so no gathered {what} can be made of it")
        return "s", scratch[rank] + offset * scale

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
                if st.type == "cpy" and (sb, so) == (db, do) and computes == GATHERED_SUM:
                    db = "o"            # the own block's copy: to the output (an Alltoall's picks its block last)
                steps.append(Step(st.s, st.type, sb, so, db, do, st.cnt * scale, st.depid, st.deps, st.hasdep))
            tbs.append(replace(tb, steps=tuple(steps), line=0))
        tbs = _published_last(tbs)
        buffer = per_rank * scale
        local = (_sums if computes == GATHERED_SUM else _picks)(gpu.id, n, per_rank, scratch[gpu.id])
        tbs += _local_chain(tbs, local, scratch[gpu.id] + gpu.id * buffer)
        gpus.append(Gpu(gpu.id, buffer, buffer, scratch[gpu.id] + n * buffer, tuple(tbs)))
    default = program.name.replace("allgather", f"{computes}_gathered", 1)
    return replace(program, name=safe_name(name or default), coll=computes, nchunksperloop=per_rank * scale,
                   gpus=tuple(gpus), line=0)


def _published_last(tbs: list[Threadblock]) -> list[Threadblock]:
    """The threadblocks with their last step published (``hasdep=1``), for the sum to wait on."""
    out = []
    for tb in tbs:
        if tb.steps and not tb.steps[-1].hasdep:
            tb = replace(tb, steps=tb.steps[:-1] + (replace(tb.steps[-1], hasdep=1),))
        out.append(tb)
    return out


# A local step of the chain: (type, srcbuf, srcoff, dstbuf, dstoff, cnt)
_Local = tuple[str, str, int, str, int, int]


def _sums(rank: int, n: int, per_rank: int, first_scratch: int) -> list[_Local]:
    """An Allreduce's: copy the input to the output (a no-op in place), add the ``n - 1`` gathered inputs."""
    return [("cpy", "i", 0, "o", 0, per_rank)] + [("re", "s", first_scratch + peer * per_rank, "o", 0, per_rank)
                                                 for peer in range(n) if peer != rank]


def _picks(rank: int, n: int, per_pair: int, first_scratch: int) -> list[_Local]:
    """An Alltoall's: the rank's own block of its input, then its block of each gathered input, each to that
    sender's block of the output."""
    whole = n * per_pair        # one rank's input, as gathered
    return [("cpy", "i" if peer == rank else "s",
             (0 if peer == rank else first_scratch + peer * whole) + rank * per_pair, "o", peer * per_pair, per_pair)
            for peer in [rank] + [p for p in range(n) if p != rank]]


def _local_chain(tbs: list[Threadblock], local: list[_Local], unused: int) -> list[Threadblock]:
    """The local threadblocks: wait for every other's last step, then the ``local`` steps, one after another.

    One ``nop`` per threadblock waited on and one step per peer outgrow the executor's 64 steps per threadblock
    on large machines (ndv2 x4: 45 waits and 32 local steps on a GPU; 4 x dgx-h100: more than 64 threadblocks to
    wait on), so the work is cut into a chain of threadblocks of at most
    :data:`~backends.msccl.limits.MAX_STEPS_EXECUTOR` steps, each starting with a wait on the last step of the one
    before: the local steps still run one after another into the one output. A wait that would end a link
    becomes a copy of the scratch chunk ``unused`` onto itself, carrying the wait (a nop's wait is attached to the
    step after it, and the next link waits on the last step): no step reads or writes that chunk (the rank's own
    block of the gathered inputs is its input), so the copy races with nothing."""
    waits = [(tb.id, len(tb.steps) - 1) for tb in tbs if tb.steps]
    work = [("nop", "i", 0, "o", 0, 1, tb, last) for tb, last in waits[:-1]]
    depid, deps = waits[-1] if waits else (-1, -1)
    work.append(local[0] + (depid, deps))
    work += [step + (-1, -1) for step in local[1:]]
    chain: list[Threadblock] = []
    while work:
        if chain:       # wait on the previous link's last step, published for it
            last = chain[-1]
            chain[-1] = replace(last, steps=last.steps[:-1] + (replace(last.steps[-1], hasdep=1),))
            # a nop's wait is attached to the next step, which needs a dependency of its own: a first step
            # without one takes the wait itself
            if work[0][-2] == -1:
                work[0] = work[0][:-2] + (last.id, len(last.steps) - 1)
            else:
                work.insert(0, ("nop", "i", 0, "o", 0, 1, last.id, len(last.steps) - 1))
        take, work = work[:MAX_STEPS_EXECUTOR], work[MAX_STEPS_EXECUTOR:]
        if take[-1][0] == "nop":        # a link ends on a step, not on a wait
            take[-1] = ("cpy", "s", unused, "s", unused, 1) + take[-1][-2:]
        steps = tuple(Step(k, kind, sb, so, db, do, cnt, dep, dep_step, 0)
                      for k, (kind, sb, so, db, do, cnt, dep, dep_step) in enumerate(take))
        chain.append(Threadblock(len(tbs) + len(chain), -1, -1, 0, steps))
    return chain
