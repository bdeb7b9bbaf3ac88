"""Each runtime's loader and selection rules (DESIGN section 7), one minimal file per rule, judged for both
targets exactly as ``synth check`` judges (:func:`backends.msccl.verdict.check_text`)."""

from dataclasses import replace

import pytest

from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
from backends.msccl.lint import lint_program
from backends.msccl.verdict import check_text

STEP = ('      <step s="{s}" type="{type}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" cnt="1" depid="-1" '
        'deps="-1" hasdep="0"/>\n')


def pair_allgather(algo: str = 'minBytes="0" maxBytes="1073741824"', i_chunks: int = 1, coll: str = "allgather",
                   s_of_last: int = 1, extra: str = "") -> str:
    """A valid in-place 2-rank Allgather (gpu r sends o[r] and receives o[1-r]) with the given <algo> range."""
    gpus = []
    for r in range(2):
        steps = (STEP.format(s=0, type="s", sb="o", so=r, db="o", do=r)
                 + STEP.format(s=s_of_last if r else 1, type="r", sb="o", so=1 - r, db="o", do=1 - r))
        gpus.append(f'  <gpu id="{r}" i_chunks="{i_chunks}" o_chunks="2" s_chunks="0">\n'
                    f'    <tb id="0" send="{1 - r}" recv="{1 - r}" chan="0">\n{steps}    </tb>\n  </gpu>\n')
    return (f'<algo {extra}name="pair" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="{coll}" '
            f'inplace="1" outofplace="0" {algo}>\n' + "".join(gpus) + "</algo>\n")


def copy_then_exchange(s_of_copy: int = 0) -> MscclProgram:
    """Out-of-place 2-rank Allgather: tb 0 copies i[0] to o[r] and publishes; tb 1 waits for it, sends o[r] and
    receives the peer's chunk."""
    gpus = []
    for r in range(2):
        copy = Threadblock(0, -1, -1, 0, (Step(s_of_copy, "cpy", "i", 0, "o", r, 1, hasdep=1),))
        swap = Threadblock(1, 1 - r, 1 - r, 0, (Step(0, "s", "o", r, "o", r, 1, 0, 0),
                                                Step(1, "r", "o", 1 - r, "o", 1 - r, 1)))
        gpus.append(Gpu(r, 1, 2, 0, (copy, swap)))
    return MscclProgram("dep", "Simple", 1, 2, 2, "allgather", 0, 1, 0, 1 << 30, tuple(gpus))


def verdict(text: str, target: str):
    report = check_text(text, "rule.xml", target)
    return report.valid, [str(f) for f in report.errors()], [str(f) for r in report.algos for f in r.findings
                                                              if f.severity == "warning"] + \
        [str(f) for f in report.file_findings if f.severity == "warning"]


def test_the_minimal_file_is_valid_for_both():
    for target in ("executor", "legacy"):
        assert verdict(pair_allgather(), target) == (True, [], [])


def test_max_bytes_zero_is_unbounded_for_the_executor_only():
    # executor/RCCL: maxBytes == 0 means no upper limit; legacy: minBytes <= nBytes < maxBytes selects nothing
    text = pair_allgather('minBytes="0" maxBytes="0"')
    assert verdict(text, "executor")[0]
    valid, errors, _ = verdict(text, "legacy")
    assert not valid and "minBytes=0..maxBytes=0 is empty for the legacy runtime" in errors[0]


def test_max_bytes_zero_with_a_minimum_is_refused_by_the_legacy_loader():
    text = pair_allgather('minBytes="1024" maxBytes="0"')
    assert verdict(text, "executor")[0]
    valid, errors, _ = verdict(text, "legacy")
    assert not valid and "legacy loader refuses minBytes > maxBytes" in errors[0]
    assert "only to the executor" in errors[0]


def test_min_above_max_is_refused_by_both():
    text = pair_allgather('minBytes="2048" maxBytes="1024"')
    for target in ("executor", "legacy"):
        valid, errors, _ = verdict(text, target)
        assert not valid and len(errors) == 1


