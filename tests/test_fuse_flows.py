"""Fusing chosen flows of a plain program on channels of their own (:mod:`backends.msccl.fuse_flows`): fewer steps
on a relay, the same data and the same time; dgx1 Broadcast 1 GB in 2048 chunks fits the XML reader that way."""

from __future__ import annotations

import pytest

from backends.msccl.fit import Lowering, fused_flow_fits, measure
from backends.msccl.fuse_flows import Flow, flow_choices, fuse_flows, merge_local_copies
from backends.msccl.interpret import execute_program
from backends.msccl.limits import gpu_xml_elements
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.simulate import simulate_program
from synth.errors import BackendError
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.ir import Schedule, Transfer

CHUNKS = 96
MB = 1 << 20


def rank_elements(program) -> list[int]:
    return [gpu_xml_elements(program, gpu) for gpu in program.gpus]


SINGLE = 70      # chunks 0..69 go 0 -> 1 -> 2 (and 0 -> 3), 70..89 go 0 -> 1 -> 3 (and 0 -> 2)
TWO = 90         # chunks 90..95 go 0 -> 1 -> {2, 3}


@pytest.fixture(scope="module")
def tree():
    """A Broadcast from 0 on fully-connected-4 through relay 1, one chunk per step, 96 chunks."""
    topo = load_topology("fully-connected-4")
    transfers = [Transfer(c, 0, 1, c) for c in range(CHUNKS)]
    for c in range(CHUNKS):
        kids = (2, 3) if c >= TWO else (2,) if c < SINGLE else (3,)
        transfers += [Transfer(c, 1, d, c + 1) for d in kids]
        transfers += [Transfer(c, 0, d, c) for d in (2, 3) if d not in kids]
    schedule = Schedule(make_collective("broadcast", 4, CHUNKS, 0), topo.name, tuple(transfers), CHUNKS + 1)
    return topo, schedule, lower_to_msccl(schedule, topo, fuse=False, channels=2, balance=True)


def _steps(program, gpu: int) -> int:
    return sum(len(tb.steps) for tb in program.gpus[gpu].tbs)


