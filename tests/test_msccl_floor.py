"""The writer's floors: no file of a schedule simulates faster (the writer stops making variants at them)."""

from __future__ import annotations

import pytest

from backends.msccl.floor import chain_floor_us, schedule_floor_us, unmerged_floor_us
from backends.msccl.merge import merge_contiguous
from backends.msccl.simulate import simulate_program
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.ir import REDUCE, Schedule, Transfer
from synth.schedule.replay import replay_time
from synth.synthesis.baselines import build_baseline

from support.variants import unmerged_variants

SIZES = (1 << 10, 1 << 20, 1 << 30)


def _cases():
    ring, dgx1, a100 = load_topology("ring-4"), load_topology("dgx1"), load_topology("dgx-a100")
    cases = [(f"ring-4 {name} c{chunks} {coll}", ring, build_baseline(name, coll, ring, chunks))
             for name, coll, chunks in (("ring", "allgather", 2), ("bidir-ring", "allgather", 1),
                                        ("ring", "broadcast", 4), ("double-binary-tree", "broadcast", 2),
                                        ("shortest-path", "alltoall", 1), ("shortest-path", "scatter", 2))]
    cases += [("dgx1 ring c4 allgather", dgx1, build_baseline("ring", "allgather", dgx1, 4)),
              ("dgx1 trees c16 broadcast", dgx1, _trees(dgx1, "broadcast", 16)),
              ("dgx-a100 trees c4 allgather", a100, _trees(a100, "allgather", 4)),
              ("dgx-a100 ring c2 broadcast", a100, build_baseline("ring", "broadcast", a100, 2)),
              ("ring-4 ring c2 reducescatter", ring, build_baseline("ring", "reducescatter", ring, 2)),
              ("dgx1 trees c16 reduce", dgx1, _trees(dgx1, "reduce", 16)),
              ("dgx-a100 ring c2 reduce", a100, build_baseline("ring", "reduce", a100, 2))]
    return cases


def _trees(topology, collective, chunks):
    from synth.synthesis.trees import synthesize_trees
    return synthesize_trees(topology, collective, 1 << 20, chunks=chunks).schedule


@pytest.fixture(scope="module")
def cases():
    return _cases()


def test_no_unmerged_file_simulates_faster_than_the_unmerged_floor(cases):
    checked = 0
    for name, topology, schedule in cases:
        variants = unmerged_variants(schedule, topology)
        for size in SIZES:
            floor = unmerged_floor_us(schedule, topology, size)
            assert floor >= schedule_floor_us(schedule, topology, size)
            for variant in variants:
                simulated = simulate_program(variant.program, topology, size).time_us
                assert floor <= simulated * (1 + 1e-9), (name, size, variant.lowering.label)
                checked += 1
    assert checked > 50


def test_no_file_merged_or_not_simulates_faster_than_the_chain_floor(cases):
    checked = 0
    for name, topology, schedule in cases[:8]:
        for variant in unmerged_variants(schedule, topology)[:3]:
            for program in (variant.program, merge_contiguous(variant.program, 4), merge_contiguous(variant.program)):
                for size in SIZES:
                    floor = chain_floor_us(schedule, topology, size)
                    assert floor <= simulate_program(program, topology, size).time_us * (1 + 1e-9), (name, size)
                    checked += 1
    assert checked > 50
    # where alphas dominate it says more than the loads: a chunk crosses three links of ring-4 one after another
    ring = load_topology("ring-4")
    chain = build_baseline("ring", "broadcast", ring, 4)
    assert chain_floor_us(chain, ring, 1 << 10) >= 3 * ring.link(0, 1).alpha_us > schedule_floor_us(chain, ring, 1 << 10)


def test_the_unmerged_floor_is_never_above_the_plan(cases):
    # the replay is one timing of the schedule's messages that the floor bounds (the writer relies on it)
    for name, topology, schedule in cases:
        for size in SIZES:
            plan = replay_time(schedule, topology, size).time_us
            assert unmerged_floor_us(schedule, topology, size) <= plan * (1 + 1e-9), (name, size)


def test_a_pipelined_chain_is_bounded_by_its_fill_and_drain():
    # 64 pieces down 0 -> 1 -> 2 -> 3: the loads alone miss the two hops the last piece still has to go
    chain = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(64) for r in range(3))
    schedule = Schedule(make_collective("broadcast", 4, 64, 0), "ring-4", chain, 66)
    ring = load_topology("ring-4")
    plan = replay_time(schedule, ring, 1 << 30).time_us
    assert unmerged_floor_us(schedule, ring, 1 << 30) == pytest.approx(plan, rel=1e-12)
    assert schedule_floor_us(schedule, ring, 1 << 30) < plan * 0.97


def test_a_reduction_chain_is_bounded_by_its_fill_and_drain():
    # the same chain reversed: each rank adds its piece and passes the partial sum on, 0 must end with the sum
    chain = tuple(Transfer(c, r + 1, r, step=c + 2 - r, op=REDUCE) for c in range(64) for r in range(3))
    schedule = Schedule(make_collective("reduce", 4, 64, 0), "ring-4", chain, 66)
    ring = load_topology("ring-4")
    plan = replay_time(schedule, ring, 1 << 30).time_us
    assert unmerged_floor_us(schedule, ring, 1 << 30) == pytest.approx(plan, rel=1e-12)


def test_an_allreduce_whose_ranks_all_end_with_every_sum_gets_the_load_floor():
    # every rank must end with each chunk's sum: no message is forced to carry anything on
    dgx1 = load_topology("dgx1")
    schedule = build_baseline("ring", "allreduce", dgx1, 2)
    assert unmerged_floor_us(schedule, dgx1, 1 << 30) == pytest.approx(schedule_floor_us(schedule, dgx1, 1 << 30),
                                                                     rel=1e-12)
