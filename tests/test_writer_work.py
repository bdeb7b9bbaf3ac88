"""Work the verified writer does once, not again (issue 11: ``synth solve`` in seconds): the parser's shortcut for
steps spelled like ones already accepted, the fit search's memory of its misses, the command's frozen set-up."""

import gc
from dataclasses import replace

import pytest
from click.testing import CliRunner

from backends.msccl import lowering
from backends.msccl.fit import fit_lowering
from backends.msccl.ir import Step
from backends.msccl.lowering import PlannedOps
from backends.msccl.parse import XmlError, parse_msccl_xml
from synth.cli import main
from synth.model.collectives import make_collective
from synth.model.topology import load_topology
from synth.schedule.ir import Schedule, Transfer

STEP = ('<step s="{s}" type="s" srcbuf="i" srcoff="{srcoff}" dstbuf="o" dstoff="{dstoff}" cnt="{cnt}" depid="-1" '
        'deps="-1" hasdep="0"/>')


def one_tb(steps: list[str]) -> str:
    """A one-GPU file whose only threadblock holds ``steps`` (one per line from line 4)."""
    lines = ['<algo name="t" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" coll="allgather" inplace="0">',
             '  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">', '    <tb id="0" send="1" recv="-1" chan="0">']
    lines += ["      " + s for s in steps] + ["    </tb>", "  </gpu>", "</algo>"]
    return "\n".join(lines) + "\n"


def test_steps_spelled_like_accepted_ones_parse_to_the_same_values():
    steps = [STEP.format(s=0, srcoff="007", dstoff="-0", cnt="1"),
             STEP.format(s=1, srcoff="007", dstoff="-0", cnt="1"),     # every spelling seen: the shortcut
             STEP.format(s=2, srcoff="7", dstoff="0", cnt="01")]
    parsed = parse_msccl_xml(one_tb(steps), "f.xml")[0].gpus[0].tbs[0].steps
    assert parsed == (Step(0, "s", "i", 7, "o", 0, 1, -1, -1, 0, 4), Step(1, "s", "i", 7, "o", 0, 1, -1, -1, 0, 5),
                      Step(2, "s", "i", 7, "o", 0, 1, -1, -1, 0, 6))


def test_a_spelling_accepted_as_an_offset_is_still_checked_as_a_count():
    # 2,000,000 is a valid offset (int32) but more chunks than a step may move: the shortcut must not take it
    steps = [STEP.format(s=0, srcoff="2000000", dstoff="0", cnt="1"),
             STEP.format(s=1, srcoff="0", dstoff="0", cnt="2000000")]
    with pytest.raises(XmlError) as caught:
        parse_msccl_xml(one_tb(steps), "f.xml")
    assert str(caught.value) == "f.xml:5: <step> attribute cnt=2000000 is out of range -2147483648..1048576"


def test_a_search_for_merged_steps_does_not_lower_the_misses_of_the_search_before(monkeypatch):
    # a Broadcast pipelined in 200 pieces down 0 -> 1 -> 2 -> 3 on GPUs of 2 SMs: fused and unmerged it needs more
    # threadblocks than SMs (a miss the lowering stops early, and keeps no program of)
    chain = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(200) for r in range(3))
    schedule = Schedule(make_collective("broadcast", 4, 200, 0), "ring-4", chain, 202)
    small = replace(load_topology("ring-4"), sms_per_gpu=2)
    fresh = fit_lowering(schedule, small, fuse=True)
    lowered = []
    real = lowering._lower
    monkeypatch.setattr(lowering, "_lower", lambda *args, **kwargs: lowered.append(args[9:11]) or real(*args,
                                                                                                      **kwargs))
    planned = PlannedOps(schedule)
    unmerged = fit_lowering(schedule, small, fuse=True, most_cnt=1, planned=planned)
    first = list(lowered)
    merged = fit_lowering(schedule, small, fuse=True, planned=planned)
    assert not unmerged.fits and first and all(group == 1 for _, group in first)
    assert not set(lowered[len(first):]) & set(first)       # (channels, cnt) pairs not lowered twice
    assert (merged.lowering, merged.tbs_per_gpu, merged.steps_per_tb) == (fresh.lowering, fresh.tbs_per_gpu,
                                                                          fresh.steps_per_tb)


def test_solve_leaves_nothing_frozen_for_the_collector(tmp_path):
    result = CliRunner().invoke(main, ["solve", "allgather", "--topology", "ring-4", "--size", "1MB",
                                       "-o", str(tmp_path / "ag.xml")])
    assert result.exit_code == 0, result.output
    assert gc.get_freeze_count() == 0
