"""The list scheduler plans what the runtime runs: with the runtime's FIFO depth, a schedule's planned (replayed)
time is the simulated time of its MSCCL program, also for reductions booked from a reversed tree schedule."""

from __future__ import annotations

import numpy as np
import pytest

from backends.msccl.interpret import RUNTIME_FIFO_DEPTH as BACKEND_FIFO_DEPTH
from backends.msccl.lowering import lower_to_msccl
from backends.msccl.simulate import simulate_program
from synth.model.collectives import make_collective
from synth.model.topology import load_topology, reverse_topology
from synth.schedule.ir import COPY
from synth.schedule.list_scheduler import (RUNTIME_FIFO_DEPTH, _along_one_chain, _book_greedily,
                                           _fastest_in_sequence, hop_times_us, list_schedule, reverse_in_time,
                                           transfer_table)
from synth.schedule.replay import replay_data, verify
from synth.schedule.transforms import reverse_schedule
from synth.synthesis.trees import _pack
from synth.solver.highs import SolverOptions

MB = 1 << 20


def test_fifo_depth_is_the_runtimes_for_the_simple_protocol():
    assert RUNTIME_FIFO_DEPTH == BACKEND_FIFO_DEPTH["Simple"]


def _simulated(schedule, topo, size):
    return simulate_program(lower_to_msccl(schedule, topology=topo, fuse=False), topo, size).time_us


@pytest.fixture(scope="module")
def dgx1_reducescatter():
    """dgx1 ReduceScatter's tree packing (16 chunks per rank): the Allgather on the reversed topology, scheduled."""
    topo = load_topology("dgx1")
    rev = reverse_topology(topo)
    phase = _pack(rev, "allgather", 64 * MB, None, 16, SolverOptions())
    forward = list_schedule(rev, make_collective("allgather", 8, 16), phase.routes, 64 * MB, "test", fifo_depth=None)
    return topo, forward


def test_reversed_trees_booked_forward_run_as_planned(dgx1_reducescatter):
    topo, forward = dgx1_reducescatter
    rs = make_collective("reducescatter", 8, 16)
    planned = reverse_in_time(forward, topo, rs, 64 * MB, "test")
    assert replay_data(planned) == []
    assert {t.op for t in planned.transfers} == {"reduce"}
    replayed = verify(planned, topo, 64 * MB).time_us
    planned_us = max(t.end_us for t in planned.transfers)
    assert replayed <= planned_us + 1e-6           # the replay's unbounded buffers are never slower
    assert _simulated(planned, topo, 64 * MB) == pytest.approx(planned_us, rel=1e-3)
    # and as fast as the forward schedule it came from
    assert planned_us <= verify(forward, reverse_topology(topo), 64 * MB).time_us * 1.01


def test_booking_forward_never_runs_slower_than_the_pure_time_reversal(dgx1_reducescatter):
    """Why reductions are booked forward: the reflected schedule replays as fast as the plan, but partial sums
    can wait on each other in the runtime's FIFOs (with HiGHS 1.15's packing here it ran 24% slower; how much
    depends on the packing the solver returns), while the booked plan runs as planned."""
    topo, forward = dgx1_reducescatter
    rs = make_collective("reducescatter", 8, 16)
    reflected = reverse_schedule(forward, rs, topo.name)
    booked = reverse_in_time(forward, topo, rs, 64 * MB, "test")
    assert verify(reflected, topo, 64 * MB).time_us <= max(t.end_us for t in booked.transfers) + 1e-6
    assert _simulated(booked, topo, 64 * MB) <= _simulated(reflected, topo, 64 * MB) * (1 + 1e-9)


def test_a_full_fifo_delays_the_sender_as_the_runtime_does():
    """Rank 0 sends four partial sums straight to the root and rank 3 four through rank 2: with one message in
    flight a send waits for the previous one to be taken (alpha later), and the plan shows it as the simulator."""
    topo = load_topology("ring-4")
    li = topo.link_index
    coll = make_collective("reduce", 4, 4, root=1)
    routes = [(li[(0, 1)], li[(3, 2)], li[(2, 1)])] * 4
    free = list_schedule(topo, coll, routes, MB, "test", fifo_depth=None)
    tight = list_schedule(topo, coll, routes, MB, "test", fifo_depth=1, channels=(1,))
    assert replay_data(tight) == []
    planned = max(t.end_us for t in tight.transfers)
    assert planned > max(t.end_us for t in free.transfers) + 1.0
    program = lower_to_msccl(tight, topology=topo, fuse=False)
    assert simulate_program(program, topo, MB, fifo_depth=1).time_us == pytest.approx(planned)


