"""The step frontier (synth.sweep.frontier), its rounds-per-chunk bound, the per-size choice and the bundle."""

from fractions import Fraction

import pytest

from synth.sweep.bundle import BundlePlan, readme_text, write_bundle
from synth.solver.highs import NO_SOLUTION
from synth.sweep.frontier import (FEASIBLE, IMPLIED, INFEASIBLE, STOP_CHUNK_CAP, STOP_LOWER_BOUND, Instance,
                          SweepPoint, instances_to_try, explore_frontier, implied_infeasible, pareto_filter, plan_sweep)
from synth.bounds.rounds import rounds_per_chunk_bound
from synth.errors import InputError
from synth.sweep.sizes import (BASELINE, STEPS, Algorithm, choose_per_size, parse_size_range, runnable, size_grid,
                            tile_ranges)
from synth.synthesis.steps import synthesize_steps
from synth.model.topology import load_topology
from synth.sweep.workers import local_pool

DGX1_FRONTIER = {"allgather": [(2, 3, 2), (3, 7, 6)], "reducescatter": [(2, 3, 2), (3, 7, 6)]}


def pt(steps, rounds, chunks, status=FEASIBLE):
    return SweepPoint(steps, rounds, chunks, status)


def triples(points):
    return [(p.steps, p.rounds, p.chunks) for p in points]


def without_timings(points):
    return [{k: v for k, v in p.to_dict().items() if not k.endswith("_seconds")} for p in points]


# ------------------------------------------------------------------------------------------ pareto_filter (pure)

def test_filter_prunes_dominated_points_and_sorts_by_steps():
    pts = [pt(3, 7, 6), pt(2, 3, 2), pt(3, 3, 2), pt(4, 7, 6), pt(2, 2, 1), pt(5, 6, 6)]
    assert triples(pareto_filter(pts)) == [(2, 3, 2), (3, 7, 6), (5, 6, 6)]


def test_filter_keeps_fewest_chunks_among_equal_points():
    assert triples(pareto_filter([pt(2, 6, 4), pt(2, 3, 2), pt(2, 9, 6)])) == [(2, 3, 2)]


def test_filter_ignores_infeasible_and_unknown_points():
    pts = [pt(2, 7, 6, INFEASIBLE), pt(2, 3, 2), pt(3, 6, 6, NO_SOLUTION)]
    assert triples(pareto_filter(pts)) == [(2, 3, 2)]
    assert pareto_filter([]) == ()


def test_filter_result_is_an_antichain():
    pts = [pt(s, r, c) for s in range(2, 5) for c in range(1, 4) for r in range(s, 8)]
    kept = pareto_filter(pts)
    for a in kept:
        for b in kept:
            if a is not b:
                assert not (a.steps <= b.steps and a.ratio <= b.ratio)
    best = {}
    for p in pts:
        best[p.steps] = min(best.get(p.steps, p.ratio), p.ratio)
    assert [(p.steps, p.ratio) for p in kept] == [(2, Fraction(2, 3))]


# ------------------------------------------------------------------------------------------ search pieces

def test_candidates_are_in_ratio_order_within_bounds():
    from synth.sweep.frontier import SweepSpec

    spec = SweepSpec("allgather", None, 2, 4, 8, 7 / 6)
    got = list(instances_to_try(spec, 3, Fraction(3, 2)))
    assert got[0] == Instance(3, 7, 6)
    assert all(Fraction(7, 6) <= i.ratio < Fraction(3, 2) and i.rounds >= 3 and i.chunks <= 8 for i in got)
    assert [i.ratio for i in got] == sorted(i.ratio for i in got)


def test_allreduce_candidates_have_even_rounds():
    from synth.sweep.frontier import SweepSpec

    spec = SweepSpec("allreduce", None, 4, 8, 6, 7 / 3)
    assert all(i.rounds % 2 == 0 for i in instances_to_try(spec, 4, Fraction(4)))


@pytest.mark.parametrize("inst, known, implied", [
    (Instance(2, 5, 4), Instance(2, 6, 4), True),      # fewer rounds never help
    (Instance(2, 4, 11), Instance(2, 4, 10), True),    # more chunks never help
    (Instance(2, 3, 4), Instance(2, 7, 8), True),      # splitting each chunk in two
    (Instance(2, 7, 4), Instance(2, 6, 4), False),
    (Instance(2, 4, 9), Instance(2, 4, 10), False),
    (Instance(3, 3, 4), Instance(2, 7, 8), False),     # another step count
])
def test_implied_infeasible(inst, known, implied):
    assert (implied_infeasible(inst, [known]) is not None) == implied


