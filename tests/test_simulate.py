"""Timing simulator: closed-form alpha-beta times, link and switch-port sharing, FIFO depth, traces."""

from __future__ import annotations

import json

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.msccl.ir import Gpu, MscclProgram

from synth.errors import InputError, SynthError, VerificationError
from backends.msccl.simulate import TraceEvent, simulate_program, trace_document, write_trace
from synth.model.topology import load_topology, topology_from_dict
from support.mutants import replace_tb, swap_steps
from support.programs import P, S, T, ring_allgather, ring_allreduce
from support.shared import load_shared
from support.strategies import TB_STRATEGY

BW_BYTES_PER_US = 25.0 * 1e3   # ring-N and fully-connected-N: 25 GB/s
ALPHA_US = 0.7


@pytest.mark.parametrize("n", [3, 4, 8])
def test_ring_allgather_time_is_closed_form(n):
    size = 1 << 20
    report = simulate_program(ring_allgather(n), load_topology(f"ring-{n}"), size)
    hop_us = ALPHA_US + (size / n) / BW_BYTES_PER_US
    assert report.time_us == pytest.approx((n - 1) * hop_us, rel=1e-12)
    assert report.chunk_bytes == size / n
    assert report.algbw_GBps == pytest.approx(size / report.time_us / 1e3)
    assert report.busbw_GBps == pytest.approx(report.algbw_GBps * (n - 1) / n)


def test_alpha_occupies_serialises_latency_on_the_link():
    n, size = 4, 1 << 20
    beta_us = (size / n) / BW_BYTES_PER_US
    report = simulate_program(ring_allgather(n), load_topology(f"ring-{n}"), size, alpha_occupies=True)
    # each send keeps its tb busy for alpha + beta; the forward waits for arrival (alpha + beta) as before
    assert report.time_us == pytest.approx((n - 1) * (ALPHA_US + beta_us))
    assert all(b.busy_us == pytest.approx((n - 1) * (ALPHA_US + beta_us)) for b in report.link_busy)
    assert report.alpha_occupies


def test_ring_allreduce_time_and_reduction_cost():
    n, size = 4, 1 << 20
    chunk = size / n
    hop_us = ALPHA_US + chunk / BW_BYTES_PER_US
    base = simulate_program(ring_allreduce(n), load_topology(f"ring-{n}"), size)
    assert base.time_us == pytest.approx(2 * (n - 1) * hop_us)
    assert base.busbw_GBps == pytest.approx(base.algbw_GBps * 2 * (n - 1) / n)
    reduce_us_per_byte = 1e-5
    slow = simulate_program(ring_allreduce(n), load_topology(f"ring-{n}"), size, reduce_us_per_byte=reduce_us_per_byte)
    # n-1 reducing hops (n-2 rrs and one rrcs) on the critical path
    assert slow.time_us == pytest.approx(base.time_us + (n - 1) * chunk * reduce_us_per_byte)


def _switch(n: int, port_GBps: float = 10.0) -> dict:
    return {"ranks": n, "switches": [{"name": "nvs", "alpha_us": 1.0,
                                      "ports": [{"ranks": [r], "bw_GBps": port_GBps} for r in range(n)]}]}


def _fan_out(targets: list[int]):
    """Rank 0 sends its chunk to every target from its own tb; each target receives it."""
    gpus = {0: [T(p, -1, 0, S("s", "i0", "o0")) for p in targets]}
    for r in range(1, 3):
        gpus[r] = [T(-1, 0, 0, S("r", "i0", "o0"))] if r in targets else []
    return P("custom", gpus, 1, (1, 1, 0))


def test_switch_port_sharing_slows_concurrent_sends():
    topo = topology_from_dict(_switch(3), "switch-3")
    size = 1_000_000
    beta_us = size / (10.0 * 1e3)
    one = simulate_program(_fan_out([1]), topo, size)
    two = simulate_program(_fan_out([1, 2]), topo, size)
    assert one.time_us == pytest.approx(1.0 + beta_us)
    # the second send waits for rank 0's egress port
    assert two.time_us == pytest.approx(1.0 + 2 * beta_us)


def test_direct_links_do_not_share_bandwidth():
    topo = load_topology("fully-connected-3")
    size = 1_000_000
    two = simulate_program(_fan_out([1, 2]), topo, size)
    assert two.time_us == pytest.approx(ALPHA_US + size / BW_BYTES_PER_US)


def test_two_tbs_on_one_link_serialise():
    # two channels from rank 0 to rank 1 share the one link
    gpus = {0: [T(1, -1, 0, S("s", "i0", "o0")), T(1, -1, 1, S("s", "i1", "o1"))],
            1: [T(-1, 0, 0, S("r", "i0", "o0")), T(-1, 0, 1, S("r", "i1", "o1"))]}
    program = P("custom", gpus, 2, (2, 2, 0))
    size = 1_000_000
    report = simulate_program(program, load_topology("ring-2"), size)
    assert report.time_us == pytest.approx(ALPHA_US + 2 * (size / 2) / BW_BYTES_PER_US)


