"""MSCCL XML backend: lowering, runtime limits and the lexical rules both runtimes' hand-written lexers need."""

import re

import defusedxml.ElementTree as ET
import pytest

from backends.msccl.lint import for_target
from backends.msccl.limits import MAX_STEPS_EXECUTOR, runtime_limits
from backends.msccl.lowering import lower_to_msccl, render_msccl_xml
from backends.msccl.writer import emit_verified_xml
from support.instances import DGX1_EVERY_COLLECTIVE
from synth.errors import BackendError
from synth.synthesis.steps import synthesize_steps

ALGO_ATTRS = {"name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
              "minBytes", "maxBytes"}
STEP_ATTRS = {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"}


@pytest.fixture(scope="module")
def dgx1_schedules(dgx1):
    return {coll: synthesize_steps(dgx1, coll, S, R, C).schedule for coll, S, R, C in DGX1_EVERY_COLLECTIVE}


def verified_xml(schedule, target="executor"):
    from synth.model.topology import load_topology
    return emit_verified_xml(schedule, load_topology("dgx1"), target).text


@pytest.mark.parametrize("coll", [c[0] for c in DGX1_EVERY_COLLECTIVE])
def test_xml_has_required_attributes_and_lexical_rules(dgx1_schedules, coll):
    text = verified_xml(dgx1_schedules[coll])
    assert not text.startswith("<?xml") and "\t" not in text
    for line in text.splitlines():
        assert line.count('="') <= 16
        assert all(len(v) <= 254 for v in re.findall(r'="([^"]*)"', line))
    root = ET.fromstring(text)
    assert set(root.attrib) == ALGO_ATTRS
    assert int(root.get("ngpus")) == 8 and len(root.findall("gpu")) == 8
    for gpu in root.findall("gpu"):
        tbs = gpu.findall("tb")
        assert [int(tb.get("id")) for tb in tbs] == list(range(len(tbs)))
        seen = set()
        for tb in tbs:
            chan, send, recv = int(tb.get("chan")), int(tb.get("send")), int(tb.get("recv"))
            for peer, direction in ((send, "s"), (recv, "r")):
                if peer >= 0:
                    assert (peer, chan, direction) not in seen, "two tbs for one (peer, channel, direction)"
                    seen.add((peer, chan, direction))
            steps = tb.findall("step")
            assert len(steps) <= MAX_STEPS_EXECUTOR
            for i, st in enumerate(steps):
                assert set(st.attrib) == STEP_ATTRS and int(st.get("s")) == i


def test_reducescatter_spelling_follows_target(dgx1_schedules):
    sched = dgx1_schedules["reducescatter"]
    assert 'coll="reducescatter"' in verified_xml(sched, target="executor")
    assert 'coll="reduce_scatter"' in verified_xml(sched, target="legacy")


def test_forwarded_chunks_use_fused_steps(dgx1_schedules):
    assert 'type="rcs"' in verified_xml(dgx1_schedules["allgather"])
    assert 'type="rrs"' in verified_xml(dgx1_schedules["reducescatter"])


def test_unfused_lowering_has_separate_send_and_receive_threadblocks(dgx1_schedules):
    program = lower_to_msccl(dgx1_schedules["allgather"], fuse=False)
    for gpu in program.gpus:
        assert all(tb.send < 0 or tb.recv < 0 for tb in gpu.tbs)
        assert {st.type for tb in gpu.tbs for st in tb.steps} <= {"s", "r", "cpy"}


def with_long_tb(program, steps: int):
    """``program`` with tb 1 of gpu 0 made ``steps`` copies of its first step long."""
    import dataclasses
    gpu = program.gpus[0]
    tb = gpu.tbs[1]
    long_tb = dataclasses.replace(tb, steps=tuple(dataclasses.replace(tb.steps[0], s=i) for i in range(steps)))
    return dataclasses.replace(program, gpus=(dataclasses.replace(gpu, tbs=(gpu.tbs[0], long_tb) + gpu.tbs[2:]),)
                               + program.gpus[1:])


def test_a_program_over_the_step_limit_is_refused(dgx1_schedules):
    program = lower_to_msccl(dgx1_schedules["allgather"])
    big = with_long_tb(program, 300)
    executor = [str(f) for f in for_target(runtime_limits(big), "executor")]
    assert any("300 steps; both runtimes allow at most 256" in p for p in executor)
    assert any("at most 256" in str(f) for f in for_target(runtime_limits(big), "legacy"))
    assert render_msccl_xml(program).count("<tb ") == sum(len(g.tbs) for g in program.gpus)


def test_refusal_raises_backend_error(monkeypatch, dgx1, dgx1_schedules):
    """A program the runtime cannot hold is refused with the rule named, and nothing is returned."""
    import backends.msccl.fit as fit
    big = with_long_tb(lower_to_msccl(dgx1_schedules["allgather"]), 99)
    monkeypatch.setattr(fit, "lower_to_msccl", lambda *args, **kwargs: big)
    with pytest.raises(BackendError, match="breaks a runtime rule: .*99 steps; the executor's default build allows"):
        emit_verified_xml(dgx1_schedules["allgather"], dgx1)