def test_legacy_checks_declared_chunks_against_nchunksperloop():
    text = pair_allgather(i_chunks=2)        # allgather with L=2 on 2 ranks: i_chunks must be 1 (or 0)
    assert verdict(text, "executor")[0]
    valid, errors, _ = verdict(text, "legacy")
    assert not valid and "i_chunks=2, but the legacy loader requires 1 for allgather with nchunksperloop=2" in errors[0]


def test_gather_is_unknown_to_the_legacy_runtime():
    gather = ('<algo name="g" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" coll="gather" inplace="1" '
              'outofplace="0" minBytes="0" maxBytes="0">\n'
              '  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">\n    <tb id="0" send="-1" recv="1" chan="0">\n'
              + STEP.format(s=0, type="r", sb="i", so=0, db="o", do=1) +
              '    </tb>\n  </gpu>\n  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">\n'
              '    <tb id="0" send="0" recv="-1" chan="0">\n'
              + STEP.format(s=0, type="s", sb="i", so=0, db="o", do=1) + '    </tb>\n  </gpu>\n</algo>\n')
    assert verdict(gather, "executor")[0]
    valid, errors, _ = verdict(gather, "legacy")
    assert not valid and "the legacy runtime knows no gather and refuses the file" in errors[0]


def test_a_17th_attribute_fails_the_executor_and_is_dropped_by_legacy():
    extra = " ".join(f'x{k}="1"' for k in range(7)) + " "
    late = pair_allgather(extra=" ", algo='minBytes="0" maxBytes="1073741824" ' + extra)   # extras at the end
    valid, errors, _ = verdict(late, "executor")
    assert not valid and "17 attributes; the executor reads at most 16" in errors[0]
    valid, _, warnings = verdict(late, "legacy")
    assert valid and any("the legacy lexer drops x6" in w for w in warnings)
    early = pair_allgather(extra=" ".join(f'x{k}="1"' for k in range(10)) + " ")   # 20: legacy loses the last 4
    valid, errors, _ = verdict(early, "legacy")
    assert not valid and "drops those after the 16th, among them inplace, which it needs" in errors[0]


def test_s_out_of_order_is_accepted_unless_a_dependency_names_the_tb():
    text = pair_allgather(s_of_last=7)
    for target in ("executor", "legacy"):
        valid, _, warnings = verdict(text, target)
        assert valid and any("s=7 but the step is at position 1; the runtimes ignore it" in w for w in warnings)
        # tb 0 of gpu 0 publishes a flag tb 1 waits for: its steps are named by position
        assert lint_program(copy_then_exchange(), target) == []
        named = [f for f in lint_program(copy_then_exchange(s_of_copy=3), target) if f.severity == "error"]
        assert [f.kind for f in named] == ["step-index"] * 2 and "dependencies name steps of this tb" in named[0].message


def test_legacy_serves_in_place_calls_only_from_an_in_place_file():
    both = replace(copy_then_exchange(), inplace=1, outofplace=1)
    assert [f for f in lint_program(both, "executor") if f.kind == "selection"] == []
    [warning] = [f for f in lint_program(both, "legacy") if f.kind == "selection"]
    assert warning.severity == "warning" and "in-place calls only" in warning.message


def test_a_legacy_format_file_stops_the_executor_loading_the_directory():
    text = pair_allgather(algo="")
    assert verdict(text, "legacy")[0]
    valid, errors, _ = verdict(text, "executor")
    assert not valid and "every file after it (in path order) is lost too" in errors[0]


# --- judge, don't refuse ------------------------------------------------------------------------------------

