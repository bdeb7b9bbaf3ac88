"""Fitting MSCCL programs into the runtime: the SM ceiling on threadblocks per GPU, merged ``cnt > 1`` steps,
connections spread over channels, and the fast fit estimate the writer and synthesis use (DESIGN section 7)."""

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from support.programs import render, ring_allgather

from backends.msccl.fit import Lowering, fit_lowering, plan_fit
from backends.msccl.limits import runtime_limits
from backends.msccl.lint import lint_program
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.merge import merge_contiguous
from backends.msccl.simulate import simulate_program
from backends.msccl.verdict import check_program
from backends.msccl.writer import emit_verified_xml
from synth.cli import main
from synth.errors import BackendError
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.ir import Schedule, Transfer

THREE_TBS_MESSAGE = "3 threadblocks; all must be co-resident (one per SM) and the GPU has 2 SMs, so at most 2"


# --- SM ceiling ---------------------------------------------------------------------------------------------

def test_more_threadblocks_than_sms_is_a_limit_on_every_gpu():
    program = ring_allgather(4, channels=3)        # 3 tbs per gpu
    found = [f for f in runtime_limits(program, sms=2) if f.kind == "tbs-per-gpu"]
    assert [(f.gpu, f.message, f.runtimes) for f in found] == [(g, THREE_TBS_MESSAGE, ("executor", "legacy"))
                                                                for g in range(4)]
    assert runtime_limits(program, sms=3) == []
    assert runtime_limits(program) == []            # unknown GPU: nothing to check


def test_the_verdict_judges_threadblocks_against_the_sms_it_is_given():
    program = ring_allgather(4, channels=3)
    assert check_program(program, "executor", sms=3).valid
    report = check_program(program, "executor", sms=2)
    assert not report.valid and {str(f) for f in report.findings if f.severity == "error"} == {
        f"error: tbs-per-gpu: gpu {g}: {THREE_TBS_MESSAGE} (both runtimes)" for g in range(4)}


def test_unknown_sms_keeps_the_typical_warning():
    wide = ring_allgather(2, channels=81)          # 81 tbs per gpu; no SM count given
    warnings = [f for f in lint_program(wide, "legacy") if f.kind == "tb-count"]
    assert len(warnings) == 2 and all(f.severity == "warning" for f in warnings)
    assert not [f for f in lint_program(wide, "legacy", sms=132) if f.kind in ("tb-count", "tbs-per-gpu")]


def run_check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_check_takes_the_sm_count_from_an_option_or_a_topology(tmp_path):
    path = tmp_path / "ring.xml"
    path.write_text(render(ring_allgather(4, channels=3)))
    refused = run_check(path, "--target", "executor", "--sms", 2)
    assert refused.exit_code == 1
    assert f"{path}:2: error: tbs-per-gpu: gpu 0: {THREE_TBS_MESSAGE} (both runtimes)" in refused.output
    assert run_check(path, "--target", "executor", "--sms", 3).exit_code == 0
    topo = tmp_path / "small_gpus.json"
    topo.write_text(json.dumps(replace(load_topology("ring-4"), sms_per_gpu=2).to_dict()))
    assert THREE_TBS_MESSAGE in run_check(path, "--target", "executor", "--topology", topo).output
    assert run_check(path, "--target", "executor", "--topology", "dgx1").exit_code == 0   # 80 SMs
    unknown = run_check(path, "--topology", "ring-4")
    assert unknown.exit_code == 1
    assert "topology ring-4 does not say how many SMs its GPUs have; give --sms N" in unknown.output


# --- merged steps and spread connections ---------------------------------------------------------------------


def chain_broadcast(chunks: int, n: int = 4) -> Schedule:
    """Broadcast from rank 0 down the chain 0 -> 1 -> ... -> n-1 of ring-n, pipelined in ``chunks`` pieces."""
    transfers = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(chunks) for r in range(n - 1))
    return Schedule(make_collective("broadcast", n, chunks, 0), f"ring-{n}", transfers, chunks + n - 2)


def message_counts(program) -> set[int]:
    return {st.cnt for g in program.gpus for tb in g.tbs for st in tb.steps if st.type not in ("nop", "cpy")}


def test_merged_chain_moves_contiguous_chunks_as_one_step_and_stays_correct():
    for fuse in (True, False):
        program = lower_to_msccl(chain_broadcast(16), load_topology("ring-4"), fuse=fuse)
        merged = merge_contiguous(program, 4)
        assert message_counts(merged) == {4}
        assert max(len(tb.steps) for g in merged.gpus for tb in g.tbs) < \
            max(len(tb.steps) for g in program.gpus for tb in g.tbs)
        assert check_program(merged, "executor").valid
        assert check_program(merge_contiguous(program, 4, strict=True), "executor").valid


def test_merging_cuts_at_multiples_of_the_cap_so_both_ends_agree():
    merged = merge_contiguous(lower_to_msccl(chain_broadcast(10), load_topology("ring-4"), fuse=True), 4)
    assert message_counts(merged) == {4, 2}          # 0-3, 4-7, 8-9 at every rank
    assert check_program(merged, "executor").valid


