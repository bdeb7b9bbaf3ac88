"""Reductions between collectives (synth.schedule.transforms): reversal, concatenation, cutting into pieces."""

import pytest

from synth.formulations.routes import make_problem, shortest_path_routes
from synth.model.collectives import make_collective
from synth.model.topology import load_topology, reverse_topology
from synth.schedule.ir import COPY, REDUCE, Schedule, Transfer
from synth.schedule.list_scheduler import list_schedule
from synth.schedule.replay import replay_data, verify
from synth.schedule.transforms import (CollectiveProblem, Concatenation, CutIntoPieces, Reversal,
                                       concatenate_schedules, cut_into_pieces, reduction_for, reverse_schedule)
from synth.synthesis.steps import synthesize_steps

SIZE = 1 << 20


def _timed_allgather(topo, chunks=1):
    """A list-scheduled (timed) Allgather on ``topo`` from shortest-path trees; no solver involved."""
    coll = make_collective("allgather", topo.num_ranks, chunks)
    problem = make_problem(topo, coll, SIZE)
    return list_schedule(topo, coll, shortest_path_routes(problem).links, SIZE, "test")


def _timed_reducescatter(topo):
    """The reversal of a timed Allgather solved on the reversed topology."""
    reversal = Reversal(CollectiveProblem(topo, "reducescatter", chunks_per_rank=1))
    (dual,) = reversal.apply()
    return reversal.invert([_timed_allgather(dual.topology)])


def test_reversal_reverses_steps_ops_rounds_and_times():
    ag = Schedule(make_collective("allgather", 2, 1), "pair",
                  (Transfer(0, 0, 1, 0, COPY, 0.0, 2.0), Transfer(1, 1, 0, 1, COPY, 1.0, 5.0)), 2, 3, (1, 2))
    rs = reverse_schedule(ag, make_collective("reducescatter", 2, 1), "pair")
    assert rs.rounds_per_step == (2, 1) and rs.rounds == 3
    assert sorted((t.chunk, t.src, t.dst, t.step, t.op, t.start_us, t.end_us) for t in rs.transfers) == [
        (0, 1, 0, 1, REDUCE, 3.0, 5.0), (1, 0, 1, 0, REDUCE, 0.0, 4.0)]
    assert replay_data(rs) == []


def test_reversal_applied_twice_is_the_identity():
    ring = load_topology("ring-4")
    steps = synthesize_steps(ring, "allgather", 2, 3).schedule
    timed = _timed_allgather(load_topology("dgx1"))
    for forward in (steps, timed):
        rs = make_collective("reducescatter", forward.num_ranks, forward.collective.chunks_per_rank)
        back = reverse_schedule(reverse_schedule(forward, rs, "x"), forward.collective, forward.topology)
        assert back.rounds_per_step == forward.rounds_per_step and back.rounds == forward.rounds
        assert back.steps == forward.steps and back.collective == forward.collective
        key = lambda t: (t.chunk, t.src, t.dst, t.step, t.op)  # noqa: E731
        assert sorted(map(key, back.transfers)) == sorted(map(key, forward.transfers))
        for a, b in zip(sorted(back.transfers, key=key), sorted(forward.transfers, key=key)):
            assert (a.start_us, a.end_us) == pytest.approx((b.start_us, b.end_us), abs=1e-9) \
                if b.start_us is not None else (a.start_us, a.end_us) == (None, None)


def test_reversal_maps_problems_and_back():
    ring = load_topology("ring-4")
    reversal = reduction_for(CollectiveProblem(ring, "reduce", root=2, chunks_per_rank=2))
    assert isinstance(reversal, Reversal) and reversal.dual == "broadcast"
    (dual,) = reversal.apply()
    assert (dual.collective, dual.root, dual.chunks_per_rank) == ("broadcast", 2, 2)
    assert [(l.src, l.dst) for l in dual.topology.links] == [(l.src, l.dst) for l in reverse_topology(ring).links]
    forward = synthesize_steps(dual.topology, "broadcast", 2, 2, 2, root=2).schedule
    reduced = reversal.invert([forward])
    assert reduced.collective == make_collective("reduce", 4, 2, 2) and reduced.topology == "ring-4"
    assert {t.op for t in reduced.transfers} == {REDUCE}
    verify(reduced, ring, SIZE)