def test_implications_hold_on_the_solver(dgx1):
    """(2,7,6) infeasible implies (2,7,7) and (2,3,3) infeasible; check both against HiGHS."""
    from synth.errors import InfeasibleError

    for steps, rounds, chunks in [(2, 7, 6), (2, 7, 7), (2, 3, 3)]:
        with pytest.raises(InfeasibleError):
            synthesize_steps(dgx1, "allgather", steps, rounds, chunks)


@pytest.mark.parametrize("name, bound", [("allgather", Fraction(7, 6)), ("reducescatter", Fraction(7, 6)),
                                         ("alltoall", Fraction(8, 3)), ("broadcast", Fraction(1, 6)),
                                         ("gather", Fraction(7, 6)), ("allreduce", Fraction(7, 3))])
def test_rounds_per_chunk_bound_on_dgx1(dgx1, name, bound):
    assert rounds_per_chunk_bound(dgx1, name) == pytest.approx(float(bound), rel=1e-7)


def test_rounds_bound_counts_a_shared_nic():
    """Two NDv2 nodes share one NIC each way: 8 chunks per node must cross it, one per round."""
    assert rounds_per_chunk_bound(load_topology("ndv2", 2), "allgather") == pytest.approx(8.0)


def test_plan_sweep_defaults_and_errors(dgx1):
    spec = plan_sweep(dgx1, "allreduce")
    assert (spec.min_steps, spec.step_stride) == (4, 2)
    with pytest.raises(InputError, match="--max-steps"):
        plan_sweep(dgx1, "allgather", max_steps=1)
    with pytest.raises(InputError, match="--max-chunks"):
        plan_sweep(dgx1, "allgather", max_chunks=0)


# ------------------------------------------------------------------------------------------ frontiers

@pytest.mark.parametrize("name", sorted(DGX1_FRONTIER))
def test_dgx1_frontier_is_exact(dgx1, name):
    f = explore_frontier(dgx1, plan_sweep(dgx1, name))     # speed: benchmarks/bench_pareto.py
    assert triples(f.frontier) == DGX1_FRONTIER[name]
    assert f.complete and f.stop_reason == STOP_LOWER_BOUND
    # every point with fewer steps and a lower ratio than a frontier point was proven infeasible
    for p in f.points:
        assert p.status in (FEASIBLE, INFEASIBLE)
    assert {(p.steps, p.rounds, p.chunks) for p in f.points if p.status == INFEASIBLE} >= {(2, 7, 6), (2, 4, 3)}


def test_frontier_schedules_verify(dgx1):
    from synth.schedule.replay import verify

    f = explore_frontier(dgx1, plan_sweep(dgx1, "allgather"))
    for p in f.frontier:
        assert p.schedule.steps == p.steps and p.schedule.rounds == p.rounds
        assert verify(p.schedule, dgx1, 1 << 20).time_us > 0


@pytest.mark.parametrize("name, frontier", [("alltoall", [(2, 8, 3)]), ("gather", [(2, 7, 6)])])
def test_dgx1_alltoall_and_gather_reach_the_cut_bound(dgx1, name, frontier):
    f = explore_frontier(dgx1, plan_sweep(dgx1, name))
    assert triples(f.frontier) == frontier and f.complete


def test_dgx1_allreduce_frontier(dgx1):
    f = explore_frontier(dgx1, plan_sweep(dgx1, "allreduce"))
    assert triples(f.frontier) == [(4, 6, 2), (6, 14, 6)] and f.complete


@pytest.mark.slow
def test_dgx1_broadcast_frontier_with_chunk_cap_16(dgx1):
    f = explore_frontier(dgx1, plan_sweep(dgx1, "broadcast", max_chunks=16))
    assert triples(f.frontier) == [(2, 2, 2), (3, 5, 12), (4, 4, 13)]
    assert f.complete and f.stop_reason == STOP_CHUNK_CAP


def test_chunk_cap_stops_the_search(ring4):
    f = explore_frontier(ring4, plan_sweep(ring4, "broadcast", max_chunks=3))
    assert f.complete and f.stop_reason in (STOP_CHUNK_CAP, STOP_LOWER_BOUND)
    assert f.frontier and all(p.chunks <= 3 for p in f.points)


