"""The baseline table's budget: schedules are counted before they are built, skipped over the transfer budget
or past the deadline with the reason, and the table never ends up empty where a baseline applies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.model.topology import load_topology
from synth.solver.deadline import Deadline
from synth.synthesis.baselines import evaluate_baselines
from synth.synthesis.request import SynthesisRequest

MB = 1 << 20


def built(table) -> list[str]:
    return [f"{run.name}/c{run.chunks_per_way}" for run in table.runs]


def test_relayed_alltoall_over_the_budget_is_skipped_and_the_direct_one_built():
    # fully-connected-8 Alltoall: around the ring a chunk is relayed over 1..7 hops (224 transfers), directly 56
    heard = []
    table = evaluate_baselines("alltoall", load_topology("fully-connected-8"), MB, max_transfers=100,
                               progress=heard.append)
    assert built(table) == ["all-pairs/c1"]
    assert len(table.runs[0].schedule.transfers) == 56
    over = [r for r in table.reasons if "budget" in r]
    limits = "over the budget of 100 per baseline, 50 with more chunks than its fewest"
    assert over == [f"ring/c1, c2, c4: 224, 448, 896 transfers, {limits}",
                    f"bidir-ring/c1, c2, c4: 256, 512, 1024 transfers, {limits}",
                    f"multi-ring/c1, c2, c4: 408, 816, 1632 transfers, {limits}",
                    f"all-pairs/c2, c4: 112, 224 transfers, {limits}"]
    assert heard[:5] == [f"  baseline {r}" for r in over] + ["  baseline all-pairs/c1: building 56 transfers"]
    assert heard[5].startswith("  baseline all-pairs/c1: ") and heard[5].endswith(" us (56 transfers)")


def test_when_every_baseline_is_over_the_budget_the_cheapest_is_built_all_the_same():
    table = evaluate_baselines("alltoall", load_topology("fully-connected-8"), MB, max_transfers=10)
    assert built(table) == ["all-pairs/c1"]
    assert table.reasons[-1] == "all-pairs/c1: built all the same, no baseline has fewer transfers"
    assert table.best(runnable_only=True).name == "all-pairs"


def test_an_expired_deadline_builds_only_the_cheapest():
    table = evaluate_baselines("allgather", load_topology("ring-4"), MB, deadline=Deadline(0.0))
    # ring/c1 has 12 transfers; bidir-ring and multi-ring already 24 with one chunk per ring
    assert built(table) == ["ring/c1"]
    assert table.reasons[-1] == ("ring/c2, ring/c4, bidir-ring/c1, bidir-ring/c2, bidir-ring/c4, multi-ring/c1, "
                                 "multi-ring/c2, multi-ring/c4, shortest-path/c1, shortest-path/c2, shortest-path/c4: not built, "
                                 "the time limit was reached")


def test_a_deadline_passing_during_the_first_build_stops_after_it():
    now = [0.0]
    deadline = Deadline.after(5.0, clock=lambda: now[0])

    def hear(message):
        if message.endswith(" transfers)"):
            now[0] = 10.0       # the first baseline took 10 s

    table = evaluate_baselines("allgather", load_topology("ring-4"), MB, deadline=deadline, progress=hear)
    # the most promising is built first: both directions of the ring carry half the bytes of one
    assert built(table) == ["bidir-ring/c1"]
    assert table.reasons[-1] == ("ring/c1, ring/c2, ring/c4, bidir-ring/c2, bidir-ring/c4, multi-ring/c1, "
                                 "multi-ring/c2, multi-ring/c4, shortest-path/c1, shortest-path/c2, shortest-path/c4: not built, "
                                 "the time limit was reached")


def test_the_request_builds_its_baselines_within_its_search_deadline():
    request = SynthesisRequest(load_topology("ring-4"), "allgather", MB, deadline=Deadline(0.0))
    assert built(request.baselines) == ["ring/c1"]
    assert request.baselines.reasons[-1].endswith("not built, the time limit was reached")


def test_the_table_budget_gives_every_baseline_one_chunk_before_any_gets_more():
    # dgx1 Allgather: ring, recursive-doubling and shortest-path hold 56 transfers per chunk per rank, bidir-ring 112
    # and multi-ring (6 rings) 336 with one chunk per ring
    heard = []
    table = evaluate_baselines("allgather", load_topology("dgx1"), MB, max_transfers=240, max_table_transfers=400,
                               progress=heard.append)
    building = [m.split()[1].rstrip(":") for m in heard if "building" in m]
    us = {(run.name, run.chunks_per_way): run.report.time_us for run in table.runs}
    # one chunk each, least loaded busiest link first (bidir-ring halves the ring's); the second chunk goes to
    # the fastest with one chunk among those whose second chunk is within 120 transfers: recursive doubling
    # (21.7 us) before the ring (23.3 us), and the table's 400 transfers end there
    assert building == ["bidir-ring/c1", "ring/c1", "recursive-doubling/c1", "shortest-path/c1",
                        "recursive-doubling/c2"]
    assert us[("bidir-ring", 1)] < us[("recursive-doubling", 1)] < us[("ring", 1)]
    assert built(table) == ["ring/c1", "bidir-ring/c1", "recursive-doubling/c1", "recursive-doubling/c2",
                            "shortest-path/c1"]
    assert table.reasons[-1] == ("ring/c2, shortest-path/c2: not built, the baselines built hold 392 transfers and "
                                 "the budget of the table is 400")


def test_more_chunks_get_half_the_budget_of_the_fewest():
    # fully-connected-8 Allgather: ring c1 56 transfers, c2 112, c4 224; all-pairs the same
    table = evaluate_baselines("allgather", load_topology("fully-connected-8"), MB, max_transfers=120)
    assert {(r.name, r.chunks_per_way) for r in table.runs} >= {("ring", 1), ("all-pairs", 1)}
    assert all(r.chunks_per_way == 1 for r in table.runs)
    assert "ring/c2, c4: 112, 224 transfers, over the budget of 120 per baseline, 60 with more chunks than its " \
           "fewest" in table.reasons


def test_a_baseline_the_gpu_cannot_hold_is_skipped_and_a_relayed_one_built_instead():
    # 4 SMs: all-pairs needs a threadblock for each of 7 peers; the ring's 224 transfers are over the budget of 100,
    # but it is the cheapest baseline a GPU can hold
    topo = replace(load_topology("fully-connected-8"), sms_per_gpu=4)
    table = evaluate_baselines("alltoall", topo, MB, max_transfers=100)
    assert built(table) == ["ring/c1"]
    assert "all-pairs: rank 0 must receive from 7 peers, a threadblock each, and its GPU runs at most 4 threadblocks " \
           "(one per SM)" in table.reasons
    assert table.reasons[-1] == "ring/c1: built all the same, no baseline has fewer transfers"


def test_no_baseline_is_built_when_even_the_cheapest_is_over_the_table_budget():
    table = evaluate_baselines("alltoall", load_topology("fully-connected-8"), MB, max_transfers=10,
                               max_table_transfers=50)
    assert table.runs == ()
    assert table.reasons[-1] == ("none built: the fewest transfers, 56 of all-pairs/c1, are over the budget of the "
                                 "table (50) too")


def test_the_busiest_link_bound_that_orders_the_builds_is_below_every_replay():
    from synth.synthesis.baselines import BASELINES, _footprint

    for topo, collective in ((load_topology("dgx1"), "allreduce"), (load_topology("ndv2", nodes=2), "allgather"),
                             (load_topology("dgx-h100", 2, "rail"), "alltoall")):     # all-pairs crosses the spine
        for run in evaluate_baselines(collective, topo, 1 << 30, chunk_options=(1,)).runs:
            routes = BASELINES[run.name].routes(topo, collective, None)
            bound = _footprint(collective, topo, routes, None, 1 << 30).busiest_us
            assert 0 < bound <= run.report.time_us * (1 + 1e-9), (topo.name, collective, run.name)
    # ring-4 Allgather around one ring: each link carries 3 of the 4 quarters of 1 GB at 25 GB/s
    ring = BASELINES["ring"].routes(load_topology("ring-4"), "allgather", None)
    assert _footprint("allgather", load_topology("ring-4"), ring, None, 1 << 30).busiest_us == \
        pytest.approx(3 * (1 << 30) / 4 / 25e3, rel=1e-12)
