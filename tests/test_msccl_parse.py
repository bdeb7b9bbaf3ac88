"""MSCCL XML parser: real files from other tools, tolerated oddities, malformed input, fuzzing (DESIGN 7, 11)."""

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.msccl import parse
from backends.msccl.limits import MAX_XML_CHILDREN, MAX_XML_ELEMENTS
from backends.msccl.parse import (MAX_GPUS, ParseBounds, XmlError, load_msccl_document, load_msccl_xml,
                                  parse_msccl_document, parse_msccl_xml)
from synth.errors import InputError
from backends.msccl.lint import lint_program, lint_text
from support.shared import needs_shared, shared_msccl_xml


# file -> (ngpus, coll, inplace, nchannels, threadblocks, steps), counted independently with grep.
SHARED_FILES = {
    "allgather_ring_8gpu_1ch_1inst.xml": (8, "allgather", 1, 1, 8, 64),
    "allreduce_a100_allpairs_8gpu_1inst.xml": (8, "allreduce", 1, 1, 64, 1336),
    "allreduce_a100_pcie_hierarchical_8gpu_1inst.xml": (8, "allreduce", 1, 1, 128, 1084),
    "alltoall_allpairs_8gpu_1inst.xml": (8, "alltoall", 0, 1, 112, 120),
    "dgx1_allgather_s2_r3_c2.xml": (8, "allgather", 0, 2, 102, 222),
    "dgx1_reducescatter_s2_r3_c2.xml": (8, "reduce_scatter", 0, 2, 78, 234),
    "hierarchical_allreduce_4gpu_2node_1inst.xml": (8, "allreduce", 1, 12, 112, 144),
    "simple_allgather_ring_4gpu.xml": (4, "allgather", 0, 4, 20, 20),
    "simple_allreduce_ring_8gpu_1inst.xml": (8, "allreduce", 1, 1, 8, 120),
}

STEP = ('<step s="{s}" type="{type}" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" '
        'hasdep="0"/>')
ALGO = ('<algo name="tiny" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
        'inplace="0"{extra}>')


def tiny_xml(extra: str = "", step_type: str = "s", inner: str = "") -> str:
    """A two-rank allgather, one step per rank, elements on known lines (algo 1, gpu 2/7, tb 3/8, step 4/9)."""
    lines = [ALGO.format(extra=extra)]
    for rank in (0, 1):
        peer = 1 - rank
        lines += [f'  <gpu id="{rank}" i_chunks="1" o_chunks="2" s_chunks="0">',
                  f'    <tb id="0" send="{peer}" recv="-1" chan="0">',
                  "      " + STEP.format(s=0, type=step_type),
                  "    </tb>" + inner,
                  "  </gpu>"]
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def shared_text(name: str) -> str:
    return shared_msccl_xml(name).read_text()


# --- real files -------------------------------------------------------------------------------------------

@needs_shared
@pytest.mark.parametrize("name", sorted(SHARED_FILES))
def test_shared_file_parses_with_expected_shape(name):
    ngpus, coll, inplace, nchannels, tbs, steps = SHARED_FILES[name]
    programs = load_msccl_xml(shared_msccl_xml(name))
    assert len(programs) == 1
    p = programs[0]
    assert (p.ngpus, p.coll, p.inplace, p.nchannels) == (ngpus, coll, inplace, nchannels)
    assert sum(len(g.tbs) for g in p.gpus) == tbs
    assert sum(len(tb.steps) for g in p.gpus for tb in g.tbs) == steps
    assert sorted(g.id for g in p.gpus) == list(range(ngpus))
    assert (p.min_bytes, p.max_bytes, p.outofplace) == (None, None, None)  # legacy format
    assert p.collective == ("reducescatter" if coll == "reduce_scatter" else coll)


@needs_shared
@pytest.mark.parametrize("name", sorted(SHARED_FILES))
def test_line_numbers_point_at_the_elements(name):
    text = shared_text(name)
    lines = text.split("\n")
    p = parse_msccl_xml(text, name)[0]
    assert lines[p.line - 1].lstrip().startswith("<algo")
    for gpu in p.gpus:
        assert lines[gpu.line - 1].lstrip().startswith(f'<gpu id="{gpu.id}"')
        for tb in gpu.tbs:
            assert lines[tb.line - 1].lstrip().startswith(f'<tb id="{tb.id}"')
            for step in tb.steps:
                assert lines[step.line - 1].lstrip().startswith(f'<step s="{step.s}" type="{step.type}"')