def test_implied_points_are_reported(dgx1):
    f = explore_frontier(dgx1, plan_sweep(dgx1, "reduce"))
    assert triples(f.frontier) == [(2, 2, 2), (3, 3, 7)]
    assert any(p.how == IMPLIED and p.implied_by is not None for p in f.points)


def test_time_limit_gives_unknown_and_an_unproven_frontier(dgx1, monkeypatch):
    from synth.sweep import frontier as pareto
    from synth.errors import NoSolutionError

    real = pareto.synthesize_steps

    def flaky(topology, name, steps, rounds, chunks, *args):
        if (steps, rounds, chunks) == (2, 4, 3):
            raise NoSolutionError("time limit")
        return real(topology, name, steps, rounds, chunks, *args)

    monkeypatch.setattr(pareto, "synthesize_steps", flaky)
    f = explore_frontier(dgx1, plan_sweep(dgx1, "allgather"))
    assert any(p.status == NO_SOLUTION for p in f.points)
    assert not f.complete


def test_process_pool_gives_the_same_points(dgx1):
    spec = plan_sweep(dgx1, "allgather")
    serial = explore_frontier(dgx1, spec)
    with local_pool(2) as (executor, slots):
        parallel = explore_frontier(dgx1, spec, executor, slots)
    assert without_timings(parallel.points) == without_timings(serial.points)
    assert triples(parallel.frontier) == triples(serial.frontier)


# ------------------------------------------------------------------------------------------ sizes and bundle

def test_size_grid_and_range_parsing():
    assert size_grid(1024, 1 << 30, 4)[-1] == 1 << 30 and len(size_grid(1024, 1 << 30, 4)) == 11
    assert len(size_grid(1024, 1 << 30, 2)) == 21
    assert size_grid(1000, 5000, 2) == (1000, 2000, 4000, 5000)
    assert parse_size_range("64KB:1GB") == (65536, 1 << 30)
    with pytest.raises(InputError, match="--sizes"):
        parse_size_range("1GB:1KB")
    with pytest.raises(InputError, match="--sizes"):
        parse_size_range("1GB")


@pytest.fixture(scope="module")
def dgx1_steps():
    """DGX-1 Allgather (2,3,2) (latency) and (3,7,6) (bandwidth), and a grid where both can run (x 192 B)."""
    topo = load_topology("dgx1")
    algs = [Algorithm(f"steps-{s}-{r}-{c}", STEPS, f"steps ({s},{r},{c})",
                      synthesize_steps(topo, "allgather", s, r, c).schedule) for s, r, c in [(2, 3, 2), (3, 7, 6)]]
    return topo, algs, size_grid(3 << 10, 3 << 28, 4)


def test_runnable_follows_nchunksperloop(ring4):
    alg = Algorithm("x", STEPS, "x", synthesize_steps(ring4, "allgather", 3, 6, 3).schedule)
    assert alg.nchunksperloop == 12
    assert not runnable(alg, 1 << 20) and runnable(alg, 12 * 4 * 1000)


def test_ranges_tile_the_size_range_at_the_crossover(dgx1_steps):
    from synth.schedule.replay import verify

    topo, algs, sizes = dgx1_steps
    choices = choose_per_size(algs, topo, sizes)
    assert [c.chosen for c in (choices[0], choices[-1])] == ["steps-2-3-2", "steps-3-7-6"]
    ranges = tile_ranges(choices, algs, topo, sizes[0], sizes[-1])
    assert ranges[0].min_bytes == sizes[0] and ranges[-1].max_bytes == sizes[-1]
    by_key = {a.key: a for a in algs}

    def t(key, size):
        return verify(by_key[key].schedule, topo, size).time_us

    for a, b in zip(ranges, ranges[1:]):
        assert b.min_bytes == a.max_bytes + 1 and a.key != b.key
        assert t(b.key, b.min_bytes) <= t(a.key, b.min_bytes)     # the crossover, to the byte
        assert t(b.key, a.max_bytes) > t(a.key, a.max_bytes)


