"""`synth run`: MSCCL programs executed on real processes with torch.distributed (synth/run_torch.py).

Needs PyTorch (the ``torch`` extra). Without it the torch-backed tests fail, on purpose, with the install hint.
"""

import json

import pytest
from click.testing import CliRunner

from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
from synth.cli import main
from synth.errors import InputError, VerificationError
from synth.runtime.program_buffers import plan_program
from synth.runtime.torch_run import raise_on_failure, run_msccl_file, run_msccl_programs
from support.extras import need_torch
from support.shared import ALL_FILES, INVALID_FILE, shared_msccl_xml



def st(s, type_, srcbuf="i", srcoff=0, dstbuf="o", dstoff=0, cnt=1, depid=-1, deps=-1, hasdep=0):
    return Step(s, type_, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep)


def tb(id_, send, recv, *steps, chan=0):
    return Threadblock(id_, send, recv, chan, tuple(steps))


def program(coll, gpus, chunks, inplace=0, name="test", proto="Simple"):
    return MscclProgram(name, proto, 1, chunks, len(gpus), coll, inplace, None, None, None, tuple(gpus))


def exchange_allgather(receive_first=False):
    """2-rank Allgather: a local copy (publishing a flag) and one tb that swaps shards with the peer."""
    gpus = []
    for r in range(2):
        p = 1 - r
        swap = [st(0, "s", "o", r, depid=0, deps=0), st(1, "r", "o", p, "o", p)]
        if receive_first:
            swap = [st(0, "r", "o", p, "o", p), st(1, "s", "o", r, depid=0, deps=0)]
        gpus.append(Gpu(r, 1, 2, 0, (tb(0, -1, -1, st(0, "cpy", "i", 0, "o", r, hasdep=1)), tb(1, p, p, *swap))))
    return program("allgather", gpus, 2)


def broadcast_chain(root=1):
    """3-rank Broadcast of 2 chunks from ``root`` along root -> next -> next (cnt=2 messages)."""
    a, b, c = root, (root + 1) % 3, (root + 2) % 3
    gpus = {a: Gpu(a, 2, 2, 0, (tb(0, -1, -1, st(0, "cpy", "i", 0, "o", 0, cnt=2, hasdep=1)),
                                tb(1, b, -1, st(0, "s", "i", 0, cnt=2)))),
            b: Gpu(b, 2, 2, 0, (tb(0, c, a, st(0, "rcs", "o", 0, "o", 0, cnt=2)),)),
            c: Gpu(c, 2, 2, 0, (tb(0, -1, b, st(0, "r", "o", 0, "o", 0, cnt=2)),))}
    return program("broadcast", [gpus[r] for r in range(3)], 2)


# ----------------------------------------------------------------------------------------------- static checks

def test_plan_counts_messages_and_sizes_buffers():
    plan = plan_program(exchange_allgather(), 2)
    assert plan.messages == 2 and not plan.inplace
    assert [(b.input_chunks, b.output_chunks) for b in plan.buffers] == [(1, 2), (1, 2)]


@pytest.mark.parametrize("mutate,match", [
    (None, r"run it with --nprocs 2"),
    (lambda g: [g[0], Gpu(1, 1, 2, 0, (g[1].tbs[0], tb(1, 0, 0, st(0, "s", "o", 1, cnt=2),
                                                       st(1, "r", "o", 0, "o", 0))))],
     r"gpu 1/tb 1/step 0: src o\[1:3\] is beyond o_chunks=2"),
    (lambda g: [g[0], Gpu(1, 1, 2, 0, (g[1].tbs[0], tb(1, 0, 0, st(0, "s", "o", 1), st(1, "r", "o", 0, "o", 0)),
                                       tb(2, 0, -1, st(0, "s", "o", 1))))],
     r"gpu 1/tb 2: tbs 1 and 2 both send to gpu 0 on channel 0"),
    (lambda g: [g[0], Gpu(1, 1, 2, 0, (g[1].tbs[0], tb(1, 0, 0, st(0, "s", "o", 1), st(1, "r", "o", 0, "o", 0),
                                                       st(2, "s", "o", 1))))],
     r"gpu 1->gpu 0 channel 0: 2 message\(s\) sent but 1 received"),
    (lambda g: [g[0], Gpu(1, 1, 2, 0, (tb(0, -1, -1, st(5, "cpy", "i", 0, "o", 1, hasdep=1)), g[1].tbs[1]))],
     r"gpu 1/tb 0/step 0: s=5 but the step is at position 0, and dependencies name steps of this tb"),
    (lambda g: [g[0], Gpu(1, 1, 2, 0, (g[1].tbs[0], tb(1, 1, 0, st(0, "s", "o", 1), st(1, "r", "o", 0, "o", 0))))],
     r"gpu 1/tb 1: send=1 is itself"),
])
def test_plan_refuses_what_the_runtime_would_trip_over(mutate, match):
    good = exchange_allgather()
    bad = program("allgather", mutate(list(good.gpus)), 2) if mutate else good
    with pytest.raises(InputError, match=match):
        plan_program(bad, 3 if mutate is None else 2, "bad.xml")