@needs_shared
def test_several_algo_documents_and_trailing_text_in_one_file():
    first, second = shared_text("simple_allgather_ring_4gpu.xml"), shared_text("dgx1_reducescatter_s2_r3_c2.xml")
    text = first + "\n" + second + "\ntrailing words written by some tool\n"
    programs = parse_msccl_xml(text, "two.xml")
    assert [p.name for p in programs] == ["allgather_ring", "ReduceScatter(n=8)-DGX1-steps=2,rounds=3,chunks=2"]
    assert programs[1].line == first.count("\n") + 2
    assert programs[1].gpus[0].line == programs[1].line + 1


def test_executor_format_attributes_are_read():
    text = tiny_xml(extra=' outofplace="1" minBytes="0" maxBytes="9223372036854775807"')
    p = parse_msccl_xml(text, "exec.xml")[0]
    assert (p.outofplace, p.min_bytes, p.max_bytes) == (1, 0, (1 << 63) - 1)
    assert p.gpus[1].tbs[0].steps[0].line == 9


@pytest.mark.parametrize("spelling", ["reducescatter", "reduce_scatter"])
def test_both_reduce_scatter_spellings_parse(spelling):
    p = parse_msccl_xml(tiny_xml().replace('coll="allgather"', f'coll="{spelling}"'), "rs.xml")[0]
    assert p.coll == spelling and p.collective == "reducescatter"


def test_unknown_elements_are_skipped_with_a_note():
    text = tiny_xml(inner='\n    <copy src="0" dst="1"><detail/></copy>').replace("</algo>", "</algo>\n<copy/>")
    document = parse_msccl_document(text, "copy.xml")
    assert [len(g.tbs) for g in document.programs[0].gpus] == [1, 1]
    (note,) = document.notes
    assert note.kind == "unknown-element" and note.severity == "warning" and note.line == 6
    assert "<copy>" in note.message and "3 times" in note.message


def test_unknown_attributes_are_noted_not_fatal():
    document = parse_msccl_document(tiny_xml(extra=' color="blue"'), "attr.xml")
    assert [n.kind for n in document.notes] == ["unknown-attribute"]
    assert "color" in document.notes[0].message


def test_xml_prolog_is_tolerated_and_lines_are_kept():
    text = '<?xml version="1.0" encoding="utf-8"?>\n' + tiny_xml()
    p = parse_msccl_xml(text, "prolog.xml")[0]
    assert p.line == 2 and p.gpus[0].tbs[0].steps[0].line == 5
    assert [f.kind for f in lint_text(text)] == ["lexical"]


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_other_line_ends_keep_line_numbers(newline):
    text = tiny_xml().replace("\n", newline)
    assert parse_msccl_xml(text, "crlf.xml")[0].gpus[1].tbs[0].steps[0].line == 9
    with pytest.raises(InputError, match="^crlf.xml:4: <step> type='zz'"):
        parse_msccl_xml(tiny_xml(step_type="zz").replace("\n", newline), "crlf.xml")


def test_comments_and_whitespace_are_fine():
    text = "<!-- written by hand -->\n\n" + tiny_xml().replace("<tb ", "<!-- c --><tb ", 1)
    assert parse_msccl_xml(text, "c.xml")[0].line == 3


# --- malformed input: one InputError naming file and line -------------------------------------------------