def test_choice_is_never_slower_than_a_runnable_baseline(ring4):
    from synth.synthesis.baselines import build_baseline

    algs = [Algorithm("steps-2-3-2", STEPS, "steps", synthesize_steps(ring4, "allgather", 2, 3, 2).schedule),
            Algorithm("baseline-ring-c4", BASELINE, "ring", build_baseline("ring", "allgather", ring4, 4))]
    for c in choose_per_size(algs, ring4, size_grid(1024, 1 << 30, 2)):
        base = c.timing(c.best_baseline)
        assert c.timing(c.chosen).time_us <= base.time_us or not base.runnable


def test_bundle_files_and_readme(dgx1_steps, tmp_path):
    from synth.sweep.bundle import plan_bundle

    topo, algs, sizes = dgx1_steps
    plan = plan_bundle(algs, topo, sizes, sizes[0], sizes[-1])
    assert isinstance(plan, BundlePlan) and len(plan.files) == len(plan.ranges) == 2 and not plan.excluded
    stale = tmp_path / "msccl" / "07-allgather-old.xml"
    stale.parent.mkdir()
    stale.write_text("<algo/>")
    keep = tmp_path / "msccl" / "notes.xml"
    keep.write_text("mine")
    readme = readme_text(plan, algs, "allgather", topo, "executor")
    write_bundle(tmp_path, plan, readme)
    assert not stale.exists() and keep.exists()
    assert sorted(p.name for p in (tmp_path / "msccl").glob("0*.xml")) == [f.file_name for f in plan.files]
    text = (tmp_path / "README.txt").read_text()
    assert "MSCCL_ALGO_DIR" in text and "all_gather_perf -b 3K -e 768M" in text
    for f in plan.files:
        assert f'minBytes="{f.min_bytes}"' in f.text and f'maxBytes="{f.max_bytes_attribute}"' in f.text
    assert [f.max_bytes_attribute for f in plan.files] == [plan.files[0].max_bytes, 0]   # the top: no limit
    assert "and up" in text


def test_legacy_bundle_ranges_select_every_size_they_claim(dgx1_steps):
    """Legacy selects minBytes <= nBytes < maxBytes: each file's maxBytes is one past its range, the top one
    the largest int64; every claimed edge size is selected by exactly one file."""
    from backends.msccl.parse import parse_msccl_xml
    from backends.msccl.selection import INT64_MAX
    from synth.sweep.bundle import plan_bundle

    topo, algs, sizes = dgx1_steps
    plan = plan_bundle(algs, topo, sizes, sizes[0], sizes[-1], target="legacy")
    programs = [parse_msccl_xml(f.text, f.file_name)[0] for f in plan.files]
    assert [p.max_bytes for p in programs] == [f.max_bytes + 1 for f in plan.files[:-1]] + [INT64_MAX]
    for size in {f.min_bytes for f in plan.files} | {f.max_bytes for f in plan.files} | {sizes[-1] * 4}:
        chosen = [f for f, p in zip(plan.files, programs) if p.min_bytes <= size < p.max_bytes]
        assert len(chosen) == 1, size


def test_plot_skips_algorithms_left_out_of_the_choice(dgx1_steps, tmp_path):
    pytest.importorskip("matplotlib")
    from synth.sweep.plot import plot_size_frontier

    topo, algs, sizes = dgx1_steps
    choices = choose_per_size(algs[:1], topo, sizes, limit_us=lambda size: 1.0 + size / 2e5)
    paths = plot_size_frontier(choices, algs, tmp_path / "frontier", "test")
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size > 1000 for p in paths)


def test_under_a_sketch_the_step_and_gathered_algorithms_compete_only_where_they_keep_to_it():
    from synth.model.collectives import make_collective
    from synth.schedule.ir import Schedule, Transfer
    from synth.sweep.sources import _keeping_to_sketch

    topo = load_topology("ndv2", 2)     # ndv2-nic-relay: only GPU 1 of a node sends across, to GPU 0
    bcast = make_collective("broadcast", 16, 1, 0)

    def sending(key, kind, src, dst):
        schedule = Schedule(bcast, topo.name, (Transfer(0, src, dst, 0),), 1, None, None, key)
        return Algorithm(key, kind, key, schedule)

    notes = []
    kept = _keeping_to_sketch([sending("across-1", STEPS, 1, 8), sending("across-0", STEPS, 0, 8),
                               sending("runtime", BASELINE, 0, 8)], "ndv2-nic-relay", topo, notes.append)
    assert [a.key for a in kept] == ["across-1", "runtime"]
    assert notes == ["1 step or gathered algorithm(s) left out: they do not keep to the sketch ndv2-nic-relay"]
