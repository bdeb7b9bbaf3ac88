"""Drop the dependencies a step already has through others (a transitive reduction per rank).

A step carries one dependency in its own fields (``depid``/``deps``); each further one costs a ``nop`` step in
front of it, and the runtimes' XML reader holds at most 4095 elements per rank. Many waits are implied: a GPU's
sends through one NVSwitch port are ordered (:func:`backends.msccl.lowering._order_shared_ports`), so the second
copy of a chunk to another peer waits for the first, which already waited for the chunk's arrival; waiting for the
arrival again is a ``nop`` that changes nothing (16 x dgx-h100 Allgather: 110 of 350 steps of a rank).

A threadblock runs its steps in order, and a step waited for has finished with every step before it in its
threadblock, so what a step is known to follow is a vector clock: per threadblock of the rank, the last step
known finished before it starts. A dependency on step ``k`` of threadblock ``t`` is implied when the step's other
waits (or the step before it in its own threadblock) already follow step ``k`` of ``t`` or a later one. Dropping
implied waits leaves the order of execution exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def drop_implied(by_tb: dict, keys: Sequence) -> int:
    """Remove from each op's ``deps`` the ops it follows through its other dependencies or its threadblock's
    earlier ops; ``by_tb[key]`` lists a threadblock's ops in program order (each has ``deps``, a tuple of ops of
    other threadblocks of the rank). Returns how many dependencies were dropped (none when the waits form a cycle:
    that program deadlocks, and the verdict says so)."""
    index = {key: t for t, key in enumerate(keys)}
    place = {id(op): (index[key], i) for key, ops in by_tb.items() for i, op in enumerate(ops)}
    order = _topological(by_tb, keys, place)
    if order is None:
        return 0
    width = len(keys)
    clock: dict[int, np.ndarray] = {}
    dropped = 0
    for op in order:
        t, i = place[id(op)]
        start = clock[id(by_tb[keys[t]][i - 1])].copy() if i else np.full(width, -1, np.int64)
        start[t] = max(start[t], i - 1)
        if not op.deps:
            clock[id(op)] = start
            continue
        seen = []
        for d in op.deps:
            td, idd = place[id(d)]
            c = clock[id(d)].copy()
            c[td] = max(c[td], idd)
            seen.append(c)
        known = np.max(np.vstack([start] + seen), axis=0)
        clock[id(op)] = known
        kept = []
        for k, d in enumerate(op.deps):
            td, idd = place[id(d)]
            others = [start] + [c for j, c in enumerate(seen) if j != k]
            if max(int(c[td]) for c in others) >= idd:
                dropped += 1
            else:
                kept.append(d)
        op.deps = tuple(kept)
    return dropped


def _topological(by_tb: dict, keys: Sequence, place: dict) -> list | None:
    """The rank's ops in an order where each comes after its threadblock's earlier ops and its dependencies;
    None when they wait in a cycle."""
    ops = [op for key in keys for op in by_tb[key]]
    waiting = {id(op): len(op.deps) + (1 if place[id(op)][1] else 0) for op in ops}
    followers: dict[int, list] = {}
    for key in keys:
        tb_ops = by_tb[key]
        for i, op in enumerate(tb_ops):
            if i:
                followers.setdefault(id(tb_ops[i - 1]), []).append(op)
            for d in op.deps:
                followers.setdefault(id(d), []).append(op)
    ready = [op for op in ops if not waiting[id(op)]]
    order = []
    while ready:
        op = ready.pop()
        order.append(op)
        for f in followers.get(id(op), ()):
            waiting[id(f)] -= 1
            if not waiting[id(f)]:
                ready.append(f)
    return order if len(order) == len(ops) else None
