"""Alpha-beta synthesis: every formulation verifies, pipelining keeps correctness, sketches are respected."""

import pytest

from synth.synthesis.alphabeta import synthesize_alpha_beta
from synth.model.collectives import make_collective
from synth.formulations.routed import decode_routed, encode_routed
from synth.errors import InfeasibleError, InputError
from synth.schedule.replay import replay_data, verify
from synth.schedule.list_scheduler import list_schedule
from synth.schedule.transforms import cut_into_pieces
from synth.formulations.routes import make_problem, route_loads, shortest_path_routes
from synth.model.sketch import load_sketch, sketch_from_dict
from synth.solver.highs import SolverOptions, solve_model
from synth.synthesis.steps import synthesize_steps
from synth.model.topology import load_topology

QUICK = SolverOptions(time_limit_s=5.0, mip_gap=1e-3)
MB = 1 << 20


@pytest.fixture(scope="module")
def tecc():
    return load_topology("ndv2-2node-tecc")


@pytest.mark.parametrize("topo_name", ["ring-4", "ring-8"])
@pytest.mark.parametrize("method", ["routed", "timexp"])
def test_each_formulation_verifies_on_rings(topo_name, method):
    topo = load_topology(topo_name)
    result = synthesize_alpha_beta(topo, "allgather", 8 * MB, method=method, options=QUICK)
    report = verify(result.schedule, topo, 8 * MB)
    assert result.status in ("optimal", "feasible")
    assert result.steps == result.schedule.steps and result.rounds is None
    assert report.time_us == pytest.approx(result.schedule.notes["time_us"])
    # a bidirectional ring moves (n-1)/n of the buffer over 2 links per rank: the cut bound
    n = topo.num_ranks
    bound_us = (n - 1) / n * 8 * MB / 2 / (25 * 1e3)
    assert report.time_us >= bound_us


@pytest.mark.parametrize("method", ["routed", "timexp"])
def test_each_formulation_verifies_on_ndv2_two_nodes(tecc, method):
    result = synthesize_alpha_beta(tecc, "allgather", 16 * MB, method=method, sketch="ndv2-tecc-relay",
                                   options=QUICK)
    report = verify(result.schedule, tecc, 16 * MB)
    # 8 shards of 1 MB cross one 12.5 GB/s link: 671 us is the limit, pipelining gets within a few percent
    assert report.time_us < 1.05 * (8 * MB / 12.5e3)
    assert result.symmetry_order == 2


def test_timexp_flow_lp_solves_alltoall():
    topo = load_topology("ring-4")
    result = synthesize_alpha_beta(topo, "alltoall", 4 * MB, method="timexp", options=QUICK)
    assert replay_data(result.schedule) == []
    assert result.schedule.notes["model"] == "timexp-flow-lp"


def test_routed_milp_balances_what_shortest_paths_overload():
    topo = load_topology("dgx2-2node-tecc")
    coll = make_collective("allgather", topo.num_ranks, 1)
    problem = make_problem(topo, coll, 1e9, load_sketch("dgx2-tecc-relay", topo))
    start = shortest_path_routes(problem)
    enc = encode_routed(problem, start, pieces=8)
    res = solve_model(enc.model, SolverOptions(time_limit_s=30), initial=enc.start)
    routes = decode_routed(enc, res)
    # the NVSwitch ingress of an odd GPU must take 31 shards of 31.25 MB at 125 GB/s: 7750 us
    assert route_loads(problem, start)[0] > 11000
    assert route_loads(problem, routes)[0] == pytest.approx(7750.0)


@pytest.mark.parametrize("coll", ["reducescatter", "allreduce", "reduce", "broadcast", "gather", "scatter",
                                  "alltoall"])
def test_every_collective_verifies(tecc, coll):
    result = synthesize_alpha_beta(tecc, coll, 4 * MB, options=QUICK, root=3)
    report = verify(result.schedule, tecc, 4 * MB)
    assert report.time_us > 0
    if coll in ("reducescatter", "allreduce", "reduce"):
        assert any(t.op == "reduce" for t in result.schedule.transfers)