def test_a_connection_longer_than_a_threadblock_is_written_spread_or_merged():
    schedule = chain_broadcast(200)                  # 200 messages per connection; the executor holds 64 steps
    topology = load_topology("ring-4")
    emitted = emit_verified_xml(schedule, topology, "executor", 1 << 20)
    assert max(len(tb.steps) for g in emitted.program.gpus for tb in g.tbs) <= 64
    assert emitted.lowering.channels > 1 and emitted.lowering.max_cnt == 1   # channels first: no pipelining lost
    unmerged = lower_to_msccl(schedule, topology, fuse=emitted.fused)
    assert emitted.simulated_us <= simulate_program(unmerged, topology, 1 << 20).time_us * 1.01


def test_a_chain_of_2048_chunks_relays_fused_on_all_32_channels_of_64_steps():
    """32 channels x 64 steps hold a relay's 2048 forwards exactly: channel 0 takes a set of chains too (before, the
    fused chains left it to plain steps, and 2048 chunks merged in pairs); each relay forwards with ``rcs``."""
    schedule = chain_broadcast(2048)
    fit = fit_lowering(schedule, load_topology("ring-4"), "executor")
    assert fit.fits and fit.lowering == Lowering(True, 32, 1, balanced=True)
    program = fit.program
    assert program.nchannels == 32 and fit.steps_per_tb == 64
    for relay in program.gpus[1:3]:
        assert sorted(tb.chan for tb in relay.tbs) == list(range(32))
        assert all(len(tb.steps) == 64 and {st.type for st in tb.steps} == {"rcs"} for tb in relay.tbs)
    assert check_program(program, "executor").valid


def test_fit_prefers_channels_and_merges_only_when_the_sms_run_out():
    schedule = chain_broadcast(200)
    few_sms = replace(load_topology("ring-4"), sms_per_gpu=2)
    fit = fit_lowering(schedule, few_sms, "executor", fuse=False)
    assert fit.fits and fit.tbs_per_gpu <= 2 and fit.steps_per_tb <= 64
    assert fit.lowering == Lowering(False, 1, fit.lowering.max_cnt) and fit.lowering.max_cnt > 1
    assert check_program(fit.program, "executor", sms=2).valid


def test_fit_names_the_limit_that_rules_a_schedule_out():
    one_sm = replace(load_topology("ring-4"), sms_per_gpu=1)   # the root copies in one tb and sends in another
    plan = plan_fit(chain_broadcast(8), one_sm, "executor")
    assert not plan.ok and [m.lowering.fuse for m in plan.misses] == [True, False]
    assert plan.reason().startswith("fused lowering: error: tbs-per-gpu: gpu 0: 2 threadblocks; all must be "
                                    "co-resident (one per SM) and the GPU has 1 SMs, so at most 1 (both runtimes)")
    assert " / plain lowering: error: tbs-per-gpu: gpu 0: 2 threadblocks" in plan.reason()


def test_more_peers_than_sms_is_refused_from_the_schedule_alone():
    n = 6
    coll = make_collective("broadcast", n, 1, 0)
    star = Schedule(coll, "fully-connected-6", tuple(Transfer(0, 0, d, 0) for d in range(1, n)), 1)
    small = replace(load_topology("fully-connected-6"), sms_per_gpu=4)
    reason = "rank 0 must send to 5 peers, a threadblock each, and its GPU runs at most 4 threadblocks (one per SM)"
    with pytest.raises(BackendError, match=re.escape(f"no MSCCL lowering fits: {reason}")):
        plan_fit(star, small)
    with pytest.raises(BackendError, match=re.escape(f"for the executor runtime: {reason}")):
        emit_verified_xml(star, small, "executor", 1 << 20)
    assert plan_fit(star, replace(small, sms_per_gpu=6)).ok


def test_a_rank_with_more_than_32_peers_spreads_them_over_channels():
    n = 40                                             # rank 0 sends to 39 peers; a channel holds 32 send tbs
    star = Schedule(make_collective("broadcast", n, 1, 0), f"fully-connected-{n}",
                    tuple(Transfer(0, 0, d, 0) for d in range(1, n)), 1)
    topology = load_topology(f"fully-connected-{n}")
    emitted = emit_verified_xml(star, topology, "executor", 1 << 20)
    assert emitted.channels == 2
    assert not [f for f in runtime_limits(emitted.program) if f.kind == "tb-connection"]


def test_a_wait_for_a_threadblock_past_depid_127_breaks_the_fit():
    # an H100 holds 132 threadblocks, but a step's depid is a signed byte: waiting for tb 128 is a file the
    # runtime cannot load, known before rendering (it once failed only the final check: ring-8 Alltoall)
    from backends.msccl.fit import measure
    from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
    tbs = [Threadblock(k, -1, -1, 0, (Step(0, "nop", "i", 0, "i", 0, 1),)) for k in range(130)]
    tbs[0] = Threadblock(0, -1, -1, 0, (Step(0, "nop", "i", 0, "i", 0, 1, 129, 0),))
    program = MscclProgram("p", "Simple", 1, 1, 1, "allgather", 0, 1, 0, 0, (Gpu(0, 1, 1, 0, tuple(tbs)),))
    fit = measure(program, Lowering(False), "executor", 132)
    assert [(f.kind, f.message) for f in fit.broken] == [("dependency", "depid=129 is outside -1 or 0..127")]
    waits_in_range = replace(program, gpus=(Gpu(0, 1, 1, 0, (replace(tbs[0], steps=(Step(
        0, "nop", "i", 0, "i", 0, 1, 127, 0),)),) + tuple(tbs[1:])),))
    assert measure(waits_in_range, Lowering(False), "executor", 132).fits