def test_timed_reduction_lowers_to_msccl_that_executes():
    """Reversed times order a rank's same-step receives of one chunk differently from their ops (regression:
    the lowering used to fuse a send into the receive that came last by time, not the one that runs last)."""
    from backends.msccl.writer import emit_verified_xml

    dgx1 = load_topology("dgx1")
    rs = _timed_reducescatter(dgx1)
    verify(rs, dgx1, SIZE)
    emit_verified_xml(rs, topology=dgx1, size_bytes=SIZE)


def test_ring4_reducescatter_then_allgather_replays_as_allreduce():
    ring = load_topology("ring-4")
    concat = reduction_for(CollectiveProblem(ring, "allreduce", chunks_per_rank=1))
    assert isinstance(concat, Concatenation)
    parts = concat.apply()
    assert [p.collective for p in parts] == ["reducescatter", "allgather"]
    solved = [synthesize_steps(ring, p.collective, 2, 2).schedule for p in parts]
    ar = concat.invert(solved)
    assert ar.collective == make_collective("allreduce", 4, 1)
    assert ar.steps == 4 and ar.rounds_per_step == solved[0].rounds_per_step + solved[1].rounds_per_step
    assert replay_data(ar) == []
    assert verify(ar, ring, SIZE).time_us == pytest.approx(
        verify(solved[0], ring, SIZE).time_us + verify(solved[1], ring, SIZE).time_us)


def test_concatenation_shifts_steps_and_times():
    dgx1 = load_topology("dgx1")
    rs, ag = _timed_reducescatter(dgx1), _timed_allgather(dgx1)
    ar = concatenate_schedules([rs, ag], make_collective("allreduce", 8, 1), "dgx1")
    assert ar.steps == rs.steps + ag.steps and ar.rounds is None
    rs_end = max(t.end_us for t in rs.transfers)
    second = ar.transfers[len(rs.transfers):]
    assert min(t.step for t in second) >= rs.steps
    assert sorted((t.start_us, t.end_us) for t in second) == sorted(
        (t.start_us + rs_end, t.end_us + rs_end) for t in ag.transfers)
    verify(ar, dgx1, SIZE)


def test_concatenation_refuses_parts_with_different_chunks():
    ring = load_topology("ring-4")
    concat = Concatenation(CollectiveProblem(ring, "allreduce"))
    rs = synthesize_steps(ring, "reducescatter", 2, 2, 1).schedule
    ag = synthesize_steps(ring, "allgather", 2, 4, 2).schedule
    with pytest.raises(ValueError, match="different chunks per rank"):
        concat.invert([rs, ag])


def test_cut_into_pieces_keeps_routes_and_replays():
    ring = load_topology("ring-4")
    cut = CutIntoPieces(CollectiveProblem(ring, "allgather", chunks_per_rank=4), 4)
    (whole,) = cut.apply()
    base = synthesize_steps(ring, "allgather", 2, 2, whole.chunks_per_rank).schedule
    piped = cut.invert([base])
    assert piped == cut_into_pieces(base, 4)
    assert piped.collective.chunks_per_rank == 4 and piped.steps == 4 * base.steps
    assert {(t.chunk // 4, t.src, t.dst) for t in piped.transfers} == {(t.chunk, t.src, t.dst) for t in base.transfers}
    assert replay_data(piped) == []
    with pytest.raises(ValueError, match="do not cut"):
        CutIntoPieces(CollectiveProblem(ring, "allgather", chunks_per_rank=3), 2).apply()


def test_direct_collectives_need_no_reduction():
    ring = load_topology("ring-4")
    for name in ("allgather", "alltoall", "broadcast", "gather", "scatter"):
        assert reduction_for(CollectiveProblem(ring, name)) is None
