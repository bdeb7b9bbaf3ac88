"""Seeded faults in MSCCL programs: edit one step or threadblock, or draw random mutants and count the caught.

Used by the interpreter and simulator tests and by ``benchmarks/bench_mutants.py``. Step and tb ids stay
consistent where the mutation does not say otherwise.
"""

from __future__ import annotations

import dataclasses
import random

from backends.msccl.interpret import execute_program
from backends.msccl.ir import MscclProgram, Threadblock

def replace_step(program: MscclProgram, gpu: int, tb: int, k: int, **changes) -> MscclProgram:
    return _edit_tb(program, gpu, tb, lambda t: dataclasses.replace(
        t, steps=t.steps[:k] + (dataclasses.replace(t.steps[k], **changes),) + t.steps[k + 1:]))


def replace_tb(program: MscclProgram, gpu: int, tb: int, **changes) -> MscclProgram:
    return _edit_tb(program, gpu, tb, lambda t: dataclasses.replace(t, **changes))


def drop_step(program: MscclProgram, gpu: int, tb: int, k: int) -> MscclProgram:
    return _edit_tb(program, gpu, tb, lambda t: _renumber(t, t.steps[:k] + t.steps[k + 1:]))


def swap_steps(program: MscclProgram, gpu: int, tb: int, a: int, b: int) -> MscclProgram:
    def swap(t):
        steps = list(t.steps)
        steps[a], steps[b] = steps[b], steps[a]
        return _renumber(t, tuple(steps))
    return _edit_tb(program, gpu, tb, swap)


def _renumber(tb: Threadblock, steps) -> Threadblock:
    return dataclasses.replace(tb, steps=tuple(dataclasses.replace(s, s=k) for k, s in enumerate(steps)))


def _edit_tb(program: MscclProgram, gpu: int, tb: int, edit) -> MscclProgram:
    gpus = []
    for g in program.gpus:
        if g.id == gpu:
            g = dataclasses.replace(g, tbs=tuple(edit(t) if t.id == tb else t for t in g.tbs))
        gpus.append(g)
    return dataclasses.replace(program, gpus=tuple(gpus))


READS_SRC = ("s", "rrs", "rrc", "rrcs", "cpy", "re")
WRITES_DST = ("r", "rcs", "rrc", "rrcs", "cpy", "re")
RECEIVES = ("r", "rcs", "rrs", "rrc", "rrcs")


def random_mutant(program: MscclProgram, rng: random.Random) -> tuple[str, MscclProgram] | None:
    """One seeded random fault: drop/swap a step, change a peer, offset, cnt, depid or hasdep."""
    sites = [(g.id, tb.id, k, tb) for g in program.gpus for tb in g.tbs for k in range(len(tb.steps))]
    if not sites:
        return None
    gpu, tb_id, k, tb = rng.choice(sites)
    step = tb.steps[k]
    op = rng.choice(["drop", "swap", "peer", "offset", "cnt", "depid", "hasdep", "recv-first"])
    if op == "recv-first":
        return _both_receive_first(program, gpu, tb)
    if op == "drop":
        return op, drop_step(program, gpu, tb_id, k)
    if op == "swap":
        if len(tb.steps) < 2:
            return None
        other = rng.choice([j for j in range(len(tb.steps)) if j != k])
        return op, swap_steps(program, gpu, tb_id, k, other)
    if op == "peer":
        field_name = rng.choice([f for f in ("send", "recv") if getattr(tb, f) >= 0] or ["send"])
        choices = [p for p in range(program.ngpus) if p not in (gpu, getattr(tb, field_name))]
        return (op, replace_tb(program, gpu, tb_id, **{field_name: rng.choice(choices)})) if choices else None
    if op == "offset":  # only offsets the step uses: a receive ignores srcoff, a send dstoff
        used = [f for f, kinds_ in (("srcoff", READS_SRC), ("dstoff", WRITES_DST)) if step.type in kinds_]
        if not used:
            return None
        field_name = rng.choice(used)
        return op, replace_step(program, gpu, tb_id, k, **{field_name: getattr(step, field_name) + rng.choice([-1, 1])})
    if op == "cnt":
        if step.type == "nop":
            return None
        return op, replace_step(program, gpu, tb_id, k, cnt=step.cnt + rng.choice([-1, 1]) if step.cnt > 1 else 2)
    if op == "depid":
        others = [t.id for g in program.gpus if g.id == gpu for t in g.tbs if t.id not in (tb_id, step.depid)]
        if not others:
            return None
        return op, replace_step(program, gpu, tb_id, k, depid=rng.choice(others), deps=max(step.deps, 0))
    if not step.hasdep:
        return None
    return op, replace_step(program, gpu, tb_id, k, hasdep=0)


def _both_receive_first(program: MscclProgram, gpu: int, tb: Threadblock):
    """Move the first receive to the front in ``tb`` and in its peer's tb on the same channel."""
    peer = next((t for g in program.gpus if g.id == tb.send for t in g.tbs
                 if t.recv == gpu and t.chan == tb.chan), None)
    if peer is None or tb.recv != tb.send:
        return None
    for g, t in ((gpu, tb), (tb.send, peer)):
        first = next((k for k, s in enumerate(t.steps) if s.type in RECEIVES), None)
        if first is None:
            return None
        program = _edit_tb(program, g, t.id, lambda x, first=first: _renumber(
            x, (x.steps[first],) + x.steps[:first] + x.steps[first + 1:]))
    return "recv-first", program


def mutant_sweep(programs: list[MscclProgram], count: int, seed: int = 0) -> dict:
    """Run ``count`` seeded random mutants of ``programs``; return how many the interpreter rejects, per operator."""
    rng = random.Random(seed)
    per_op: dict = {}
    made = 0
    while made < count:
        out = random_mutant(rng.choice(programs), rng)
        if out is None:
            continue
        op, mutant = out
        made += 1
        caught = not execute_program(mutant).ok
        total, hit = per_op.get(op, (0, 0))
        per_op[op] = (total + 1, hit + caught)
    caught = sum(h for _, h in per_op.values())
    return {"mutants": made, "caught": caught, "share": caught / made, "per_operator": per_op}