def ring_allreduce_one_chunk(coll: str = "allreduce", first: str = "s") -> str:
    """In-place Allreduce of ONE chunk on 4 ranks (nchunksperloop < ngpus): reduce along 0->1->2->3, then the
    sum travels 3->0->1->2. ``first="r"`` makes rank 0 start with a receive: a deadlock."""
    ring = {0: [("s", "i", "i"), ("rcs", "i", "i")], 1: [("rrs", "i", "i"), ("rcs", "i", "i")],
            2: [("rrs", "i", "i"), ("r", "i", "i")], 3: [("rrcs", "i", "i")]}
    if first == "r":
        ring[0] = [("rcs", "i", "i"), ("s", "i", "i")]
    gpus = []
    for r, steps in ring.items():
        body = "".join(STEP.format(s=k, type=t, sb=sb, so=0, db=db, do=0) for k, (t, sb, db) in enumerate(steps))
        gpus.append(f'  <gpu id="{r}" i_chunks="1" o_chunks="1" s_chunks="0">\n'
                    f'    <tb id="0" send="{(r + 1) % 4}" recv="{(r - 1) % 4}" chan="0">\n{body}    </tb>\n  </gpu>\n')
    return (f'<algo name="ar1" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="4" coll="{coll}" inplace="1" '
            'outofplace="0" minBytes="0" maxBytes="1073741824">\n' + "".join(gpus) + "</algo>\n")


@pytest.mark.parametrize("target", ["executor", "legacy"])
def test_allreduce_with_fewer_chunks_than_ranks_is_judged(target):
    assert verdict(ring_allreduce_one_chunk(), target) == (True, [], [])
    wrong = ring_allreduce_one_chunk().replace('type="rrcs"', 'type="rcs"')   # rank 3 forgets its own piece
    valid, errors, _ = verdict(wrong, target)
    assert not valid and "allreduce output o[0] of rank 0" in errors[0] and "missing: rank 3's i[0]" in errors[0]


@pytest.mark.parametrize("target", ["executor", "legacy"])
def test_custom_is_judged_without_a_postcondition(target):
    custom = ring_allreduce_one_chunk("custom").replace('type="rrcs"', 'type="rcs"')
    assert verdict(custom, target) == (True, [], [])
    valid, errors, _ = verdict(ring_allreduce_one_chunk("custom", first="r"), target)
    assert not valid and "deadlock" in errors[0]
    valid, errors, _ = verdict(custom.replace('type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0"',
                                              'type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="3"'), target)
    assert not valid and any("step-buffer" in e or "out-of-range" in e for e in errors)


def test_a_rank_whose_load_holds_more_than_4095_xml_elements_is_refused_by_both():
    """Both loaders read a rank's file into a table of 4096 elements (the <algo>, every <gpu>, the rank's own tbs
    and steps) and fail once it is full: 4095 fit, one more does not."""
    def program(steps_on_rank_0: int) -> MscclProgram:
        tbs = tuple(Threadblock(k, -1, -1, 0, tuple(Step(s, "nop", "i", 0, "i", 0, 1) for s in range(n)))
                    for k, n in enumerate((64,) * (steps_on_rank_0 // 64) + (steps_on_rank_0 % 64,)))
        return MscclProgram("big", "Simple", 1, 2, 2, "allgather", 0, 1, 0, 0,
                            (Gpu(0, 1, 2, 0, tbs), Gpu(1, 1, 2, 0, ())))
    fits = 4095 - 3 - 63     # the algo, 2 gpus, then 63 tbs of 64 steps (the last one short) hold the rest
    assert fits == 4029 and len(program(fits).gpus[0].tbs) == 63
    for target in ("executor", "legacy"):
        assert not [f for f in lint_program(program(fits), target) if f.kind == "xml-elements"]
        (finding,) = [f for f in lint_program(program(fits + 1), target) if f.kind == "xml-elements"]
        assert finding.severity == "error" and finding.gpu == 0
        assert "rank 0 loads 4096 XML elements" in finding.message and "at most 4095" in finding.message


def test_more_than_1024_gpus_overflow_both_loaders():
    def program(ngpus: int) -> MscclProgram:
        return MscclProgram("wide", "Simple", 1, ngpus, ngpus, "allgather", 0, 1, 0, 0,
                            tuple(Gpu(r, 1, ngpus, 0, ()) for r in range(ngpus)))
    assert not [f for f in lint_program(program(1024), "executor") if f.kind == "xml-elements"]
    (finding,) = [f for f in lint_program(program(1025), "both") if f.kind == "xml-elements"]
    assert finding.severity == "error" and "ngpus=1025" in finding.message and "at most 1024" in finding.message
