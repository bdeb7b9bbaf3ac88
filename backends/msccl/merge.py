"""Merge consecutive messages on a connection into one step with ``cnt > 1`` (DESIGN section 7).

The executor runs at most 64 steps per threadblock, and a pipelined schedule (a broadcast chain of 2048 pieces, a
long multi-node connection) has far more messages than that. Where a threadblock moves contiguous chunks one after
another, the runtime can move them as one step of ``cnt`` chunks (1..71): same work, fewer steps.

Steps ``k`` and ``k+1`` of a threadblock merge when they are alike and adjacent at *both* ends of every message they
carry:

- same type (not ``nop``), ``srcoff``/``dstoff`` of ``k+1`` follow those of ``k`` in the same buffers;
- ``k+1`` waits for nothing (no ``nop`` in front of it, no ``depid``) or, when nobody waits for ``k``
  (``hasdep=0``), for a later step of the threadblock ``k`` waits for (the merged step then waits for the latest;
  were ``k`` waited for, its flag would be published only after that later wait, and the waiter's chain can
  lead back to it: a cycle of ``hasdep`` waits that deadlocks); with ``strict``, ``k+1`` waits for nothing and
  nobody waits for ``k``, so no threadblock waits longer than before;
- on the connections the steps receive from and send to, the matching steps at the other end merge the same way
  (the k-th send matches the k-th receive, so both ends must group the messages alike; fused ``rcs``/``rrs`` chains
  therefore merge only where every step of the chain merges).

Groups are cut where the destination offset crosses a multiple of ``max_cnt`` (a message of more chunks is
forwarded later: the cap trades steps for pipelining), so the ends of a connection (and the steps of a chain) cut
alike; local copies merge up to :data:`MAX_CNT`. Dependencies (``depid``/``deps``) are renumbered to the merged steps.

>>> from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
>>> sends = Threadblock(0, 1, -1, 0, tuple(Step(k, "s", "i", k, "o", k, 1) for k in range(4)))
>>> recvs = Threadblock(0, -1, 0, 0, tuple(Step(k, "r", "i", k, "o", k, 1) for k in range(4)))
>>> p = MscclProgram("p", "Simple", 1, 4, 2, "broadcast", 0, 1, 0, 0, (Gpu(0, 4, 4, 0, (sends,)),
...                  Gpu(1, 4, 4, 0, (recvs,))))
>>> [(st.s, st.srcoff, st.cnt) for st in merge_contiguous(p, 2).gpus[1].tbs[0].steps]
[(0, 0, 2), (1, 2, 2)]
"""

from __future__ import annotations

from dataclasses import replace

from backends.msccl.ir import STEP_TYPES, MscclProgram, Step
from backends.msccl.limits import MAX_CNT

# Steps that move no message: merging them costs no pipelining, so they merge up to MAX_CNT whatever the cap.
LOCAL_TYPES = frozenset({"cpy", "re"})


def merge_contiguous(program: MscclProgram, max_cnt: int = MAX_CNT, strict: bool = False) -> MscclProgram:
    """The program with runs of mergeable steps (module docstring) as single steps of at most ``max_cnt`` chunks."""
    max_cnt = max(1, min(max_cnt, MAX_CNT))
    tbs = [(gpu.id, tb) for gpu in program.gpus for tb in gpu.tbs]
    joined = [_local_joins(tb.steps, max_cnt, strict) for _, tb in tbs]
    if not any(j and step.type not in LOCAL_TYPES for (_, tb), row in zip(tbs, joined)
               for j, step in zip(row, tb.steps)):
        return _rebuild(program, tbs, joined)     # only local copies join: no connection to agree on
    # messages of each connection, at the sender and at the receiver: (tb index, step index) in order
    sent: dict[tuple[int, int, int], list] = {}
    received: dict[tuple[int, int, int], list] = {}
    for t, (gpu, tb) in enumerate(tbs):
        for k, step in enumerate(tb.steps):
            receives, sends, _, _ = STEP_TYPES.get(step.type, STEP_TYPES["nop"])
            if sends and tb.send >= 0:
                sent.setdefault((gpu, tb.send, tb.chan), []).append((t, k))
            if receives and tb.recv >= 0:
                received.setdefault((tb.recv, gpu, tb.chan), []).append((t, k))
    conns_of = [[] for _ in tbs]
    for key in set(sent) | set(received):
        for t, _ in sent.get(key, [])[:1] + received.get(key, [])[:1]:
            conns_of[t].append(key)
    pending = list(set(sent) | set(received))
    queued = set(pending)
    while pending:        # cut both ends where either end cuts, until every connection agrees
        key = pending.pop()
        queued.discard(key)
        changed = _agree(sent.get(key, []), received.get(key, []), joined)
        for t in changed:
            for other in conns_of[t]:
                if other not in queued:
                    queued.add(other)
                    pending.append(other)
    return _rebuild(program, tbs, joined)


