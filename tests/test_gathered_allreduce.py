"""The gathered Allreduce: every rank's whole input gathered untouched, then summed on each rank
(:attr:`synth.schedule.ir.Schedule.gathered`, :mod:`backends.msccl.gathered`). On a ring of 8 at 1 KB partial sums
need 8 hops (49.9% of the 4-hop alpha diameter); the gathered file takes the diameter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.msccl.gathered import reduce_gathered
from backends.msccl.interpret import execute_program
from backends.msccl.ir import Step
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.simulate import simulate_program
from backends.msccl.verdict import check_text
from backends.msccl.lowering import render_msccl_xml
from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.errors import BackendError, InputError
from synth.model.topology import load_topology
from synth.schedule.ir import schedule_from_dict
from synth.schedule.replay import verify
from synth.synthesis.baselines import build_baseline
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import GATHERED_LABEL, gathered_candidates
from synth.synthesis.solve import solve
from support.instances import GATHERED_CASES

KB = 1024


def _gathered(topology_name: str, baseline: str = "shortest-path", chunks: int = 1) -> tuple:
    name, _, nodes = topology_name.partition(":")
    topo = load_topology(name, int(nodes or 1))
    return topo, replace(build_baseline(baseline, "allgather", topo, chunks), gathered=True)


@pytest.mark.parametrize("topology_name, baseline, chunks", GATHERED_CASES)
@pytest.mark.parametrize("fuse", [True, False])
def test_the_program_is_an_allreduce_that_executes_and_lints_clean(topology_name, baseline, chunks, fuse):
    topo, schedule = _gathered(topology_name, baseline, chunks)
    program = lower_to_msccl(schedule, topo, fuse=fuse)
    assert (program.coll, program.nchunksperloop) == ("allreduce", schedule.collective.chunks_per_rank)
    assert all((g.i_chunks, g.o_chunks) == (program.nchunksperloop,) * 2 for g in program.gpus)
    result = execute_program(program)      # in and out of place: every rank holds the sum of every input
    assert result.ok, result
    report = check_text(render_msccl_xml(program), "<gathered>", "executor", sms=80)
    assert not report.errors()
    # the local sum is free in the simulator: the file takes its Allgather's time, at n times the size
    stage = lower_to_msccl(replace(schedule, gathered=False), topo, fuse=fuse)
    n = topo.num_ranks
    assert simulate_program(program, topo, KB).time_us == pytest.approx(
        simulate_program(stage, topo, n * KB).time_us, rel=1e-12)


def test_a_missing_sum_fails_the_postcondition():
    topo, schedule = _gathered("ring-4")
    program = lower_to_msccl(schedule, topo)
    gpu = program.gpus[2]
    local = gpu.tbs[-1]
    assert local.steps[-1].type == "re"
    cut = replace(gpu, tbs=gpu.tbs[:-1] + (replace(local, steps=local.steps[:-1]),))
    mutant = replace(program, gpus=program.gpus[:2] + (cut,) + program.gpus[3:])
    assert not execute_program(mutant).ok


def test_the_sum_waits_for_every_threadblock_of_its_rank():
    topo, schedule = _gathered("ring-8", chunks=2)
    program = lower_to_msccl(schedule, topo)
    for gpu in program.gpus:
        *others, local = gpu.tbs
        assert (local.send, local.recv) == (-1, -1)
        waited = {(st.depid, st.deps) for st in local.steps if st.depid >= 0}
        assert waited == {(tb.id, len(tb.steps) - 1) for tb in others}
        assert all(tb.steps[-1].hasdep == 1 for tb in others)
        assert [st.type for st in local.steps[len(others) - 1:]] == ["cpy"] + ["re"] * (topo.num_ranks - 1)


def test_on_32_ranks_the_sum_is_a_chain_of_threadblocks_within_the_executors_64_steps():
    # ndv2 x4: 45 threadblocks to wait on and 31 sums outgrow one threadblock; the old single one had 77 steps
    topo, schedule = _gathered("ndv2-4node-tecc", chunks=2)
    program = lower_to_msccl(schedule, topo)
    n = topo.num_ranks
    for gpu in program.gpus:
        k = len(gpu.tbs)        # the chain: the trailing local threadblocks that sum
        while k and (gpu.tbs[k - 1].send, gpu.tbs[k - 1].recv) == (-1, -1) and any(
                st.type == "re" for st in gpu.tbs[k - 1].steps):
            k -= 1
        others, chain = gpu.tbs[:k], gpu.tbs[k:]
        assert all(len(tb.steps) <= 64 for tb in gpu.tbs)
        assert [st.type for tb in chain for st in tb.steps if st.type != "nop"] == ["cpy"] + ["re"] * (n - 1)
        waited = {(st.depid, st.deps) for tb in chain for st in tb.steps if st.depid >= 0}
        assert {(tb.id, len(tb.steps) - 1) for tb in others} <= waited
        for before, after in zip(chain, chain[1:]):     # each link waits on the one before it
            assert (after.steps[0].depid, after.steps[0].deps) == (before.id, len(before.steps) - 1)
            assert before.steps[-1].hasdep == 1 and before.steps[-1].type != "nop"
    assert max(len([tb for tb in g.tbs if tb.send == -1 == tb.recv]) for g in program.gpus) > 1
    assert execute_program(program).ok
    assert not check_text(render_msccl_xml(program), "<gathered>", "executor", sms=80).errors()


def test_more_waits_than_a_threadblock_holds_end_a_link_on_a_self_copy_that_carries_the_last_wait():
    # 4 x dgx-h100 on two channels: 125 threadblocks to wait on; a link may not end on a nop (its wait goes to the
    # step after it), and an empty link had crashed `synth solve` with an IndexError
    topo, schedule = _gathered("dgx-h100:4", "all-pairs", 4)
    program = lower_to_msccl(schedule, topo, fuse=True, channels=2)
    for gpu in program.gpus:
        assert all(len(tb.steps) <= 64 for tb in gpu.tbs)
        for tb in gpu.tbs:
            assert tb.steps[-1].type != "nop"
            for a, b in zip(tb.steps, tb.steps[1:]):
                assert a.type != "nop" or b.depid >= 0      # a nop's wait is attached to a step with one
    for gpu in program.gpus:        # on the scratch slot of the rank's own block, which nothing else touches
        hole = gpu.s_chunks - (topo.num_ranks - gpu.id) * 4
        selves = [st for tb in gpu.tbs for st in tb.steps if st.type == "cpy" and st.srcbuf == st.dstbuf]
        assert [(st.srcbuf, st.srcoff, st.dstoff, st.cnt) for st in selves] == [("s", hole, hole, 1)]
        assert selves[0].depid >= 0
    assert execute_program(program).ok
    assert not check_text(render_msccl_xml(program), "<gathered>", "executor", sms=132).errors()


def test_ndv2x4_allreduce_1kb_gathered_is_written_within_ten_percent_of_the_alpha_diameter():
    # the alpha-beta search's reduce-scatter + allgather takes 16.2 us, twice the 8.1 us alpha diameter
    topo, schedule = _gathered("ndv2-4node-tecc", chunks=2)
    emitted = emit_verified_xml(schedule, topo, "executor", KB)
    bound = lower_bound("allreduce", topo, KB)
    assert bound.latency_us == pytest.approx(8.1)
    assert emitted.simulated_us <= bound.latency_us * 1.10


def test_only_an_allgather_program_is_gathered():
    topo = load_topology("ring-4")
    program = lower_to_msccl(build_baseline("ring", "broadcast", topo), topo)
    with pytest.raises(BackendError, match="a gathered Allreduce is made from an Allgather program, not broadcast"):
        reduce_gathered(program)


def test_a_step_across_the_own_block_is_refused():
    topo, schedule = _gathered("ring-4", "ring", 2)
    program = lower_to_msccl(replace(schedule, gathered=""), topo)
    gpu = program.gpus[1]
    tb = next(tb for tb in gpu.tbs if tb.send >= 0)
    wide = Step(len(tb.steps), "s", "o", 1, "o", 1, 2)         # output 1..2: GPU 1's block is 2..3
    bad = replace(gpu, tbs=tuple(replace(t, steps=t.steps + (wide,)) if t is tb else t for t in gpu.tbs))
    program = replace(program, gpus=(program.gpus[0], bad) + program.gpus[2:])
    with pytest.raises(BackendError, match="GPU 1: a step of 2 chunks at output 1 holds its own block and another"):
        reduce_gathered(program)


def test_the_schedule_computes_an_allreduce_of_one_ranks_input():
    topo, schedule = _gathered("ring-8", chunks=2)
    assert (schedule.computes, schedule.loop_chunks, schedule.runs_at_power_of_two_sizes) == ("allreduce", 2, True)
    assert schedule.chunk_bytes(KB) == 512 and schedule.moved_size(KB) == 8 * KB
    assert schedule.busbw_factor() == pytest.approx(2 * 7 / 8)
    stage = replace(schedule, gathered=False)
    replayed = verify(schedule, topo, KB)
    assert replayed.time_us == pytest.approx(verify(stage, topo, 8 * KB).time_us)
    assert replayed.busbw_GBps == pytest.approx(replayed.algbw_GBps * 1.75)


def test_a_gathered_schedule_needs_an_allgather():
    topo = load_topology("ring-4")
    broadcast = build_baseline("ring", "broadcast", topo)
    with pytest.raises(ValueError, match="a gathered schedule moves an Allgather of whole inputs, not broadcast"):
        replace(broadcast, gathered=True)


def test_the_schedule_file_round_trips_and_is_checked():
    _, schedule = _gathered("ring-8")
    raw = schedule.to_dict()
    assert raw["gathered"] == "allreduce"
    back = schedule_from_dict(raw)
    assert back.gathered == "allreduce" and back.collective == schedule.collective
    assert set(back.transfers) == set(schedule.transfers)
    assert schedule_from_dict({**raw, "gathered": True}).gathered == "allreduce"     # files from before Alltoall
    assert schedule_from_dict({**raw, "gathered": "alltoall"}).computes == "alltoall"
    with pytest.raises(InputError, match="gathered: must be allreduce or alltoall or empty .true or false in older "
                                         "files., got 'yes'"):
        schedule_from_dict({**raw, "gathered": "yes"})
    other = build_baseline("ring", "broadcast", load_topology("ring-8")).to_dict()
    with pytest.raises(InputError, match="a gathered allreduce moves an Allgather of whole inputs: give "
                                         "collective.name allgather, not broadcast"):
        schedule_from_dict({**other, "gathered": True})
    assert schedule_from_dict({k: v for k, v in raw.items() if k != "gathered"}).gathered == ""
    assert schedule_from_dict({**raw, "gathered": False}).gathered == ""


def test_the_candidate_applies_where_alphas_bind_on_an_allreduce():
    ring = load_topology("ring-8")
    candidates = gathered_candidates(SynthesisRequest(ring, "allreduce", KB))
    assert candidates[0].label.startswith(GATHERED_LABEL + "shortest-path/")
    assert all(c.result.schedule.gathered for c in candidates)
    times = [c.report.time_us for c in candidates]
    assert times == sorted(times) and len({c.label for c in candidates}) == len(candidates) > 1
    assert gathered_candidates(SynthesisRequest(ring, "allgather", KB)) == []
    assert gathered_candidates(SynthesisRequest(ring, "allreduce", 1 << 30)) == []     # bandwidth binds


def test_solve_writes_ring8_allreduce_1kb_within_ten_percent_of_the_alpha_diameter():
    request = SynthesisRequest(load_topology("ring-8"), "allreduce", KB)
    solution = solve(request)
    report = solution.report()
    assert report["method"].startswith(GATHERED_LABEL)
    assert 'coll="allreduce"' in solution.xml.text
    limit = request.bound.latency_us                                   # 4 hops of 0.7 us
    assert limit <= report["predicted_time_us"] <= 1.1 * limit
    assert report["predicted_time_us"] == pytest.approx(report["plan_time_us"], rel=0.03)
    assert report["speedup_vs_baseline"] > 1.5


def test_the_writer_judges_the_allreduce_file():
    topo, schedule = _gathered("ring-8", chunks=4)
    emitted = emit_verified_xml(schedule, topo, "executor", KB)
    assert emitted.program.coll == "allreduce" and 'coll="allreduce"' in emitted.text
    assert emitted.simulated_us == pytest.approx(verify(schedule, topo, KB).time_us, rel=0.03)


def test_pareto_offers_it_where_alphas_bind_and_chooses_it_at_1kb():
    from synth.sweep.sizes import GATHERED, choose_per_size
    from synth.sweep.sources import baseline_algorithms, gathered_algorithms

    ring = load_topology("ring-8")
    found = gathered_algorithms("allreduce", ring, [KB, 1 << 30])       # one per Allgather baseline, at 1 KB
    assert {(a.kind, a.tuned_bytes) for a in found} == {(GATHERED, KB)} and len(found) == 12
    assert found[0].key == "gathered-shortest-path-c4" and len({a.key for a in found}) == 12
    assert gathered_algorithms("allgather", ring, [KB]) == []
    failures = []
    pool = found + baseline_algorithms("allreduce", ring, [KB], None, failures)
    (choice,) = choose_per_size(pool, ring, [KB])
    assert choice.chosen == "gathered-shortest-path-c4"


@pytest.mark.parametrize("computes, chunk_bytes, busbw_factor", [("allreduce", KB, 1.75), ("alltoall", KB / 8, 7 / 8)])
def test_synth_simulate_times_a_gathered_schedule_file_as_what_it_computes(tmp_path, computes, chunk_bytes,
                                                                            busbw_factor):
    import json

    from click.testing import CliRunner

    from synth.cli import main

    _, schedule = _gathered("ring-8")
    path = tmp_path / "gathered.json"
    path.write_text(replace(schedule, gathered=computes).to_json())
    result = CliRunner().invoke(main, ["simulate", str(path), "--topology", "ring-8", "--size", "1KB", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    program = report["programs"][0]
    assert report["valid"] and program["collective"] == computes and program["chunk_bytes"] == chunk_bytes
    assert program["busbw_GBps"] == pytest.approx(program["algbw_GBps"] * busbw_factor)
