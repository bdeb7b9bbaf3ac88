"""Every XML synth writes is executed by the interpreter, re-parses, and lints clean for both runtimes."""

import pytest

from synth.errors import BackendError

from backends.msccl.parse import parse_msccl_xml
from backends.msccl.lowering import lower_to_msccl
from support.instances import DGX1_EVERY_COLLECTIVE
from backends.msccl.writer import emit_verified_xml
from backends.msccl.interpret import execute_program
from backends.msccl.lint import lint_program, lint_text
from synth.synthesis.steps import synthesize_steps
from synth.model.topology import load_topology


@pytest.mark.parametrize("coll,S,R,C", DGX1_EVERY_COLLECTIVE + [("allgather", 3, 7, 6)])
@pytest.mark.parametrize("target", ["executor", "legacy"])
def test_dgx1_xml_executes_reparses_and_lints_clean(dgx1, coll, S, R, C, target):
    sched = synthesize_steps(dgx1, coll, S, R, C).schedule
    if target == "legacy" and coll in ("gather", "scatter"):
        with pytest.raises(BackendError, match=f"the legacy runtime knows no {coll} .its loader refuses the file."):
            emit_verified_xml(sched, dgx1, target)
        return
    emitted = emit_verified_xml(sched, dgx1, target)
    assert emitted.fused
    [program] = parse_msccl_xml(emitted.text, f"{coll}.xml")
    assert program.collective == coll and program.ngpus == 8
    assert program.min_bytes == 0 and program.max_bytes > 0 and program.outofplace == 1
    errors = [f for f in lint_program(program, target) + lint_text(emitted.text) if f.severity == "error"]
    assert errors == []
    assert execute_program(program).ok


@pytest.mark.parametrize("name", ["ring-5", "fully-connected-4", "dgx-a100"])
@pytest.mark.parametrize("coll,steps", [("allgather", None), ("reducescatter", None), ("allreduce", None),
                                        ("alltoall", None)])
def test_plain_and_fused_lowerings_both_execute(name, coll, steps):
    from synth.synthesis.request import SynthesisRequest
    from synth.synthesis.select import step_candidates
    topo = load_topology(name)
    [choice] = step_candidates(SynthesisRequest(topo, coll, 1 << 20, chunks=1))
    for fuse in (True, False):
        res = execute_program(lower_to_msccl(choice.result.schedule, fuse=fuse))
        assert res.ok, [str(f) for f in res.findings]


@pytest.mark.parametrize("coll,S,R,C", DGX1_EVERY_COLLECTIVE + [("allgather", 3, 7, 6)])
@pytest.mark.parametrize("size", [1 << 10, 1 << 20, 1 << 30])
def test_simulated_program_time_equals_replay_time(dgx1, coll, S, R, C, size):
    """Same cost model: the executor's time for the lowered schedule matches the replay within 1%."""
    from synth.schedule.replay import verify
    from backends.msccl.simulate import UNBOUNDED_FIFO, simulate_program
    sched = synthesize_steps(dgx1, coll, S, R, C).schedule
    replay = verify(sched, dgx1, size).time_us
    simulated = simulate_program(lower_to_msccl(sched, fuse=False), dgx1, size, fifo_depth=UNBOUNDED_FIFO).time_us
    assert abs(simulated - replay) <= 0.01 * replay


def test_emitter_picks_the_faster_verified_lowering(dgx1):
    sched = synthesize_steps(dgx1, "allgather", 3, 7, 6).schedule
    emitted = emit_verified_xml(sched, dgx1, size_bytes=1 << 30)
    from backends.msccl.simulate import simulate_program
    others = [simulate_program(lower_to_msccl(sched, fuse=f), dgx1, 1 << 30).time_us for f in (True, False)]
    assert emitted.simulated_us <= min(others) * 1.01 + 1e-9


@pytest.mark.parametrize("name", ["dgx-a100", "dgx2"])
def test_switch_topologies_simulate_like_the_replay_when_ports_follow_the_plan(name):
    """Sends sharing an NVSwitch port carry the schedule's order as dependencies, so the program's simulated
    time (runtime FIFO depth) equals the replay; without the order it was 12-18% slower."""
    from synth.synthesis.alphabeta import synthesize_alpha_beta
    from synth.schedule.replay import verify
    from backends.msccl.simulate import simulate_program
    topo = load_topology(name)
    size = 1 << 24
    sched = synthesize_alpha_beta(topo, "allgather", size, method="routed").schedule
    replay = verify(sched, topo, size).time_us
    ordered = lower_to_msccl(sched, topology=topo, fuse=False)
    assert execute_program(ordered).ok
    assert abs(simulate_program(ordered, topo, size).time_us - replay) <= 0.01 * replay
    unordered = simulate_program(lower_to_msccl(sched, fuse=False), topo, size).time_us
    assert unordered >= replay * 0.999


def test_the_writer_leaves_the_garbage_collector_as_it_found_it():
    import gc

    from synth.model.collectives import make_collective
    from synth.schedule.ir import Schedule, Transfer

    ring4 = load_topology("ring-4")
    chain = tuple(Transfer(0, r, r + 1, step=r) for r in range(3))
    schedule = Schedule(make_collective("broadcast", 4, 1, 0), "ring-4", chain, 3)
    assert gc.isenabled()
    assert emit_verified_xml(schedule, ring4, "executor", 1 << 20).simulated_us > 0
    assert gc.isenabled()
    with pytest.raises(BackendError):
        emit_verified_xml(schedule, None)
    assert gc.isenabled()
    gc.disable()
    try:
        emit_verified_xml(schedule, ring4, "executor", 1 << 20)
        assert not gc.isenabled()
    finally:
        gc.enable()
