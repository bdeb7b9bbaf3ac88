"""Implied dependencies dropped (backends/msccl/implied.py): fewer nop steps, the same order of execution."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

import backends.msccl.lowering as lowering
from backends.msccl.implied import drop_implied
from backends.msccl.interpret import execute_program
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.simulate import simulate_program
from synth.model.topology import load_topology
from synth.synthesis import hierarchy


@dataclass(eq=False)
class Op:
    name: str
    deps: tuple = field(default=())


def test_a_wait_the_other_waits_already_cover_is_dropped():
    arrive, first, second = Op("arrive"), Op("first copy"), Op("second copy")
    first.deps = (arrive,)
    second.deps = (arrive, first)      # the first copy already waited for the arrival
    by_tb = {"recv": [arrive], "send a": [first], "send b": [second]}
    assert drop_implied(by_tb, list(by_tb)) == 1
    assert second.deps == (first,) and first.deps == (arrive,)


def test_a_wait_on_an_earlier_step_of_a_threadblock_already_waited_for_is_dropped():
    a0, a1, b = Op("a0"), Op("a1"), Op("b")
    b.deps = (a0, a1)                  # a1 runs after a0 in its threadblock
    assert drop_implied({"a": [a0, a1], "b": [b]}, ["a", "b"]) == 1
    assert b.deps == (a1,)


def test_of_two_waits_that_vouch_for_each_other_one_stays():
    a, b, c = Op("a"), Op("b"), Op("c")
    a.deps, b.deps, c.deps = (b,), (a,), (a, b)      # a cycle (the verdict reports its deadlock)
    assert drop_implied({"a": [a], "b": [b], "c": [c]}, ["a", "b", "c"]) == 1
    assert c.deps == (b,)


def _lowered(monkeypatch, schedule, topology, pruned: bool):
    if not pruned:
        monkeypatch.setattr(lowering, "drop_implied", lambda by_tb, keys: 0)
    program = lower_to_msccl(schedule, topology, 1 << 30, fuse=True)
    monkeypatch.undo()
    return program


@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_the_program_runs_as_before_with_fewer_nops(monkeypatch, collective):
    topology = load_topology("dgx-h100", 4, "rail")
    schedule = hierarchy.compose(topology, collective, hierarchy.hierarchy_plans(topology, collective, 1 << 30)[0],
                                 1 << 30)
    before = _lowered(monkeypatch, schedule, topology, pruned=False)
    after = _lowered(monkeypatch, schedule, topology, pruned=True)
    nops = [Counter(s.type for g in p.gpus for tb in g.tbs for s in tb.steps)["nop"] for p in (before, after)]
    assert nops[1] < nops[0] * 0.5, nops
    assert execute_program(after, collective).ok
    assert simulate_program(after, topology, 1 << 30).time_us == pytest.approx(
        simulate_program(before, topology, 1 << 30).time_us, rel=1e-9)