def test_pipelining_preserves_correctness_and_helps_when_bandwidth_bound():
    topo = load_topology("ring-4")
    base = synthesize_steps(topo, "broadcast", steps=2, rounds=2).schedule  # the far rank is 2 hops away
    before = verify(base, topo, 1 << 30).time_us
    for k in (2, 4, 8):
        piped = cut_into_pieces(base, k)
        assert piped.collective.chunks_per_rank == k and replay_data(piped) == []
        after = verify(piped, topo, 1 << 30).time_us
        assert after <= before + 1e-6
    # two store-and-forward hops of the whole buffer become one buffer time plus one piece
    assert verify(cut_into_pieces(base, 8), topo, 1 << 30).time_us < 0.6 * before


def test_pipelining_a_reduction_keeps_every_partial_sum():
    topo = load_topology("dgx1")
    rs = synthesize_steps(topo, "reducescatter", 2, 3, 2).schedule
    piped = cut_into_pieces(rs, 3)
    assert replay_data(piped) == []
    assert verify(piped, topo, 1 << 30).time_us <= verify(rs, topo, 1 << 30).time_us + 1e-6


def test_list_schedule_time_is_what_the_replay_measures(tecc):
    coll = make_collective("allgather", 16, 2)
    problem = make_problem(tecc, coll, 64 * MB, load_sketch("ndv2-tecc-relay", tecc))
    routes = shortest_path_routes(problem)
    sched = list_schedule(tecc, coll, routes.links, 64 * MB, "test")
    last = max(t.end_us for t in sched.transfers)
    assert verify(sched, tecc, 64 * MB).time_us == pytest.approx(last)


def test_routed_respects_the_sketchs_allowed_links():
    topo = load_topology("dgx1")
    ring = [0, 1, 3, 2, 6, 7, 5, 4]
    sketch = sketch_from_dict({"intranode": {"strategy": "ring", "ring": ring, "bidirectional": True}}, topo)
    result = synthesize_alpha_beta(topo, "allgather", 8 * MB, method="routed", sketch=sketch, options=QUICK)
    pairs = set(zip(ring, ring[1:] + ring[:1]))
    pairs |= {(b, a) for a, b in pairs}
    assert {(t.src, t.dst) for t in result.schedule.transfers} <= pairs
    verify(result.schedule, topo, 8 * MB)