@pytest.mark.parametrize("count", [1, 40, 64, 65, SINGLE])
def test_a_fused_flow_saves_a_step_per_chunk_and_moves_the_data_alike(tree, count):
    topo, _, plain = tree
    fused = fuse_flows(plain, [Flow(0, 1, 2, tuple(range(count)))], steps_per_tb=64)
    assert execute_program(fused).ok           # every rank ends with the root's data, no race, no deadlock
    assert _steps(fused, 1) == _steps(plain, 1) - count
    assert _steps(fused, 0) == _steps(plain, 0) and _steps(fused, 2) == _steps(plain, 2)
    parts = -(-count // 64)
    new = [tb for tb in fused.gpus[1].tbs if tb.chan >= plain.nchannels]
    assert [(tb.recv, tb.send, len(tb.steps)) for tb in new] == [
        (0, 2, min(64, count - 64 * k)) for k in range(parts)]
    assert all(st.type == "rcs" for tb in new for st in tb.steps)
    assert fused.nchannels == plain.nchannels + parts
    # (its time is the simulator's to judge: the writer keeps a fused file only where it runs fastest)
    assert simulate_program(fused, topo, MB).time_us > 0


def test_the_other_child_waits_for_the_fused_step(tree):
    _, _, plain = tree
    fused = fuse_flows(plain, [Flow(0, 1, 2, (TWO + 5,))], steps_per_tb=64)
    assert execute_program(fused).ok
    gpu = fused.gpus[1]
    (rcs_tb,) = [tb for tb in gpu.tbs if tb.chan >= plain.nchannels]
    assert rcs_tb.steps[0].hasdep == 1          # it publishes: the send of the chunk to GPU 3 waits on it
    to_3 = [st for tb in gpu.tbs if tb.send == 3 for st in tb.steps if st.type == "s" and st.srcoff == TWO + 5]
    assert [(st.depid, st.deps) for st in to_3] == [(rcs_tb.id, 0)]


def test_a_chunk_off_the_flow_is_refused(tree):
    _, _, plain = tree
    with pytest.raises(BackendError, match=r"flow 0->1->3: chunk 0 is not sent, received and forwarded by plain"):
        fuse_flows(plain, [Flow(0, 1, 3, (0,))], steps_per_tb=64)


def test_local_copies_merge_into_steps_of_at_most_the_cnt_limit(tree):
    topo, _, plain = tree
    merged = merge_local_copies(plain, 71)
    copies = [st for tb in merged.gpus[0].tbs for st in tb.steps if st.type == "cpy"]
    assert [st.cnt for st in copies] == [71, CHUNKS - 71]
    assert execute_program(merged).ok
    assert rank_elements(merged)[0] == rank_elements(plain)[0] - (CHUNKS - 2)
    assert simulate_program(merged, topo, MB).time_us == simulate_program(plain, topo, MB).time_us


def test_no_flow_is_chosen_where_every_rank_fits(tree):
    _, schedule, plain = tree
    assert list(flow_choices(schedule, plain, 64)) == []
    assert list(fused_flow_fits(schedule, load_topology("fully-connected-4"), "executor")) == []


def test_only_one_root_trees_are_fused():
    topo = load_topology("ring-4")
    allgather = Schedule(make_collective("allgather", 4, 1), topo.name,
                         tuple(Transfer(c, c, (c + 1) % 4, 0) for c in range(4)), 1)
    assert list(fused_flow_fits(allgather, topo, "executor")) == []


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_dgx1_1gb_fits_in_2048_chunks_at_99_percent(collective):
    from synth.synthesis.request import SynthesisRequest
    from synth.synthesis.solve import solve

    request = SynthesisRequest(load_topology("dgx1"), collective, 1 << 30)
    solution = solve(request)
    report = solution.report()
    assert report["chunks"] == 2048 and solution.xml.lowering.fused_flows
    assert report["percent_of_limit"] >= 99.0
    assert report["predicted_time_us"] == pytest.approx(report["plan_time_us"], rel=1e-9)
    program = solution.xml.program
    fit = measure(program, Lowering(False), "executor", 80)
    assert fit.fits and max(rank_elements(program)) <= 4095


def test_a_partial_sum_fuses_into_a_receive_reduce_copy_send():
    """On a Reduce chain 3 -> 2 -> 1 -> 0 the relay's receive-reduce and its send of the partial sum become one
    ``rrcs``."""
    from synth.schedule.ir import REDUCE, buffer_layout

    topo = load_topology("fully-connected-4")
    chunks = 8
    chain = tuple(Transfer(c, r, r - 1, step=c + 3 - r, op=REDUCE) for c in range(chunks) for r in (3, 2, 1))
    schedule = Schedule(make_collective("reduce", 4, chunks, 0), topo.name, chain, chunks + 2)
    plain = lower_to_msccl(schedule, topo, fuse=False)
    fused = fuse_flows(plain, [Flow(3, 2, 1, tuple(range(chunks)))], 64, buffer_layout(schedule).slot)
    assert execute_program(fused).ok
    assert [st.type for tb in fused.gpus[2].tbs if tb.chan >= plain.nchannels for st in tb.steps] == ["rrcs"] * chunks
    assert _steps(fused, 2) == _steps(plain, 2) - chunks


def test_two_flows_never_move_one_step():
    """A Reduce's 3 -> 2 -> 1 and 2 -> 1 -> 0 both hold the message 2 -> 1 of a chunk: fusing both is refused (the
    flows the writer picks never share a chunk)."""
    from synth.schedule.ir import REDUCE, buffer_layout

    topo = load_topology("fully-connected-4")
    chain = tuple(Transfer(c, r, r - 1, step=c + 3 - r, op=REDUCE) for c in range(4) for r in (3, 2, 1))
    schedule = Schedule(make_collective("reduce", 4, 4, 0), topo.name, chain, 6)
    plain = lower_to_msccl(schedule, topo, fuse=False)
    slot = buffer_layout(schedule).slot
    with pytest.raises(BackendError, match="flow 2->1->0: chunk 1 moves a step another flow moved"):
        fuse_flows(plain, [Flow(3, 2, 1, (1, 2)), Flow(2, 1, 0, (1,))], 64, slot)
    assert execute_program(fuse_flows(plain, [Flow(3, 2, 1, (1, 2)), Flow(2, 1, 0, (0, 3))], 64, slot)).ok


def test_synth_solve_says_the_flows_are_fused(tmp_path):
    from click.testing import CliRunner

    from synth.cli import main

    out = tmp_path / "broadcast.xml"
    result = CliRunner().invoke(main, ["solve", "broadcast", "--topology", "dgx1", "--size", "1GB", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "plain lowering with fused flows (executor)" in result.stderr and "99.2% of the limit" in result.stderr
    assert out.read_text().startswith("<algo")