def test_fifo_depth_throttles_a_burst_of_sends():
    # rank 0 sends 3 messages; rank 1 first waits on a slow message from rank 2, then takes them
    gpus = {0: [T(1, -1, 0, S("s", "i0", "o0"), S("s", "i1", "o1"), S("s", "i2", "o2"))],
            1: [T(-1, 2, 1, S("r", "i0", "o0", hasdep=1)),
                T(-1, 0, 0, S("r", "i0", "o0", dep=(0, 0)), S("r", "i1", "o1"), S("r", "i2", "o2"))],
            2: [T(1, -1, 1, S("s", "i0", "o0", cnt=3))]}
    program = P("custom", gpus, 3, (3, 3, 0))
    size = 3_000_000
    report = simulate_program(program, load_topology("fully-connected-3"), size)
    beta_us = 1_000_000 / BW_BYTES_PER_US
    slow_arrival = ALPHA_US + 3 * beta_us
    # with 2 slots, rank 0's third send waits for rank 1 to take the first (at slow_arrival)
    assert report.fifo_depth == 2
    assert report.time_us == pytest.approx(slow_arrival + ALPHA_US + beta_us)


def test_program_that_does_not_fit_the_topology_is_an_input_error():
    with pytest.raises(InputError, match="has 4 GPUs but topology ring-8 has 8 ranks"):
        simulate_program(ring_allgather(4), load_topology("ring-8"), 1 << 20)
    bad = replace_tb(ring_allgather(4), 0, 0, send=2)
    with pytest.raises(InputError, match=r"gpu 0 tb 0: sends to rank 2, but topology ring-4 has no link 0->2"):
        simulate_program(bad, load_topology("ring-4"), 1 << 20)
    with pytest.raises(InputError, match="size must be positive"):
        simulate_program(ring_allgather(4), load_topology("ring-4"), 0)


def test_deadlocking_program_cannot_be_timed():
    program = ring_allgather(4)
    for r in range(4):
        program = swap_steps(program, r, 0, 0, 1)
    with pytest.raises(VerificationError, match="deadlocks"):
        simulate_program(program, load_topology("ring-4"), 1 << 20)


def test_shared_files_time_on_matching_topologies():
    ring = simulate_program(load_shared("allgather_ring_8gpu_1ch_1inst.xml"), load_topology("ring-8"), 1 << 20)
    assert ring.protocol == "LL128" and ring.fifo_depth == 8
    assert ring.time_us == pytest.approx(7 * (ALPHA_US + (1 << 17) / BW_BYTES_PER_US))
    dgx1 = simulate_program(load_shared("dgx1_allgather_s2_r3_c2.xml"), load_topology("dgx1"), 1 << 20)
    assert 0 < dgx1.time_us < ring.time_us
    assert all(0 < b.utilisation <= 1 for b in dgx1.link_busy)


def test_trace_has_one_track_per_tb_and_per_link(tmp_path):
    report = simulate_program(ring_allgather(4), load_topology("ring-4"), 1 << 20)
    path = tmp_path / "trace.json"
    write_trace(report, path)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in spans if e["cat"] == "tb"} == {(r, 0) for r in range(4)}
    link_tracks = {(e["pid"], e["tid"]) for e in spans if e["cat"] == "link"}
    assert len(link_tracks) == 4 and all(pid == 4 for pid, _ in link_tracks)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "link 0->1" in names and "tb 0 (send 1, recv 3, chan 0)" in names
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(report.time_us)


def test_trace_from_bare_events():
    doc = trace_document([TraceEvent("x", "tb", 0, 1, 0.0, 2.5), TraceEvent("y", "link", 1, 0, 1.0, 1.0)])
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [("x", 0.0, 2.5), ("y", 1.0, 1.0)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(TB_STRATEGY, max_size=3), min_size=3, max_size=3), st.sampled_from(["Simple", "LL"]))
def test_any_program_is_timed_or_refused_with_a_synth_error(tbs_per_gpu, proto):
    gpus = tuple(Gpu(r, 2, 3, 1, tuple(dataclasses.replace(tb, id=k) for k, tb in enumerate(tbs)))
                 for r, tbs in enumerate(tbs_per_gpu))
    program = MscclProgram("fuzz", proto, 2, 3, 3, "allgather", 0, None, None, None, gpus)
    try:
        report = simulate_program(program, load_topology("fully-connected-3"), 3000)
    except SynthError:
        return
    assert report.time_us >= 0
