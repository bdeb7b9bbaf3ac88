"""The step-level interpreter: shared reference files, hand-built programs per collective, seeded faults.

The program builders, mutation operators and fuzzing strategies live in ``tests/support`` (also used by
``test_simulate.py`` and ``benchmarks/bench_mutants.py``); the third-party files skip when ../shared/data is absent.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.msccl.ir import Gpu, MscclProgram
from backends.msccl.interpret import execute_program
from support.mutants import drop_step, mutant_sweep, replace_step, replace_tb, swap_steps
from support.programs import (BUILDERS, P, S, T, chain_broadcast, chain_reduce, direct_alltoall, ring_allgather,
                              ring_allreduce)
from support.shared import INVALID_FILE, VALID_FILES, load_shared
from support.strategies import TB_STRATEGY


# ----------------------------------------------------------------------------------------------- helpers

def kinds(result) -> set[str]:
    return {f.kind for f in result.errors()}


def messages(result, kind: str) -> list[str]:
    return [f.message for f in result.errors() if f.kind == kind]


# ----------------------------------------------------------------------------------------------- shared files

@pytest.mark.parametrize("name", VALID_FILES)
def test_shared_valid_files_are_valid(name):
    result = execute_program(load_shared(name))
    assert result.ok, [str(f) for f in result.errors()[:3]]
    assert result.completed and result.deadlocks_at_runtime_depth is False
    assert result.deadlock_cycle == ()


def test_shared_invalid_file_names_the_double_reduced_chunks():
    result = execute_program(load_shared(INVALID_FILE))
    assert not result.ok
    post = messages(result, "postcondition")
    assert len(post) == 512  # msccl-tools' own check reports 512 wrong chunks
    # half are reduced twice (a scratch chunk re-added by a fused `re`), half get another chunk's data
    assert sum("counted too often" in m for m in post) == 256
    assert "allreduce output o[0] of rank 0 contributions counted too often: rank 1's i[0] (2x)" in post[0]
    # it also needs more than one message in flight on some connections, but not more than LL's 8
    assert result.deadlocks_at_runtime_depth is False and "deadlock" in kinds(result)


def test_rendezvous_sends_reject_the_ring_allgather_that_depth_one_accepts():
    program = load_shared("allgather_ring_8gpu_1ch_1inst.xml")
    assert execute_program(program, fifo_depth=1).ok
    rendezvous = execute_program(program, fifo_depth=0)
    assert "deadlock" in kinds(rendezvous) and len(rendezvous.deadlock_cycle) == 8


def test_inplace_allgather_outputs_hold_every_rank_chunk():
    result = execute_program(load_shared("allgather_ring_8gpu_1ch_1inst.xml"))
    assert result.collective.chunks_per_rank == 1
    assert all(result.outputs[(r, k)] == Counter({(k, 0): 1}) for r in range(8) for k in range(8))


# ----------------------------------------------------------------------------------------------- each collective

@pytest.mark.parametrize("coll", sorted(BUILDERS))
def test_hand_built_program_implements_its_collective(coll):
    program = BUILDERS[coll]()
    result = execute_program(program)
    assert result.ok, [str(f) for f in result.findings]
    assert result.collective.name == coll


def test_out_of_place_allgather_and_llproto_are_valid():
    assert execute_program(ring_allgather(5, inplace=False)).ok
    assert execute_program(ring_allgather(3, proto="LL128")).ok


def test_reduce_reports_partial_sums_exactly():
    result = execute_program(chain_reduce(4))
    assert result.outputs[(0, 0)] == Counter({(r, 0): 1 for r in range(4)})


def test_rooted_collective_root_is_inferred_from_the_data():
    # a broadcast whose root is rank 2: relabel ranks of the chain (0 -> 2, 2 -> 0)
    relabel = {0: 2, 1: 1, 2: 0, 3: 3}
    base = chain_broadcast(4)
    gpus = []
    for g in base.gpus:
        tbs = tuple(dataclasses.replace(tb, send=relabel.get(tb.send, -1), recv=relabel.get(tb.recv, -1))
                    for tb in g.tbs)
        gpus.append(dataclasses.replace(g, id=relabel[g.id], tbs=tbs))
    program = dataclasses.replace(base, gpus=tuple(sorted(gpus, key=lambda g: g.id)))
    result = execute_program(program)
    assert result.ok and result.collective.root == 2


def test_custom_collective_reports_what_each_output_holds():
    result = execute_program(ring_allgather(3, inplace=False), collective="custom")
    assert result.ok and result.collective is None
    assert result.outputs[(0, 2)] == Counter({(2, 0): 1})


def test_multi_chunk_messages_move_consecutive_chunks():
    gpus = {0: [T(1, -1, 0, S("s", "i0", "o0", cnt=2))], 1: [T(-1, 0, 0, S("r", "o0", "o0", cnt=2))]}
    result = execute_program(P("custom", gpus, 2, (2, 2, 0)), collective="custom")
    assert result.outputs[(1, 0)] == Counter({(0, 0): 1}) and result.outputs[(1, 1)] == Counter({(0, 1): 1})


def test_local_reduce_adds_source_into_destination():
    gpus = {0: [T(-1, -1, 0, S("cpy", "i0", "o0"), S("re", "i1", "o0"))], 1: [T(-1, -1, 0)]}
    result = execute_program(P("custom", gpus, 2, (2, 1, 0)), collective="custom")
    assert result.outputs[(0, 0)] == Counter({(0, 0): 1, (0, 1): 1})


# ----------------------------------------------------------------------------------------------- seeded faults

def test_dropped_receive_leaves_messages_unreceived_and_outputs_missing():
    result = execute_program(drop_step(ring_allgather(4), 1, 0, 3))
    assert "unmatched" in kinds(result) and "postcondition" in kinds(result)
    assert any("o[2] of rank 1 holds nothing" in m for m in messages(result, "postcondition"))


def test_both_ends_receiving_first_is_a_deadlock_with_its_cycle():
    program = direct_alltoall(3)
    for gpu, tb in ((0, 1), (1, 1)):   # gpu 0's tb to gpu 1 and gpu 1's tb to gpu 0
        program = swap_steps(program, gpu, tb, 0, 1)
    result = execute_program(program)
    assert result.deadlocks_at_runtime_depth is True
    assert set(result.deadlock_cycle) == {(0, 1, 0), (1, 1, 0)}
    (msg,) = messages(result, "deadlock")
    assert "gpu 0 tb 1 step 0 (r) waits for a message from gpu 1" in msg
    assert "also deadlocks with the runtime's FIFO depth 2" in msg


def test_every_tb_receiving_first_in_a_ring_is_a_cycle_through_all_ranks():
    program = ring_allgather(4)
    for r in range(4):
        program = swap_steps(program, r, 0, 0, 1)
    result = execute_program(program)
    assert len(result.deadlock_cycle) == 4 and "deadlock" in kinds(result)


def test_changed_peer_is_a_connection_problem():
    result = execute_program(replace_tb(ring_allgather(4), 0, 0, send=2))
    assert "connection" in kinds(result)
    assert any("gpu 2 has no tb receiving from gpu 0" in m for m in messages(result, "connection"))


def test_changed_offset_names_the_wrong_output():
    result = execute_program(replace_step(ring_allgather(4), 2, 0, 3, dstoff=0))
    post = messages(result, "postcondition")
    assert any("o[3] of rank 2 holds nothing" in m for m in post)
    assert any("o[0] of rank 2" in m and "do not belong" in m for m in post)


def test_offset_beyond_the_buffer_is_a_finding_not_an_exception():
    result = execute_program(replace_step(ring_allgather(4), 0, 0, 0, srcoff=7))
    assert any("o[7:8], but o has 4 chunk(s)" in m for m in messages(result, "out-of-range"))
    result = execute_program(replace_step(ring_allgather(4), 0, 0, 0, srcbuf="x"))
    assert "out-of-range" in kinds(result)


def test_changed_cnt_is_a_count_mismatch():
    result = execute_program(replace_step(ring_allgather(4), 0, 0, 0, cnt=2))
    assert any("receives cnt 1, but the matching send (gpu 0 tb 0 step 0) has cnt 2" in m
               for m in messages(result, "count"))


def test_missing_dependency_is_a_race_with_both_locations():
    program = load_shared("simple_allgather_ring_4gpu.xml")
    result = execute_program(replace_step(program, 0, 2, 0, depid=-1, deps=-1))
    (msg,) = messages(result, "race")
    assert "tb 0 step 0 (cpy) and tb 2 step 0 (s) may run concurrently and one writes and the other reads o[0]" in msg


def test_dependency_on_the_wrong_tb_is_caught():
    program = load_shared("simple_allgather_ring_4gpu.xml")
    # tb 1 never publishes a flag: the send waits forever
    result = execute_program(replace_step(program, 0, 2, 0, depid=1))
    assert any("waits for tb 1 to publish a step >= 0" in m for m in messages(result, "deadlock"))
    # tb 3 publishes one, but it does not order the send after the cpy of tb 0
    program = replace_step(program, 0, 3, 0, hasdep=1)
    result = execute_program(replace_step(program, 0, 2, 0, depid=3))
    assert any("tb 0 step 0 (cpy) and tb 2 step 0 (s)" in m for m in messages(result, "race"))


def test_removed_hasdep_is_a_deadlock_waiting_for_a_flag():
    result = execute_program(replace_step(chain_broadcast(4), 0, 0, 0, hasdep=0))
    (msg,) = messages(result, "deadlock")
    assert "gpu 0 tb 1 step 0 (s) waits for tb 0 to publish a step >= 0" in msg and "has finished" in msg


def test_dependency_on_a_missing_tb_is_reported():
    result = execute_program(replace_step(chain_broadcast(4), 0, 1, 0, depid=9))
    assert "dependency" in kinds(result)


def test_deadlock_only_without_buffering_is_told_apart_from_a_runtime_hang():
    # both ends send twice before receiving: needs two messages in flight
    tb = T(1, 1, 0, S("s", "i0", "o0"), S("s", "i1", "o1"), S("r", "i0", "o0"), S("r", "i1", "o1"))
    gpus = {0: [tb], 1: [dataclasses.replace(tb, send=0, recv=0)]}
    program = P("custom", gpus, 2, (2, 2, 0))
    result = execute_program(program, collective="custom")
    assert result.deadlocks_at_runtime_depth is False and not result.ok
    assert "relies on FIFO buffering" in messages(result, "deadlock")[0]
    assert execute_program(program, collective="custom", fifo_depth=2).ok


def test_program_claiming_both_modes_is_checked_in_both():
    # an out-of-place-only allgather that also claims in-place: in-place, gpu r's input aliases o[r]
    program = dataclasses.replace(ring_allgather(3, inplace=False), inplace=1, outofplace=1)
    result = execute_program(program)
    assert result.ok
    gpus = {0: [T(-1, -1, 0, S("cpy", "i0", "o1"), S("cpy", "o1", "o0"))], 1: [T(-1, -1, 0)]}
    both = P("custom", gpus, 2, (1, 2, 0))
    both = dataclasses.replace(both, coll="allgather", inplace=1, outofplace=1)
    assert "postcondition" in kinds(execute_program(both))


def _alone(program: MscclProgram, inplace: bool):
    return execute_program(dataclasses.replace(program, inplace=int(inplace), outofplace=int(not inplace)))


@pytest.mark.parametrize("seed", range(8))
def test_both_modes_in_one_pass_find_what_each_mode_finds_alone(seed):
    # the modes share one run (what runs when never depends on the data): the in-place run's verdict must be the
    # in-place program's own, and what the out-of-place run adds must be what out-of-place finds alone
    import random
    from support.mutants import random_mutant

    base = dataclasses.replace(ring_allgather(4, inplace=False), inplace=1, outofplace=1)
    mutant = random_mutant(base, random.Random(seed))
    program = base if mutant is None else mutant[1]     # seeds 0: the program itself; 1-7: swaps, peers, counts
    both, inplace, outofplace = execute_program(program), _alone(program, True), _alone(program, False)
    assert both.outputs == inplace.outputs and both.completed == inplace.completed
    assert set(inplace.findings) <= set(both.findings)
    extra = {(f.kind, f.message.removesuffix(" (in the out-of-place run)"), f.gpu, f.tb, f.step)
             for f in both.findings if f.message.endswith("(in the out-of-place run)")}
    if outofplace.completed == inplace.completed:   # the extra mode runs at the depth the first one completed at
        assert extra == {(f.kind, f.message, f.gpu, f.tb, f.step) for f in outofplace.findings
                         if f.kind in ("race", "out-of-range", "postcondition")}


def test_bad_peer_and_unknown_step_type_are_findings():
    result = execute_program(replace_tb(ring_allgather(3), 0, 0, send=0))
    assert "peer" in kinds(result)
    result = execute_program(replace_step(ring_allgather(3), 0, 0, 1, type="xyz"))
    assert "step-type" in kinds(result)


def test_race_analysis_is_skipped_with_a_warning_beyond_its_budget(monkeypatch):
    import backends.msccl.interpret as interpret
    monkeypatch.setattr(interpret, "MAX_RACE_TBS", 2)
    result = execute_program(ring_allgather(4))
    assert result.ok and any("race analysis skipped" in f.message for f in result.findings)


def test_seeded_mutant_sweep_catches_most_faults():
    programs = [BUILDERS[c]() for c in sorted(BUILDERS)] + [load_shared("simple_allgather_ring_4gpu.xml"),
                                                            load_shared("dgx1_allgather_s2_r3_c2.xml")]
    stats = mutant_sweep(programs, 300, seed=1)
    assert stats["share"] >= 0.85, stats


# ----------------------------------------------------------------------------------------------- fuzzing

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(TB_STRATEGY, max_size=3), min_size=2, max_size=3),
       st.sampled_from(["allgather", "allreduce", "alltoall", "broadcast", "reduce_scatter", "custom", "nonsense"]),
       st.integers(0, 1), st.sampled_from([None, 0, 1, 2]))
def test_any_program_ends_in_a_result_never_an_exception(tbs_per_gpu, coll, inplace, depth):
    gpus = tuple(Gpu(r, 2, 3, 1, tuple(dataclasses.replace(tb, id=k) for k, tb in enumerate(tbs)))
                 for r, tbs in enumerate(tbs_per_gpu))
    program = MscclProgram("fuzz", "Simple", 2, 3, len(gpus), coll, inplace, None, None, None, gpus)
    result = execute_program(program, fifo_depth=depth)
    assert isinstance(result.ok, bool)


@pytest.mark.parametrize("seed", range(60))
def test_races_looked_for_only_where_tbs_share_a_written_slot_are_the_races_of_the_full_analysis(seed, monkeypatch):
    """Races are looked for only at the tbs that share a slot one of them writes, with vector clocks only for them
    and the tbs that happen before them: the verdict is the one the analysis of every tb gives, on every builder's
    program and seeded mutants of them (swapped, dropped and rewritten steps, which move writes into other tbs'
    slots and messages between other tbs; seeds 20, 50 and 58 race where only some tbs keep clocks)."""
    import random
    import backends.msccl.interpret as interpret
    from support.mutants import random_mutant

    rng = random.Random(seed)
    base = BUILDERS[sorted(BUILDERS)[seed % len(BUILDERS)]]()
    mutant = random_mutant(base, rng) if seed >= len(BUILDERS) else None
    program = base if mutant is None else mutant[1]
    scoped = execute_program(program)
    monkeypatch.setattr(interpret, "_racing_tbs", lambda index, views: set(range(len(index.tbs))))
    assert execute_program(program) == scoped


def test_only_tbs_that_share_a_written_slot_and_those_before_them_keep_vector_clocks():
    """A chain's relays each touch their own chunks: no clocks at all. A Broadcast's root copies its data in one tb
    and sends it from others (ordered by dependencies): those tbs share its output slots, and nothing after them
    comes back to the root, so only the root's tbs keep clocks (a race there is still found:
    test_missing_dependency_is_a_race_with_both_locations)."""
    from backends.msccl.interpret import _clocked_tbs, _racing_tbs, _View, index_program, make_layout, \
        resolve_collective

    def scope(program):
        coll = resolve_collective(program)[0]
        views = [_View(make_layout(program, coll, mode), program.ngpus, []) for mode in (True, False)]
        index = index_program(program)
        racing = _racing_tbs(index, views)
        return {index.tbs[t].gpu for t in racing}, {index.tbs[t].gpu for t in _clocked_tbs(index, racing)}

    assert scope(chain_reduce(4)) == (set(), set())
    assert scope(chain_broadcast(4)) == ({0}, {0})


def test_an_offset_beyond_any_buffer_is_out_of_range_in_the_race_scope_too():
    """The race scope reads every step's integers as 64-bit arrays: a hand-made offset or count past them is out of
    range there as in the run, never an exception."""
    result = execute_program(replace_step(ring_allgather(3), 0, 0, 0, srcoff=10 ** 30))
    assert "out-of-range" in kinds(result)
    result = execute_program(replace_step(ring_allgather(3), 0, 0, 0, cnt=-(10 ** 30)))
    assert not result.ok
