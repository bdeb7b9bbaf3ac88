"""The direct-exchange Allreduce: one traversal of the machine, within 10% of the alpha-diameter at 1 KB, simulated."""

from __future__ import annotations

import pytest

from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.model.topology import load_topology
from synth.schedule.replay import verify
from synth.synthesis.baselines import build_baseline, evaluate_baselines
from synth.synthesis.baselines.all_pairs import DIRECT_EXCHANGE, exchange_phases

KB = 1024


@pytest.mark.parametrize("name", ["dgx1", "ndv2-2node-tecc"])
def test_written_file_is_within_ten_percent_of_the_alpha_diameter(name):
    topo = load_topology(name)
    schedule = build_baseline(DIRECT_EXCHANGE, "allreduce", topo)
    assert schedule.collective.runs_at_power_of_two_sizes          # the runtime selects it at 1 KB
    bound = lower_bound("allreduce", topo, KB)
    assert bound.binding == "latency"
    replayed = verify(schedule, topo, KB).time_us                 # raises unless every rank holds the sum
    emitted = emit_verified_xml(schedule, topo, "executor", KB)   # executed in and out of place, race-checked
    assert bound.latency_us <= replayed <= emitted.simulated_us <= 1.1 * bound.latency_us
    assert 'inplace="1" outofplace="1"' in emitted.text


def test_phases_factor_the_ranks_into_linked_groups():
    topo = load_topology("dgx1")
    first, second = exchange_phases(topo, tuple(range(8)))
    for phase in (first, second):
        assert sorted(r for g in phase for r in g) == list(range(8))
        assert all(topo.link(a, b) for g in phase for a in g for b in g if a != b)
    # every group of one phase meets every group of the other exactly once: no contribution is added twice
    assert all(len(set(a) & set(b)) == 1 for a in first for b in second)
    assert exchange_phases(load_topology("dgx-h100"), tuple(range(8))) == (tuple([tuple(range(8))]),)


def test_two_nodes_exchange_node_sums_over_the_links_they_have():
    topo = load_topology("ndv2-2node-tecc")
    schedule = build_baseline(DIRECT_EXCHANGE, "allreduce", topo)
    crossing = {(t.src, t.dst) for t in schedule.transfers if topo.node_of(t.src) != topo.node_of(t.dst)}
    assert crossing == {(1, 8), (9, 0)}
    assert schedule.notes["cross_node_messages"] == 2


def test_the_node_total_is_copied_by_every_rank_that_holds_it():
    # TE-CCL's two DGX-2 nodes: the eight even GPUs of a node receive the other node's sum, and each copies the
    # total to one odd GPU (GPU 16 copying to all eight queued 8 KB at its one switch port: 3.58 us simulated)
    from synth.synthesis.baselines.all_pairs import _copy_tree

    topo = load_topology("dgx2-2node-tecc")
    tree = _copy_tree(topo, tuple(range(16, 32)), set(range(16, 32, 2)))
    assert tree == {v: (v - 1, 1) for v in range(17, 32, 2)}


@pytest.mark.parametrize("name, reason", [
    ("ring-8", "the ranks 0..7 of topology ring-8 neither form one linked group of at most 16 nor factor into two "
               "phases of such groups"),
    ("ndv2-4node-tecc", "no rank of 0..7 on topology ndv2-4node-tecc is linked from every other node, or one "
                        "cannot be reached from such a rank inside its node"),
])
def test_says_why_it_does_not_apply(name, reason):
    with pytest.raises(InputError) as info:
        build_baseline(DIRECT_EXCHANGE, "allreduce", load_topology(name))
    assert info.value.problem == reason


def test_it_is_the_fastest_runnable_baseline_at_1kb_on_dgx1():
    table = evaluate_baselines("allreduce", load_topology("dgx1"), KB)
    best = table.best(runnable_only=True)
    assert best.name == DIRECT_EXCHANGE       # so `synth solve` writes and simulates it at small sizes
    assert best.report.time_us < min(r.report.time_us for r in table.runs if r.name == "recursive-doubling")