def _local_joins(steps, max_cnt: int, strict: bool) -> list[bool]:
    """``out[k]``: step k may join step k-1 as far as this threadblock alone can tell (and the group stays within
    one ``max_cnt``-aligned block of destination offsets)."""
    out = [False] * len(steps)
    for k in range(1, len(steps)):
        a, b = steps[k - 1], steps[k]
        block = MAX_CNT if a.type in LOCAL_TYPES else max_cnt
        # a step others wait for (hasdep) must not take on a later wait: its flag would then be published only
        # after that wait, and the waiter's own chain can lead back to it (a cycle of hasdep waits)
        waits = b.depid == -1 or (not strict and not a.hasdep and b.depid == a.depid and b.deps >= a.deps)
        out[k] = (a.type == b.type and a.type != "nop" and a.type in STEP_TYPES and waits
                  and not (strict and a.hasdep) and a.srcbuf == b.srcbuf and a.dstbuf == b.dstbuf
                  and b.srcoff == a.srcoff + a.cnt and b.dstoff == a.dstoff + a.cnt
                  and b.dstoff // block == (b.dstoff + b.cnt - 1) // block
                  and a.dstoff // block == b.dstoff // block)
    return out


def _agree(senders: list, receivers: list, joined: list) -> set[int]:
    """Make message j joined to message j-1 at both ends or at neither; returns the tbs whose grouping changed."""
    changed = set()
    if len(senders) != len(receivers):   # an unmatched connection: the verdict reports it; merge nothing on it
        for t, k in senders + receivers:
            if joined[t][k]:
                joined[t][k] = False
                changed.add(t)
        return changed
    for j in range(1, len(senders)):
        (ts, ks), (tr, kr) = senders[j], receivers[j]
        at_sender = joined[ts][ks] and senders[j - 1] == (ts, ks - 1)
        at_receiver = joined[tr][kr] and receivers[j - 1] == (tr, kr - 1)
        if at_sender != at_receiver:
            for t, k in ((ts, ks), (tr, kr)):
                if joined[t][k]:
                    joined[t][k] = False
                    changed.add(t)
    return changed


def _rebuild(program: MscclProgram, tbs: list, joined: list) -> MscclProgram:
    """Steps grouped by ``joined``, with ``s`` and dependency indices renumbered. Threadblocks where nothing
    merged, and whose dependencies point at threadblocks where nothing merged, are kept as they are (most of a
    program that fits unmerged)."""
    merged = [any(row) for row in joined]
    if not any(merged):
        return program
    new_index = []      # per tb: old step index -> new step index (None: unchanged)
    for t, (_, tb) in enumerate(tbs):
        if not merged[t]:
            new_index.append(None)
            continue
        index, n = [], -1
        for k in range(len(tb.steps)):
            if not joined[t][k]:
                n += 1
            index.append(n)
        new_index.append(index)
    position = {(gpu, tb.id): t for t, (gpu, tb) in enumerate(tbs)}
    out_gpus = []
    t = 0
    for gpu in program.gpus:
        out_tbs = []
        touched = False
        for tb in gpu.tbs:
            targets = {position.get((gpu.id, st.depid)) for st in tb.steps if st.depid >= 0}
            if not merged[t] and not any(u is not None and merged[u] for u in targets):
                out_tbs.append(tb)
                t += 1
                continue
            touched = True
            steps: list[Step] = []
            for k, step in enumerate(tb.steps):
                deps = step.deps
                if step.depid >= 0:
                    u = position.get((gpu.id, step.depid))
                    if u is not None and new_index[u] is not None and 0 <= step.deps < len(new_index[u]):
                        deps = new_index[u][step.deps]
                if joined[t][k]:   # the group waits for its last dependency (the same tb's, latest)
                    last = steps[-1]
                    waits = step.depid >= 0
                    steps[-1] = Step(last.s, last.type, last.srcbuf, last.srcoff, last.dstbuf, last.dstoff,
                                     last.cnt + step.cnt, step.depid if waits else last.depid,
                                     deps if waits else last.deps, max(last.hasdep, step.hasdep), last.line)
                    continue
                steps.append(step if step.s == len(steps) and step.deps == deps
                             else Step(len(steps), step.type, step.srcbuf, step.srcoff, step.dstbuf, step.dstoff,
                                       step.cnt, step.depid, deps, step.hasdep, step.line))
            out_tbs.append(replace(tb, steps=tuple(steps)))
            t += 1
        out_gpus.append(replace(gpu, tbs=tuple(out_tbs)) if touched else gpu)
    return replace(program, gpus=tuple(out_gpus))
