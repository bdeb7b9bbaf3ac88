"""The gathered Alltoall: every rank's whole input gathered untouched, then each rank copies its block of every
input into its output (:attr:`synth.schedule.ir.Schedule.gathered` ``alltoall``, :func:`backends.msccl.gathered.
pick_gathered`). On ndv2 x4 at 1 KB the per-pair chunks are 384 messages on each link between nodes, which queue
at the runtime's FIFOs (the best baseline simulates 32% over its plan); an input per message takes the diameter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.msccl.gathered import pick_gathered
from backends.msccl.interpret import execute_program
from backends.msccl.lowering import lower_to_msccl, render_msccl_xml
from backends.msccl.simulate import simulate_program
from backends.msccl.verdict import check_text
from backends.msccl.writer import emit_verified_xml
from synth.bounds.physical import lower_bound
from synth.errors import BackendError
from synth.model.topology import load_topology
from synth.schedule.replay import verify
from synth.synthesis.baselines import build_baseline
from synth.synthesis.request import SynthesisRequest
from synth.synthesis.select import GATHERED_LABEL, gathered_candidates
from support.instances import GATHERED_CASES

KB = 1024


def _gathered(topology_name: str, baseline: str = "shortest-path", chunks: int = 1) -> tuple:
    topo = load_topology(topology_name)
    return topo, replace(build_baseline(baseline, "allgather", topo, chunks), gathered="alltoall")


@pytest.mark.parametrize("topology_name, baseline, chunks", GATHERED_CASES)
@pytest.mark.parametrize("fuse", [False, True])
def test_the_program_is_an_alltoall_that_executes_and_lints_clean(topology_name, baseline, chunks, fuse):
    topo, schedule = _gathered(topology_name, baseline, chunks)
    n, per_rank = topo.num_ranks, schedule.collective.chunks_per_rank
    try:
        program = lower_to_msccl(schedule, topo, fuse=fuse)
    except BackendError as exc:      # a fused step of more than 71 / n chunks cannot be scaled
        assert fuse and "over the runtimes' cnt <= 71" in str(exc)
        return
    assert (program.coll, program.nchunksperloop) == ("alltoall", n * per_rank) == ("alltoall", schedule.loop_chunks)
    assert all((g.i_chunks, g.o_chunks) == (n * per_rank,) * 2 for g in program.gpus)
    result = execute_program(program)      # in and out of place: every rank holds its block of every input
    assert result.ok, result
    assert not check_text(render_msccl_xml(program), "<gathered>", "executor", sms=80).errors()
    # the local copies are free in the simulator: the file takes its Allgather's time, at n times the size
    stage = lower_to_msccl(replace(schedule, gathered=""), topo, fuse=fuse)
    assert simulate_program(program, topo, KB).time_us == pytest.approx(
        simulate_program(stage, topo, n * KB).time_us, rel=1e-12)


def test_each_rank_copies_its_block_of_every_gathered_input_after_every_threadblock():
    topo, schedule = _gathered("ring-8", chunks=2)
    program = lower_to_msccl(schedule, topo)
    n, pair = 8, 2
    for gpu in program.gpus:
        *others, local = gpu.tbs
        copies = [st for st in local.steps if st.type != "nop"]
        own, rest = copies[0], copies[1:]
        assert (own.srcbuf, own.srcoff, own.dstbuf, own.dstoff, own.cnt) == ("i", gpu.id * pair, "o", gpu.id * pair,
                                                                          pair)
        first = gpu.s_chunks - n * n * pair         # the gathered inputs follow the Allgather's own scratch
        peers = [p for p in range(n) if p != gpu.id]
        assert [(st.type, st.srcbuf, st.srcoff, st.dstoff, st.cnt) for st in rest] == [
            ("cpy", "s", first + p * n * pair + gpu.id * pair, p * pair, pair) for p in peers]
        waited = {(st.depid, st.deps) for st in local.steps if st.depid >= 0}
        assert waited == {(tb.id, len(tb.steps) - 1) for tb in others}


def test_a_step_too_wide_to_scale_is_refused_with_the_runtime_limit():
    topo, schedule = _gathered("ring-8", chunks=2)
    stage = lower_to_msccl(replace(schedule, gathered=""), topo)
    gpu = stage.gpus[3]
    tb = next(tb for tb in gpu.tbs if tb.send >= 0)
    wide = replace(tb, steps=(replace(tb.steps[0], cnt=9),) + tb.steps[1:])     # 9 x 8 = 72 of the Alltoall's
    stage = replace(stage, gpus=stage.gpus[:3] + (replace(gpu, tbs=tuple(wide if t is tb else t for t in gpu.tbs)),)
                    + stage.gpus[4:])
    with pytest.raises(BackendError, match="a step of 9 chunks is 72 of the gathered Alltoall's, over the "
                                           "runtimes' cnt <= 71"):
        pick_gathered(stage)


def test_the_schedule_computes_an_alltoall_of_n_blocks():
    topo, schedule = _gathered("ring-8", chunks=2)
    assert (schedule.computes, schedule.loop_chunks, schedule.runs_at_power_of_two_sizes) == ("alltoall", 16, True)
    assert schedule.chunk_bytes(KB) == 512 and schedule.moved_size(KB) == 8 * KB     # a transfer: half an input
    assert schedule.busbw_factor() == pytest.approx(7 / 8)
    assert verify(schedule, topo, KB).time_us == pytest.approx(
        verify(replace(schedule, gathered=""), topo, 8 * KB).time_us)


def test_candidates_are_offered_for_an_alltoall_where_alphas_bind():
    ring = load_topology("ring-8")
    candidates = gathered_candidates(SynthesisRequest(ring, "alltoall", KB))
    assert candidates and all(c.label.startswith(GATHERED_LABEL) for c in candidates)
    assert {c.result.schedule.computes for c in candidates} == {"alltoall"}
    assert gathered_candidates(SynthesisRequest(ring, "alltoall", 1 << 30)) == []     # bandwidth binds


def test_ndv2x4_alltoall_1kb_is_written_within_ten_percent_of_the_alpha_diameter_where_the_baseline_is_not():
    topo, schedule = _gathered("ndv2-4node-tecc", chunks=2)
    bound = lower_bound("alltoall", topo, KB)
    assert bound.latency_us == pytest.approx(8.1) and bound.binding == "latency"
    emitted = emit_verified_xml(schedule, topo, "executor", KB)
    assert emitted.program.coll == "alltoall"
    assert emitted.simulated_us <= bound.latency_us * 1.10
    baseline = build_baseline("shortest-path", "alltoall", topo, 1)
    assert emit_verified_xml(baseline, topo, "executor", KB).simulated_us > bound.latency_us * 1.25