MALFORMED = [
    # (description, text, line, problem fragment)
    ("empty", "", 1, "no <algo> element"),
    ("plain text", "hello world", 1, "no <algo> element"),
    ("truncated", tiny_xml()[:-25], 10, "file ends inside <tb> opened at line 8 (truncated file?)"),
    ("truncated mid tag", tiny_xml()[:60], 1, "truncated"),
    ("step outside tb", tiny_xml().replace('    <tb id="0" send="0" recv="-1" chan="0">\n', "")
     .replace("    </tb>\n  </gpu>\n</algo>", "  </gpu>\n</algo>"), 8, "<step> must be inside <tb>, not inside <gpu>"),
    ("gpu at top level", '<gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0"/>', 1, "<gpu> must be inside <algo>"),
    ("algo inside algo", tiny_xml().replace("</algo>", ALGO.format(extra="") + "</algo></algo>"), 12,
     "<algo> must be at top level, not inside <algo> (line 1)"),
    ("known element in unknown one", tiny_xml(inner='\n<wrap><tb id="1" send="-1" recv="-1" chan="0"/></wrap>'),
     6, "<tb> is inside <wrap> (line 6), which is not MSCCL"),
    ("missing cnt", tiny_xml().replace(' cnt="1"', "", 1), 4, "<step> lacks required attribute cnt"),
    ("missing proto", tiny_xml().replace(' proto="Simple"', ""), 1, "<algo> lacks required attribute proto"),
    ("missing gpu attrs", tiny_xml().replace(' i_chunks="1" o_chunks="2"', "", 1), 2,
     "<gpu> lacks required attributes i_chunks, o_chunks"),
    ("fraction", tiny_xml().replace('cnt="1"', 'cnt="1.5"', 1), 4, "attribute cnt='1.5' is not an integer"),
    ("underscore int", tiny_xml().replace('srcoff="0"', 'srcoff="1_0"', 1), 4, "is not an integer"),
    ("unicode digit", tiny_xml().replace('dstoff="0"', 'dstoff="\u0663"', 1), 4, "is not an integer"),
    ("empty int", tiny_xml().replace('chan="0"', 'chan=""', 1), 3, "attribute chan='' is not an integer"),
    ("huge int", tiny_xml().replace('depid="-1"', 'depid="99999999999999999999999"', 1), 4, "is not an integer"),
    ("int out of range", tiny_xml().replace('deps="-1"', 'deps="4294967296"', 1), 4, "out of range"),
    ("unknown step type", tiny_xml(step_type="send"), 4, "<step> type='send' is unknown"),
    ("unknown buffer", tiny_xml().replace('srcbuf="i"', 'srcbuf="x"', 1), 4, "<step> srcbuf='x' is unknown"),
    ("unknown proto", tiny_xml().replace('"Simple"', '"LL256"'), 1, "<algo> proto='LL256' is unknown"),
    ("unknown coll", tiny_xml().replace('"allgather"', '"allgathr"'), 1, "<algo> coll='allgathr' is unknown"),
    ("too many ranks", tiny_xml().replace('ngpus="2"', f'ngpus="{MAX_GPUS + 1}"'), 1, "out of range 1..4096"),
    ("zero chunks per loop", tiny_xml().replace('nchunksperloop="2"', 'nchunksperloop="0"'), 1, "out of range"),
    ("more gpus than ngpus", tiny_xml().replace('ngpus="2"', 'ngpus="1"'), 7, "more <gpu> elements than ngpus=1"),
    ("negative chunks", tiny_xml().replace('s_chunks="0"', 's_chunks="-1"', 1), 2, "out of range"),
    ("mismatched tag", tiny_xml().replace("</tb>", "</gpu>", 1), 5, "malformed XML: mismatched tag"),
    ("undefined entity", tiny_xml().replace('name="tiny"', 'name="&lol;"'), 1, "undefined entity"),
    ("doctype", '<!DOCTYPE algo [<!ENTITY a "aaaa">]>\n' + tiny_xml(), 1, "DTDs and entity declarations"),
    ("entity later", tiny_xml() + '<!ENTITY a SYSTEM "file:///etc/passwd">', 13, "DTDs and entity declarations"),
    ("nul byte", tiny_xml().replace("tiny", "ti\x00ny"), 1, "malformed XML"),
    ("lone surrogate", tiny_xml().replace("tiny", "ti\ud800ny"), 1, "lone surrogate"),
    ("duplicate attribute", tiny_xml().replace('cnt="1"', 'cnt="1" cnt="2"', 1), 4, "duplicate attribute"),
]


@pytest.mark.parametrize("description,text,line,problem", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_names_file_and_line(description, text, line, problem):
    with pytest.raises(InputError) as info:
        parse_msccl_xml(text, "bad.xml")
    message = str(info.value)
    assert message.startswith(f"bad.xml:{line}: "), message
    assert problem in message, message
    assert "\n" not in message


def test_error_message_format_is_exact():
    with pytest.raises(XmlError) as info:
        parse_msccl_xml(tiny_xml(step_type="send"), "dir/a.xml")
    exc = info.value
    assert str(exc) == "dir/a.xml:4: <step> type='send' is unknown; use one of s, r, rcs, rrs, rrc, rrcs, cpy, re, nop"
    assert (exc.file, exc.line) == ("dir/a.xml", 4)
    assert isinstance(exc, InputError)


def test_billion_laughs_is_refused_quickly():
    laughs = '<!DOCTYPE lolz [<!ENTITY lol "lol">' + "".join(
        f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10 if i else "&lol;" * 10}">' for i in range(10)) + "]>"
    start = time.process_time()   # CPU: independent of machine load
    with pytest.raises(InputError, match="DTDs"):
        parse_msccl_xml(laughs + '\n<algo name="&lol9;"/>', "lol.xml")
    assert time.process_time() - start < 1.0


def test_long_attribute_value_is_shortened_in_the_message():
    with pytest.raises(InputError) as info:
        parse_msccl_xml(tiny_xml().replace('"Simple"', '"' + "X" * 10_000 + '"'), "long.xml")
    assert len(str(info.value)) < 200


def test_load_reports_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_msccl_xml(tmp_path / "missing.xml")
    bad = tmp_path / "latin1.xml"
    bad.write_bytes(tiny_xml().encode() + b"\n<!-- caf\xe9 -->\n")
    with pytest.raises(InputError, match=r"latin1.xml:14: the file is not UTF-8 text"):
        load_msccl_xml(bad)
    good = tmp_path / "good.xml"
    good.write_text(tiny_xml())
    assert load_msccl_document(good).source == str(good)