def test_two_channels_give_a_connection_two_fifos_and_the_plan_times_them_as_the_runtime_does():
    """The same partial sums on two channels (chunk c on channel c % 2): each channel's FIFO holds its own
    message, so fewer sends wait; the plan takes the faster timing and the two-channel program runs as planned."""
    topo = load_topology("ring-4")
    li = topo.link_index
    coll = make_collective("reduce", 4, 4, root=1)
    routes = [(li[(0, 1)], li[(3, 2)], li[(2, 1)])] * 4
    one = list_schedule(topo, coll, routes, MB, "test", fifo_depth=1, channels=(1,))
    best = list_schedule(topo, coll, routes, MB, "test", fifo_depth=1, channels=(1, 2))
    planned = max(t.end_us for t in best.transfers)
    assert planned < max(t.end_us for t in one.transfers) - 1.0
    program = lower_to_msccl(best, topology=topo, fuse=False, channels=2)
    assert simulate_program(program, topo, MB, fifo_depth=1).time_us == pytest.approx(planned)


def test_unknown_rule_is_refused():
    topo = load_topology("ring-4")
    with pytest.raises(ValueError, match="unknown rule 'fastest'"):
        list_schedule(topo, make_collective("allgather", 4, 1), [()] * 4, MB, "test", rule="fastest")


def _port_orders(topo, timed):
    """Per switch port, the links its messages came from in the order they started there."""
    orders = {}
    for start, src, dst in sorted(timed):
        for port in topo.link(src, dst).ports:
            orders.setdefault(port, []).append((src, dst))
    return orders


def test_a_nic_two_ranks_share_serves_them_in_the_order_the_runtime_does():
    """GPUs 0 and 1 of a DGX-2 share one NIC: the runtime serves their sends in the order they come, which the
    program cannot change (dependencies order one rank's steps only). The plan books them so, and its order on
    every port and its time are the simulator's (greedy booking by priority put two of GPU 0's sends first)."""
    topo = load_topology("dgx2", nodes=2)
    li = topo.link_index
    coll = make_collective("allgather", 32, 4)
    routes = [()] * len(coll.chunks)
    for piece in range(4):
        routes[piece] = (li[(0, 16)], li[(16, 18)])           # rank 0's pieces: NIC, then the far NVSwitch
        routes[4 + piece] = (li[(1, 17)], li[(17, 18)])
    plan = list_schedule(topo, coll, routes, 64 * MB, "test")
    report = simulate_program(lower_to_msccl(plan, topology=topo, fuse=False), topo, 64 * MB)
    assert report.time_us == pytest.approx(max(t.end_us for t in plan.transfers))
    simulated = [(e.start_us, e.args["src"], e.args["dst"]) for e in report.events if e.track == "link"]
    assert _port_orders(topo, simulated) == _port_orders(topo, [(t.start_us, t.src, t.dst) for t in plan.transfers])


def test_rule_sequence_sends_in_rank_order_and_refuses_a_cycle():
    topo = load_topology("ring-4")
    li = topo.link_index
    coll = make_collective("allgather", 4, 2)
    routes = [(li[(0, 1)],), (li[(0, 1)],)] + [()] * 6
    later_first = list_schedule(topo, coll, routes, MB, "test", rank=np.array([1.0, 0.0]), rule="sequence")
    assert [t.chunk for t in sorted(later_first.transfers, key=lambda t: t.start_us)] == [1, 0]
    # chunk 0 goes 0 -> 1 -> 2 -> 3 and chunk 4 goes 2 -> 3 -> 0 -> 1, and each of 0 -> 1 and 2 -> 3 is to carry
    # the other chunk first: neither can start
    hop = {pair: li[pair] for pair in ((0, 1), (1, 2), (2, 3), (3, 0))}
    routes = [(hop[0, 1], hop[1, 2], hop[2, 3])] + [()] * 3 + [(hop[2, 3], hop[3, 0], hop[0, 1])] + [()] * 3
    with pytest.raises(ValueError, match="6 transfers wait for each other"):
        list_schedule(topo, coll, routes, MB, "test", rank=np.array([1.0, 0, 0, 1, 0, 0]), rule="sequence")


def test_a_retimed_allreduce_plans_what_its_file_runs():
    """ReduceScatter then Allgather on ring-4 (4 pieces): the parts' steps put every ReduceScatter transfer on a
    link before its Allgather ones and the replay says 43.3 us, but the file's channels let ready Allgather sends
    go first (35.5 us). Retimed as the runtime serves it, the plan is the file's time, and its data is intact."""
    from backends.msccl.writer import emit_verified_xml
    from synth.schedule.list_scheduler import retime
    from synth.schedule.transforms import concatenate_schedules
    from synth.synthesis.alphabeta import synthesize_alpha_beta

    topo = load_topology("ring-4")
    parts = [synthesize_alpha_beta(topo, name, MB, chunks=1, pieces=4).schedule
             for name in ("reducescatter", "allgather")]
    allreduce = concatenate_schedules(parts, make_collective("allreduce", 4, 4), topo.name)
    retimed = retime(allreduce, topo, MB)
    planned = verify(retimed, topo, MB).time_us
    assert planned == pytest.approx(max(t.end_us for t in retimed.transfers))
    assert planned < verify(allreduce, topo, MB).time_us * 0.9
    simulated = emit_verified_xml(retimed, topo, "executor", MB, plan_us=planned).simulated_us
    assert simulated == pytest.approx(planned, rel=0.03)


