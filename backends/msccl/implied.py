"""Drop the dependencies a step already has through others (a transitive reduction per rank).

A step carries one dependency in its own fields (``depid``/``deps``); each further one costs a ``nop`` step in
front of it, and the runtimes' XML reader holds at most 4095 elements per rank. Many waits are implied: a GPU's
sends through one NVSwitch port are ordered (:func:`backends.msccl.lowering._order_shared_ports`), so the second
copy of a chunk to another peer waits for the first, which already waited for the chunk's arrival; waiting for the
arrival again is a ``nop`` that changes nothing (16 x dgx-h100 Allgather: 110 of 350 steps of a rank).

A threadblock runs its steps in order, and a step waited for has finished with every step before it in its
threadblock. So a dependency on step ``k`` of threadblock ``t`` is implied when one of the step's other waits (or
the step before it in its own threadblock) is on a step that itself, or an earlier step of its threadblock, waited
for step ``k`` of ``t`` or a later one. Dropping implied waits leaves the order of execution exactly as it was.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def drop_implied(by_tb: dict, keys: Sequence) -> int:
    """Remove from each op's ``deps`` the ops it follows through its other dependencies or its threadblock's
    earlier ops, looking one wait deep: ``d`` is implied when another dependency ``e`` (or the op's own
    threadblock) has, at or before ``e``, a step that waits for ``d``'s threadblock at ``d`` or later. ``by_tb[key]``
    lists a threadblock's ops in program order (each has ``deps``, a tuple of ops of other threadblocks of the
    rank). Returns how many dependencies were dropped.

    One wait deep is where the ``nop`` steps were (a port's second send waits for its first, which waited for the
    arrival); following waits further found a few more at many times the cost (16 x dgx-h100 Allreduce: 1.7 s of a
    3.4 s lowering)."""
    place = {id(op): (key, i) for key, ops in by_tb.items() for i, op in enumerate(ops)}
    waited = {key: _waited(ops, place) for key, ops in by_tb.items()}
    dropped = 0
    for key in keys:
        for i, op in enumerate(by_tb[key]):
            if len(op.deps) < 2:
                continue
            ends = [place[id(d)] for d in op.deps]
            gone = set()       # a dependency dropped vouches for no other (two waiting for each other: a cycle)
            for k, (td, idd) in enumerate(ends):
                if any(j >= 0 and ((te == td and j >= idd) or waited[te].get(td, _NONE).latest(j) >= idd)
                       for n, (te, j) in enumerate(ends + [(key, i - 1)]) if n != k and n not in gone):
                    gone.add(k)
            dropped += len(gone)
            op.deps = tuple(d for k, d in enumerate(op.deps) if k not in gone)
    return dropped


class _Waits:
    """For one threadblock and one other threadblock ``u``: the latest step of ``u`` its steps up to each index
    wait for directly."""

    def __init__(self):
        self.at: list[int] = []       # indices of the steps that wait on u
        self.upto: list[int] = []     # the latest step of u waited for by then

    def latest(self, index: int) -> int:
        k = bisect_right(self.at, index)
        return self.upto[k - 1] if k else -1


_NONE = _Waits()


def _waited(ops: list, place: dict) -> dict:
    """Per other threadblock, the :class:`_Waits` of a threadblock's ``ops``."""
    out: dict = {}
    for i, op in enumerate(ops):
        for d in op.deps:
            u, j = place[id(d)]
            w = out.setdefault(u, _Waits())
            if not w.upto or j > w.upto[-1]:
                w.at.append(i)
                w.upto.append(j)
    return out