def test_relays_decide_who_carries_chunks_across_nodes():
    topo = load_topology("ndv2", 2)
    sketch = load_sketch("ndv2-nic-relay", topo)
    result = synthesize_alpha_beta(topo, "allgather", 16 * MB, sketch=sketch, options=QUICK)
    crossing = {(t.src % 8, t.dst % 8) for t in result.schedule.transfers if t.src // 8 != t.dst // 8}
    assert crossing == {(1, 0)}


def test_the_routed_start_is_feasible_where_a_rank_is_out_of_its_reach():
    # ndv2 x2 Gather 1 KB under ndv2-nic-relay: node 1's GPUs off the start's routes cannot be reached before
    # the start's makespan H (their lower bound is past it); the big-M rows once assumed every t <= H, and HiGHS
    # called the model infeasible ("rejected its own starting routes")
    import numpy as np

    topo = load_topology("ndv2", 2)
    problem = make_problem(topo, make_collective("gather", 16, 1, 0), 1024, load_sketch("ndv2-nic-relay", topo))
    enc = encode_routed(problem, shortest_path_routes(problem), pieces=1)
    m, x = enc.model, enc.start
    dense = np.zeros((len(m.row_lower), len(m.cost)))
    np.add.at(dense, (m.rows, m.cols), m.vals)
    tol = 1e-9
    assert np.all(dense @ x >= m.row_lower - tol) and np.all(dense @ x <= m.row_upper + tol)
    assert np.all(x >= m.col_lower - tol) and np.all(x <= m.col_upper + tol)
    result = synthesize_alpha_beta(topo, "gather", 1024, method="routed", sketch="ndv2-nic-relay", options=QUICK)
    verify(result.schedule, topo, 1024)


def test_a_sketchs_pieces_hint_is_the_most_tried():
    # the built-in sketches say 8 pieces (right at 1 GB); fewer compete, timed with the runtime's FIFOs
    result = synthesize_alpha_beta(load_topology("ndv2-2node-tecc"), "allgather", MB, method="routed",
                                   sketch="ndv2-tecc-relay", options=QUICK)
    tried = {int(label.rsplit(" x", 1)[1]) for label in result.schedule.notes["candidates_us"]}
    assert tried == {1, 2, 4, 8}


def test_infeasible_sketch_names_the_constraint_to_relax(tecc):
    sketch = sketch_from_dict({"internode": {"connections": {"1": [0]}, "relays": {"1": [1]}}}, tecc, "mine.json")
    with pytest.raises(InfeasibleError) as info:
        synthesize_alpha_beta(tecc, "allgather", MB, sketch=sketch, options=QUICK)
    assert "internode.relays" in str(info.value) and "mine.json" in str(info.value)


def test_unknown_method_is_an_input_error(tecc):
    with pytest.raises(InputError, match="routed"):
        synthesize_alpha_beta(tecc, "allgather", MB, method="magic")


def test_small_messages_use_latency_optimal_trees(tecc):
    result = synthesize_alpha_beta(tecc, "allgather", 1000, sketch="ndv2-tecc-relay", options=QUICK)
    # the alpha-weighted diameter is 4.1 us (0.7 + 0.7 + 1.3 + 0.7 + 0.7)
    assert verify(result.schedule, tecc, 1000).time_us < 4.3


def test_time_expanded_rolling_horizon_returns_a_verified_schedule():
    from synth.formulations import timexp as te
    from synth.schedule.list_scheduler import book_in_order

    topo = load_topology("ring-4")
    coll = make_collective("allgather", 4, 1)
    problem = make_problem(topo, coll, 8 * MB, None)
    start = shortest_path_routes(problem)
    epoch = te.choose_epoch(problem, start, 48)
    start_epochs, horizon = te.epoch_start(problem, te.make_grid(problem, epoch, 10 ** 9), start)
    enc = te.encode_timexp(problem, te.make_grid(problem, epoch, horizon + 2), start_epochs)
    res = te.solve_rolling(enc, QUICK, window=2)
    assert res.status == "feasible" and res.x is not None
    routes, position = te.decode_copies(enc, res)
    sched = book_in_order(topo, coll, routes.links, 8 * MB, "timexp", position)
    assert verify(sched, topo, 8 * MB).time_us <= (horizon + 2) * epoch + 1e-6


def test_disconnecting_intranode_links_are_blamed():
    topo = load_topology("dgx1")
    sketch = sketch_from_dict({"intranode": {"strategy": "links", "links": [[0, 1], [1, 0]]}}, topo, "two.json")
    with pytest.raises(InfeasibleError, match="relax intranode"):
        synthesize_alpha_beta(topo, "allgather", MB, sketch=sketch, options=QUICK)


def test_uc_min_uses_fewer_switch_connections_than_uc_max():
    topo = load_topology("dgx-a100")
    coll = make_collective("allgather", 8, 1)
    used = {}
    for strategy in ("uc-max", "uc-min"):
        problem = make_problem(topo, coll, 1 << 26, sketch_from_dict({"switch": {"strategy": strategy}}, topo))
        enc = encode_routed(problem, shortest_path_routes(problem), pieces=4)
        routes = decode_routed(enc, solve_model(enc.model, QUICK, initial=enc.start))
        used[strategy] = len({li for r in routes.links for li in r})
    assert used["uc-min"] < used["uc-max"] == 56