def test_sends_that_reach_a_shared_port_together_go_in_the_simulators_order():
    """Seven GPUs of a dgx-h100 send their partial sums to GPU 2 at once, the schedule's steps naming GPU 7 first:
    no program can order sends of different ranks, and the simulator serves them by sender rank, so the retimed
    plan does too and its time is the file's (a plan that kept the steps' order was 5% off on dgx-h100 Reduce
    1 MB once the sends that followed differed)."""
    from synth.schedule.ir import REDUCE, Schedule, Transfer
    from synth.schedule.list_scheduler import retime

    topo = load_topology("dgx-h100")
    coll = make_collective("reduce", 8, 1, root=2)
    senders = [7, 6, 5, 4, 3, 1, 0]
    schedule = Schedule(coll, topo.name, tuple(Transfer(0, r, 2, k, REDUCE) for k, r in enumerate(senders)),
                        len(senders), method="test")
    retimed = retime(schedule, topo, MB, channels=(1,))
    assert [t.src for t in retimed.ordered()] == sorted(senders)
    planned = verify(retimed, topo, MB).time_us
    assert _simulated(retimed, topo, MB) == pytest.approx(planned)


def _booked_both_ways(topo, coll, routes, size, tie, rule, fifo_depth=RUNTIME_FIFO_DEPTH):
    """(the chain's shortcut, the general greedy booking then, with FIFOs, its timing in the runtime's order) of one
    problem: each (booking order, start us, arrival us), the shortcut None where it does not apply."""
    nbytes = coll.chunk_bytes(size)
    table = transfer_table(topo, routes, hop_times_us(topo, nbytes))
    chained = _along_one_chain(topo, table, nbytes, COPY, tie, rule, fifo_depth)
    general = _book_greedily(topo, coll, table, nbytes, COPY, False, tie, rule, fifo_depth)
    if fifo_depth is not None:
        general = _fastest_in_sequence(topo, table, nbytes, COPY, general[0], fifo_depth, (1,), "chunk")
    return chained, general


@pytest.mark.parametrize("name, chunks, size", [("dgx2", 64, 1 << 30), ("dgx2", 5, MB), ("dgx2", 1, 1 << 10),
                                                ("ring-4", 16, MB)])
@pytest.mark.parametrize("rule", ["deadline", "work", "rank"])
@pytest.mark.parametrize("fifo_depth", [RUNTIME_FIFO_DEPTH, None])
def test_a_chain_is_booked_directly_as_the_greedy_booking_and_its_timing_book_it(name, chunks, size, rule,
                                                                                  fifo_depth):
    """Every chunk down one chain (the ring from rank 1), ranked as the tree packing ranks them (the q-th chunk
    at progress (q + 1/2) / n; for "rank", shuffled with repeats), behind the runtime's FIFOs or with unbounded
    buffers: the shortcut gives the same booking order and the same start and arrival times, to the last bit."""
    topo = load_topology(name)
    n = topo.num_ranks
    ring = [(1 + k) % n for k in range(n)]
    chain = tuple(topo.link_index[(a, b)] for a, b in zip(ring, ring[1:]))
    coll = make_collective("broadcast", n, chunks, root=1)
    progress = [(q + 0.5) / chunks for q in range(chunks)]
    if rule == "rank":
        progress = np.random.default_rng(7).permutation(progress).round(1).tolist()
    tie = np.array([p * 1e3 for p in progress for _ in chain])
    chained, general = _booked_both_ways(topo, coll, [chain] * chunks, size, tie, rule, fifo_depth)
    assert chained is not None
    assert list(chained[0]) == list(general[0])
    assert chained[1].tolist() == general[1].tolist() and chained[2].tolist() == general[2].tolist()


def test_the_chain_shortcut_leaves_branches_and_shared_ports_to_the_general_booking():
    """Routes that are not one chain of links with ports of their own are booked the general way: trees that
    branch, chunks on different chains, and a chain that passes twice through one NIC (GPUs 0 and 1 of a DGX-2
    share one)."""
    ring = load_topology("ring-4")
    li = ring.link_index
    coll = make_collective("broadcast", 4, 2, root=0)
    tie = np.zeros(6)
    branching = (li[(0, 1)], li[(0, 3)], li[(1, 2)])
    assert _booked_both_ways(ring, coll, [branching] * 2, MB, tie, "work")[0] is None
    two_chains = [(li[(0, 1)], li[(1, 2)], li[(2, 3)]), (li[(0, 3)], li[(3, 2)], li[(2, 1)])]
    assert _booked_both_ways(ring, coll, two_chains, MB, tie, "work")[0] is None
    dgx2 = load_topology("dgx2", nodes=2)
    li = dgx2.link_index
    through_one_nic = (li[(0, 16)], li[(16, 1)], li[(1, 17)])
    coll = make_collective("broadcast", 32, 2, root=0)
    chained, general = _booked_both_ways(dgx2, coll, [through_one_nic] * 2, MB, tie, "work")
    assert chained is None and general is not None