def test_cnt_mismatch_between_sender_and_receiver_is_refused():
    good = exchange_allgather()
    g1 = good.gpus[1]
    swapped = Gpu(1, 1, 2, 0, (g1.tbs[0], tb(1, 0, 0, st(0, "s", "o", 0, cnt=2), st(1, "r", "o", 0, "o", 0))))
    with pytest.raises(InputError, match=r"message 0 has cnt 2 at the sender \(gpu 1/tb 1/step 0\) but 1"):
        plan_program(program("allgather", [good.gpus[0], swapped], 2), 2)


def test_dependency_on_a_flag_nobody_publishes_is_refused():
    good = exchange_allgather()
    g0 = good.gpus[0]
    unpublished = Gpu(0, 1, 2, 0, (tb(0, -1, -1, st(0, "cpy", "i", 0, "o", 0)), g0.tbs[1]))
    with pytest.raises(InputError, match=r"gpu 0/tb 1/step 0: waits for tb 0 step 0, which has hasdep=0 and so never signals"):
        plan_program(program("allgather", [unpublished, good.gpus[1]], 2), 2)


def test_shared_files_plan_cleanly():
    from backends.msccl.parse import load_msccl_xml
    for path in map(shared_msccl_xml, ALL_FILES):
        for p in load_msccl_xml(path):
            plan = plan_program(p, p.ngpus, str(path))
            assert plan.messages > 0


def test_missing_torch_gives_the_install_hint(monkeypatch):
    import synth.runtime.launch as tl
    monkeypatch.setattr(tl.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tl.TorchMissingError, match=r"install the extra: pip install 'synth-collectives\[torch\]'"):
        tl.require_torch("synth run")


# ----------------------------------------------------------------------------------------------- real processes

@pytest.mark.parametrize("name", ["allgather_ring_8gpu_1ch_1inst.xml",        # in-place, LL128, rcs chains
                                  "allreduce_a100_allpairs_8gpu_1inst.xml",   # nop dependencies, scratch, re
                                  "dgx1_reducescatter_s2_r3_c2.xml"])         # rrc, legacy reduce_scatter
def test_valid_shared_files_run_on_8_processes(name):
    need_torch()
    (report,) = run_msccl_file(shared_msccl_xml(name), 8, timeout_s=30)
    assert report.ok, report.problems
    assert report.nprocs == 8 and report.messages > 0


def test_invalid_shared_file_fails_naming_rank_and_chunk():
    need_torch()
    path = shared_msccl_xml(INVALID_FILE)
    result = CliRunner().invoke(main, ["run", str(path), "--nprocs", "8", "--timeout", "30"])
    assert result.exit_code == 1
    error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1
    assert "rank 0: output chunk 0 is wrong: contributions counted wrongly: rank 1 2 times" in error[0]
    assert "512 wrong output chunk(s) in all" in error[0]


def test_programs_built_in_code_run_and_rooted_collectives_use_root():
    need_torch()
    ag, = run_msccl_programs([exchange_allgather()], 2, timeout_s=20)
    assert ag.ok and ag.messages == 2
    ok, = run_msccl_programs([broadcast_chain(root=1)], 3, timeout_s=20, root=1)
    assert ok.ok, ok.problems
    wrong, = run_msccl_programs([broadcast_chain(root=1)], 3, timeout_s=20, root=0)
    assert not wrong.ok and wrong.wrong_chunks == 6  # every rank's 2 chunks hold root 1's data, not root 0's
    with pytest.raises(VerificationError, match=r"rank \d: output chunk 0 is wrong"):
        raise_on_failure([wrong])


def test_receive_first_deadlock_is_reported_with_rank_tb_and_step():
    need_torch()
    report, = run_msccl_programs([exchange_allgather(receive_first=True)], 2, timeout_s=2)
    assert not report.ok
    assert any("tb 1 step 0 (r)" in p and "rank" in p for p in report.problems), report.problems


def test_cli_run_json(msccl_files):
    need_torch()
    result = CliRunner().invoke(main, ["run", str(msccl_files["legacy_ring_allgather_ring-8.xml"]), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("["):])
    assert data[0]["ok"] and data[0]["collective"] == "allgather" and data[0]["nprocs"] == 8


@pytest.mark.parametrize("coll,S,R,C", [("allgather", 2, 3, 2), ("allreduce", 4, 6, 2)])
def test_our_dgx1_xml_runs_on_8_processes(dgx1, coll, S, R, C):
    """What `synth solve -o` writes for DGX-1 computes the collective on real processes, both lowerings."""
    need_torch()
    from backends.msccl.lowering import lower_to_msccl
    from synth.synthesis.steps import synthesize_steps
    sched = synthesize_steps(dgx1, coll, S, R, C).schedule
    programs = [lower_to_msccl(sched, fuse=True), lower_to_msccl(sched, fuse=False)]
    for report in run_msccl_programs(programs, 8, timeout_s=30):
        assert report.ok, report.problems