# --- allocation bounds: every file a runtime loads parses; more is refused before it is built -----------------

def test_the_bounds_hold_every_file_a_runtime_can_load():
    # a rank's load holds the algo, every gpu and its own tbs and steps; an algo at most 1024 gpus
    most_steps = max(n * (MAX_XML_ELEMENTS - 1 - n) for n in range(1, MAX_XML_CHILDREN + 1))
    assert parse.MAX_STEPS == most_steps == 3_143_680
    longest_line = len(STEP.format(s=255, type="rrcs").replace('"0"', '"32767"').replace('"-1"', '"127"')) + 8
    assert parse.MAX_TEXT_CHARS >= most_steps * longest_line


def test_steps_beyond_the_bound_are_refused_with_the_line():
    text = tiny_xml()
    assert len(parse_msccl_xml(text, "two.xml", ParseBounds(steps=2))[0].gpus) == 2
    with pytest.raises(XmlError) as info:
        parse_msccl_xml(text, "two.xml", ParseBounds(steps=1))
    assert str(info.value) == "two.xml:9: more than 1 steps in one file"


def test_text_beyond_the_bound_is_refused_before_reading(tmp_path):
    text = tiny_xml()
    path = tmp_path / "a.xml"
    path.write_text(text)
    assert load_msccl_xml(path, ParseBounds(text_chars=len(text)))
    with pytest.raises(XmlError, match=f"a.xml:1: file is {len(text)} bytes; at most {len(text) - 1} are accepted"):
        load_msccl_xml(path, ParseBounds(text_chars=len(text) - 1))
    with pytest.raises(XmlError, match=f"input is {len(text)} characters; at most 10 are accepted"):
        parse_msccl_document(text, "a.xml", ParseBounds(text_chars=10))


@pytest.mark.parametrize("text", [tiny_xml(), tiny_xml().replace('type="s"', 'type="zz"').replace('type="zz"', 'type="s"', 1),
                                  tiny_xml().replace("</gpu>", "</gpu>\ud800", 1), tiny_xml().replace("</algo>", ""),
                                  tiny_xml().replace('<tb id="0"', '<tb id="0" <', 1)])
def test_text_fed_in_pieces_parses_as_a_whole(monkeypatch, text):
    def outcome():
        try:
            return parse_msccl_xml(text, "a.xml")
        except XmlError as exc:
            return str(exc)
    whole = outcome()
    monkeypatch.setattr(parse, "_FEED_CHARS", 7)     # pieces split elements, attributes and lines
    assert outcome() == whole


# --- fuzzing: any input ends in a result or an InputError -------------------------------------------------

TOKENS = ["<", ">", "/>", '"', "=", "-1", "0", "7", "99999", "2147483648", "x", "\n", "\t", " ", "&amp;", "&x;",
          "<!--", "-->", "<![CDATA[", "]]>", "<step/>", "</tb>", "</gpu>", "<algo>", "</algo>", '<tb id="9"/>',
          '<gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">', "<?xml version='1.0'?>", "<!DOCTYPE a>", "\x00",
          "\ud800", "\u00e9", 'type="nop"', 'type="zz"', 'coll="reducescatter"']


def _outcome(text: str) -> None:
    """Parse, and lint whatever parses: neither may raise anything but InputError."""
    try:
        programs = parse_msccl_xml(text, "fuzz.xml")
    except InputError as exc:
        assert re.match(r"fuzz\.xml:\d+: \S", str(exc)), str(exc)
        return
    for program in programs:
        for target in ("executor", "legacy", "both"):
            lint_program(program, target)
    lint_text(text)


mutation = st.tuples(st.sampled_from(["delete", "insert", "replace"]), st.floats(0, 1), st.integers(0, 40),
                     st.sampled_from(TOKENS))


def _mutate(base: str, edits) -> str:
    text = base
    for op, where, span, token in edits:
        pos = int(where * len(text))
        if op == "delete":
            text = text[:pos] + text[pos + span:]
        elif op == "insert":
            text = text[:pos] + token + text[pos:]
        else:
            text = text[:pos] + token + text[pos + max(1, span // 8):]
    return text


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text(text):
    _outcome(text)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
def test_fuzz_token_soup(tokens):
    _outcome("".join(tokens))


@FUZZ
@given(st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_mutated_algorithm(edits):
    _outcome(_mutate(tiny_xml(), edits))


@needs_shared
@FUZZ
@given(st.lists(mutation, min_size=1, max_size=3))
def test_fuzz_mutated_shared_file(edits):
    _outcome(_mutate(shared_text("simple_allgather_ring_4gpu.xml"), edits))
