"""Parse MSCCL XML algorithm files (legacy and executor format) into :class:`~backends.msccl.ir.MscclProgram`.

The input is untrusted (DESIGN section 11): files come from other tools and from strangers. So the parser

- goes through defusedxml's expat reader with DTDs, entity declarations and external references refused;
- bounds what a file may make us allocate (ranks, threadblocks, steps, chunks) *before* allocating it;
- never evaluates anything: integers are matched against ``-?[0-9]+`` before ``int()``;
- ends every input in either a result or an :class:`XmlError` (an :class:`~synth.errors.InputError`) whose
  message reads ``<file>:<line>: <problem>``.

It is tolerant of what real files contain: several ``<algo>`` documents in one file, elements it does not know
(skipped with a warning note), trailing text after ``</algo>``, a leading ``<?xml ...?>`` prolog (the runtimes
refuse it; :func:`backends.msccl.lint.lint_text` says so). It is strict about structure: wrong nesting, missing or
non-integer attributes, unknown step types, buffers, protocols or collectives are errors.

The legacy format (MSCCL on NCCL 2.12) lacks ``minBytes``/``maxBytes``/``outofplace``; they parse as None.
Runtime limits (64 steps per threadblock, 32 channels, ...) are *not* enforced here: that is the linter's job,
so one file can be checked against either runtime.

>>> text = '''<algo name="copy" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="1" coll="allreduce"
... inplace="1"><gpu id="0" i_chunks="1" o_chunks="0" s_chunks="0"><tb id="0" send="-1" recv="-1" chan="0">
... <step s="0" type="nop" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
... </tb></gpu></algo>'''
>>> [(p.ngpus, p.coll, p.outofplace) for p in parse_msccl_xml(text, "copy.xml")]
[(1, 'allreduce', None)]
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from xml.sax import SAXParseException
from xml.sax.handler import ContentHandler

from defusedxml import DefusedXmlException
from defusedxml.expatreader import DefusedExpatParser

from synth.errors import InputError
from backends.msccl.findings import Finding

from backends.msccl.ir import BUFFERS, PROTOCOLS, STEP_TYPES, Gpu, MscclProgram, Step, Threadblock
from backends.msccl.limits import MAX_XML_CHILDREN, MAX_XML_ELEMENTS

# Allocation bounds (DESIGN section 11). A file beyond them is refused before we build anything proportional to it.
# Steps and text are bounded by what the runtimes can load at all, so that every file either runtime loads (ours
# at 1024 GPUs included) parses and gets the linter's verdict: a rank's load holds at most MAX_XML_ELEMENTS
# elements, the <algo> and every <gpu> among them, and an <algo> at most MAX_XML_CHILDREN GPUs
# (backends.msccl.limits), so a loadable file holds at most 1024 x (4095 - 1 - 1024) steps.
MAX_ALGOS = 1024                  # <algo> documents per file
MAX_GPUS = 4096                   # ngpus per algo
MAX_PARSED_CHANNELS = 4096        # nchannels per algo (the runtimes allow 32; the linter reports that)
MAX_CHUNKS = 1 << 20              # nchunksperloop, i/o/s_chunks of one buffer, cnt of one step
MAX_TOTAL_CHUNKS = 1 << 22        # sum of i/o/s_chunks over all GPUs of one algo
MAX_TBS = 1 << 20                 # threadblocks per file
MAX_STEPS = MAX_XML_CHILDREN * (MAX_XML_ELEMENTS - 1 - MAX_XML_CHILDREN)   # steps per file: 3,143,680
MAX_TEXT_CHARS = 1 << 30          # characters per file: 341 per step at MAX_STEPS (ours write about 110)
_FEED_CHARS = 1 << 24             # text handed to expat at a time (no whole-file copy is made)


@dataclass(frozen=True)
class ParseBounds:
    """What one file may make the parser hold: characters of text and steps (defaults :data:`MAX_TEXT_CHARS`,
    :data:`MAX_STEPS`). Tests pass small ones; callers keep the defaults."""

    text_chars: int = MAX_TEXT_CHARS
    steps: int = MAX_STEPS


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MAX = (1 << 63) - 1

# The collectives MSCCL knows, in either runtime's spelling (DESIGN section 7).
KNOWN_COLLS = ("allgather", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter",
               "reducescatter", "reduce_scatter", "custom")

_INT_RE = re.compile(r"-?[0-9]{1,19}")
_WRAPPER = "synth-msccl-file"     # synthetic root: lets one file hold several <algo> documents
_PROLOG_RE = re.compile(r"\A\ufeff?\s*<\?xml[^>]*\?>")
_DTD_RE = re.compile(r"<!(DOCTYPE|ENTITY)")

# element -> (required attributes, optional attributes); the parent each element must sit in.
_ALGO_REQUIRED = ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")
_ALGO_OPTIONAL = ("name", "outofplace", "minBytes", "maxBytes")
_GPU_REQUIRED = ("id", "i_chunks", "o_chunks", "s_chunks")
_TB_REQUIRED = ("id", "send", "recv", "chan")
_STEP_REQUIRED = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
_STEP_INTS = ("s", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep")
_REQUIRED = {"algo": _ALGO_REQUIRED, "gpu": _GPU_REQUIRED, "tb": _TB_REQUIRED, "step": _STEP_REQUIRED}
_ATTRIBUTES = {**_REQUIRED, "algo": _ALGO_REQUIRED + _ALGO_OPTIONAL}
_KNOWN = {tag: frozenset(attrs) for tag, attrs in _ATTRIBUTES.items()}
_KNOWN_REQUIRED = {tag: frozenset(attrs) for tag, attrs in _REQUIRED.items()}
_PARENT = {"algo": "root", "gpu": "algo", "tb": "gpu", "step": "tb"}


class XmlError(InputError):
    """A malformed MSCCL XML file. ``str(exc)`` is exactly ``"{file}:{line}: {problem}"``."""

    def __init__(self, file: str, line: int, problem: str):
        super().__init__(f"{file}:{line}", "", problem)
        self.file = file
        self.line = line


@dataclass(frozen=True)
class MscclDocument:
    """Everything one file holds: its algorithms, plus notes (warnings) about what the parser skipped."""

    source: str
    programs: tuple[MscclProgram, ...]
    notes: tuple[Finding, ...] = ()


def parse_msccl_xml(text: str, source: str, bounds: ParseBounds = ParseBounds()) -> list[MscclProgram]:
    """Parse MSCCL XML text into one program per ``<algo>`` element.

    Parameters
    ----------
    text : str
        The file's content.
    source : str
        The name used in error messages (usually the path).
    bounds : ParseBounds
        The most text and steps accepted (the defaults take every file a runtime can load).

    Raises
    ------
    XmlError
        (an InputError) for any malformed input, with message ``"{source}:{line}: {problem}"``.
    """
    return list(parse_msccl_document(text, source, bounds).programs)


def load_msccl_xml(path: str | os.PathLike, bounds: ParseBounds = ParseBounds()) -> list[MscclProgram]:
    """Read and parse an MSCCL XML file; see :func:`parse_msccl_xml`."""
    return parse_msccl_xml(read_xml_text(path, bounds), str(path), bounds)


def load_msccl_document(path: str | os.PathLike, bounds: ParseBounds = ParseBounds()) -> MscclDocument:
    """Read and parse an MSCCL XML file, keeping the parser's notes; see :func:`parse_msccl_document`."""
    return parse_msccl_document(read_xml_text(path, bounds), str(path), bounds)


def read_xml_text(path: str | os.PathLike, bounds: ParseBounds = ParseBounds()) -> str:
    """Read a file as UTF-8 text, refusing files over ``bounds.text_chars`` bytes before reading them."""
    source = str(path)
    try:
        size = Path(path).stat().st_size
        if size > bounds.text_chars:
            raise XmlError(source, 1, f"file is {size} bytes; at most {bounds.text_chars} are accepted")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(source, "", f"cannot read the file ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise XmlError(source, line, "the file is not UTF-8 text") from None


def parse_msccl_document(text: str, source: str, bounds: ParseBounds = ParseBounds()) -> MscclDocument:
    """Parse MSCCL XML text into a :class:`MscclDocument` (programs plus notes about skipped content).

    Notes are warning :class:`~backends.msccl.findings.Finding` objects of kind ``unknown-element`` or
    ``unknown-attribute``: the runtimes ignore such content, so it is not an error, but it is worth seeing.
    """
    if not isinstance(text, str):
        raise XmlError(source, 1, "expected text, got binary data")
    if len(text) > bounds.text_chars:
        raise XmlError(source, 1, f"input is {len(text)} characters; at most {bounds.text_chars} are accepted")
    body = _blank_prolog(text).replace("\r\n", "\n").replace("\r", "\n")  # XML's line-end rule, our line count
    dtd = _DTD_RE.search(body)
    if dtd:
        raise XmlError(source, _line_at(body, dtd.start()),
                       "DTDs and entity declarations are refused (untrusted input)")
    handler = _Handler(source, bounds.steps)
    reader = _Reader(handler)
    try:
        reader.feed(f"<{_WRAPPER}>".encode())
        for start in range(0, len(body), _FEED_CHARS):   # piece by piece: no encoded copy of the whole file
            reader.feed(_encoded(body, start, source))
        reader.feed(f"</{_WRAPPER}>".encode())
        reader.close()
    except SAXParseException as exc:
        raise _syntax_error(source, body, exc, handler) from None
    except DefusedXmlException:
        raise XmlError(source, handler.line(), "DTDs and entities are refused (untrusted input)") from None
    finally:    # the expat parser holds the handler's methods: no cycle back, or it keeps every step alive
        handler.expat = None
    if not handler.programs:
        raise XmlError(source, 1, "no <algo> element found; this is not an MSCCL algorithm file")
    return MscclDocument(source, tuple(handler.programs), tuple(handler.notes()))


def _encoded(body: str, start: int, source: str) -> bytes:
    """``body``'s piece of :data:`_FEED_CHARS` characters from ``start``, as UTF-8."""
    try:
        return body[start:start + _FEED_CHARS].encode("utf-8")
    except UnicodeEncodeError as exc:
        raise XmlError(source, _line_at(body, start + exc.start), "text contains a lone surrogate character") from None


def _blank_prolog(text: str) -> str:
    """Replace a leading ``<?xml ...?>`` prolog (and byte-order mark) by spaces, keeping line numbers.

    The wrapper root we add would otherwise put the prolog mid-document, which expat refuses.
    """
    match = _PROLOG_RE.match(text)
    if not match:
        return text
    return re.sub(r"[^\n]", " ", match.group()) + text[match.end():]


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _syntax_error(source: str, body: str, exc: SAXParseException, handler: _Handler) -> XmlError:
    """Translate expat's complaint; an error at the very end means the file is truncated."""
    line = exc.getLineNumber() or 1
    column = exc.getColumnNumber() or 0
    last_line = body.count("\n") + 1
    end_column = len(body) - (body.rfind("\n") + 1) + (len(_WRAPPER) + 2 if last_line == 1 else 0)
    at_end = line > last_line or (line == last_line and column >= end_column)
    if at_end and handler.open_elements():
        tag, opened = handler.open_elements()[-1]
        return XmlError(source, last_line, f"file ends inside <{tag}> opened at line {opened} (truncated file?)")
    if at_end:
        return XmlError(source, last_line, f"unexpected end of file ({exc.getMessage()}; truncated file?)")
    return XmlError(source, min(line, last_line), f"malformed XML: {exc.getMessage()}")


class _Reader(DefusedExpatParser):
    """defusedxml's expat reader (DTDs, entities and external references refused) whose expat parser calls the
    handler's element methods itself, with expat's own dict of an element's attributes, and tells the handler
    where it is: the SAX reader wraps every element in calls and an ``AttributesImpl`` copy (a quarter of the
    parse of 30,000 steps). The handler only reads the dict, and ignores text."""

    def __init__(self, handler: _Handler):
        super().__init__(forbid_dtd=True, forbid_entities=True, forbid_external=True)
        self.setContentHandler(handler)

    def reset(self):
        super().reset()     # (a new expat parser, with defusedxml's refusals)
        parser, handler = self._parser, self.getContentHandler()
        parser.StartElementHandler = handler.startElement
        parser.EndElementHandler = handler.endElement
        parser.CharacterDataHandler = None
        handler.expat = parser


class _Frame(NamedTuple):
    """An open element while parsing (a NamedTuple: one is made per step, a dataclass with factories costs three
    times as much). ``attrs`` and ``children`` (the finished children) are those of algo/gpu/tb, None else."""

    tag: str
    kind: str                      # root, algo, gpu, tb, step, unknown
    line: int
    attrs: dict | None = None
    children: list | None = None


class _Handler(ContentHandler):
    """SAX handler building frozen programs bottom-up; counts are checked before anything grows."""

    def __init__(self, source: str, max_steps: int = MAX_STEPS):
        super().__init__()
        self.source = source
        self.max_steps = max_steps
        self.programs: list[MscclProgram] = []
        self._stack: list[_Frame] = []
        self._unknown: dict[tuple[str, str], list[int]] = {}   # (tag, attr or "") -> [first line, count]
        self._tbs = 0
        self._steps = 0
        self._chunks = 0
        self._ints: dict[str, int] = {}   # attribute text already matched as an integer -> its value
        # ... and those that a step accepted whose value fits every integer attribute of a step
        self._step_ints: dict[str, int] = {}
        self.expat = None     # the expat parser reading the text (:class:`_Reader`), for line numbers

    # --- position and notes -------------------------------------------------------------------------------
    def line(self) -> int:
        expat = self.expat
        return (expat.CurrentLineNumber if expat is not None else None) or 1

    def open_elements(self) -> list[tuple[str, int]]:
        return [(f.tag, f.line) for f in self._stack if f.kind != "root"]

    def notes(self) -> list[Finding]:
        out = []
        for (tag, attr), (first, count) in self._unknown.items():
            times = f" ({count} times, first at line {first})" if count > 1 else ""
            if attr:
                out.append(Finding("unknown-attribute", f"attribute {attr!r} of <{tag}> is not MSCCL; "
                                   f"ignored{times}", "warning", line=first))
            else:
                out.append(Finding("unknown-element", f"element <{tag}> is not MSCCL; ignored with its "
                                   f"content{times}", "warning", line=first))
        return out

    def _note(self, tag: str, attr: str, line: int) -> None:
        entry = self._unknown.setdefault((tag, attr), [line, 0])
        entry[1] += 1

    def _fail(self, problem: str, line: int | None = None):
        raise XmlError(self.source, line or self.line(), problem)

    # --- SAX events ---------------------------------------------------------------------------------------
    def startElement(self, name, attrs):
        line = self.line()
        stack = self._stack
        if name == "step" and stack and stack[-1].kind == "tb":
            # most elements: built straight into a Step, no attribute dict kept
            step = self._plain_step(attrs, line) or self._attributes(name, attrs, line)
            self._steps += 1
            if self._steps > self.max_steps:
                self._too_many_steps()
            stack[-1].children.append(step)
            stack.append(_Frame(name, name, line))
            return
        if not stack:
            stack.append(_Frame(name, "root", line))
            return
        parent = stack[-1]
        if parent.kind == "unknown" or name not in _PARENT:
            if name in _PARENT:
                self._fail(f"<{name}> is inside <{parent.tag}> (line {parent.line}), which is not MSCCL")
            if parent.kind != "unknown":
                self._note(name, "", line)
            self._stack.append(_Frame(name, "unknown", line))
            return
        if parent.kind != _PARENT[name]:
            where = "at top level" if parent.kind == "root" else f"inside <{parent.tag}> (line {parent.line})"
            wanted = "at top level" if _PARENT[name] == "root" else f"inside <{_PARENT[name]}>"
            self._fail(f"<{name}> must be {wanted}, not {where}")
        values = self._attributes(name, attrs, line)
        self._stack.append(_Frame(name, name, line, values, []))

    def endElement(self, name):
        frame = self._stack.pop()
        if frame.kind in ("root", "unknown", "step"):
            return
        parent = self._stack[-1]
        if frame.kind == "tb":
            parent.children.append(Threadblock(frame.attrs["id"], frame.attrs["send"], frame.attrs["recv"],
                                               frame.attrs["chan"], tuple(frame.children), frame.line))
        elif frame.kind == "gpu":
            a = frame.attrs
            parent.children.append(Gpu(a["id"], a["i_chunks"], a["o_chunks"], a["s_chunks"],
                                       tuple(frame.children), frame.line))
        else:
            self.programs.append(self._program(frame))

    # --- element builders ---------------------------------------------------------------------------------
    def _attributes(self, tag: str, raw: dict, line: int) -> dict | Step:
        """Check presence and types of an element's attributes; return them converted (a step as its Step)."""
        known = _KNOWN[tag]
        if not known.issuperset(raw):
            for attr in raw:
                if attr not in known:
                    self._note(tag, attr, line)
        if not _KNOWN_REQUIRED[tag].issubset(raw):
            missing = [a for a in _REQUIRED[tag] if a not in raw]
            self._fail(f"<{tag}> lacks required attribute{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        if tag == "step":
            return self._step_values(tag, raw, line)
        return _CONVERTERS[tag](self, tag, raw)

    def _int(self, tag: str, raw: dict, attr: str, low: int = INT32_MIN, high: int = INT32_MAX) -> int:
        text = raw[attr]
        value = self._ints.get(text)
        if value is None:   # files repeat a few small integers: match each spelling once
            if not _INT_RE.fullmatch(text):
                self._fail(f"<{tag}> attribute {attr}={_show(text)} is not an integer")
            value = self._ints[text] = int(text)
        if not low <= value <= high:
            self._fail(f"<{tag}> attribute {attr}={value} is out of range {low}..{high}")
        return value

    def _algo_values(self, tag: str, raw: dict) -> dict:
        if len(self.programs) >= MAX_ALGOS:
            self._fail(f"more than {MAX_ALGOS} <algo> documents in one file")
        if raw["proto"] not in PROTOCOLS:
            self._fail(f"<algo> proto={_show(raw['proto'])} is unknown; use one of {', '.join(PROTOCOLS)}")
        if raw["coll"] not in KNOWN_COLLS:
            self._fail(f"<algo> coll={_show(raw['coll'])} is unknown; use one of {', '.join(KNOWN_COLLS)}")
        optional = {a: self._int(tag, raw, a, 0 if a == "outofplace" else -INT64_MAX, INT64_MAX)
                    if a in raw else None for a in ("outofplace", "minBytes", "maxBytes")}
        return {"name": raw.get("name", ""), "proto": raw["proto"], "coll": raw["coll"],
                "ngpus": self._int(tag, raw, "ngpus", 1, MAX_GPUS),
                "nchannels": self._int(tag, raw, "nchannels", 1, MAX_PARSED_CHANNELS),
                "nchunksperloop": self._int(tag, raw, "nchunksperloop", 1, MAX_CHUNKS),
                "inplace": self._int(tag, raw, "inplace", 0, INT32_MAX), **optional}

    def _gpu_values(self, tag: str, raw: dict) -> dict:
        algo = self._stack[-1]
        if len(algo.children) >= algo.attrs["ngpus"]:
            self._fail(f"more <gpu> elements than ngpus={algo.attrs['ngpus']}")
        values = {"id": self._int(tag, raw, "id")}
        for attr in ("i_chunks", "o_chunks", "s_chunks"):
            values[attr] = self._int(tag, raw, attr, 0, MAX_CHUNKS)
            self._chunks += values[attr]
        if self._chunks > MAX_TOTAL_CHUNKS:
            self._fail(f"the buffers of this file's GPUs add up to more than {MAX_TOTAL_CHUNKS} chunks")
        return values

    def _tb_values(self, tag: str, raw: dict) -> dict:
        self._tbs += 1
        if self._tbs > MAX_TBS:
            self._fail(f"more than {MAX_TBS} threadblocks in one file")
        return {a: self._int(tag, raw, a) for a in _TB_REQUIRED}

    def _step_values(self, tag: str, raw: dict, line: int) -> Step:
        if raw["type"] not in STEP_TYPES:
            self._fail(f"<step> type={_show(raw['type'])} is unknown; use one of {', '.join(STEP_TYPES)}")
        for attr in ("srcbuf", "dstbuf"):
            if raw[attr] not in BUFFERS:
                self._fail(f"<step> {attr}={_show(raw[attr])} is unknown; use one of {', '.join(BUFFERS)}")
        to_int = self._int
        s, srcoff, dstoff = to_int(tag, raw, "s"), to_int(tag, raw, "srcoff"), to_int(tag, raw, "dstoff")
        depid, deps, hasdep = to_int(tag, raw, "depid"), to_int(tag, raw, "deps"), to_int(tag, raw, "hasdep")
        cnt = to_int(tag, raw, "cnt", INT32_MIN, MAX_CHUNKS)
        for attr, value in zip(_STEP_INTS, (s, srcoff, dstoff, cnt, depid, deps, hasdep)):
            if value <= MAX_CHUNKS:     # in every step attribute's range: a spelling :meth:`_plain_step` takes
                self._step_ints[raw[attr]] = value
        return Step(s, raw["type"], raw["srcbuf"], srcoff, raw["dstbuf"], dstoff, cnt, depid, deps, hasdep, line)

    def _plain_step(self, raw: dict, line: int) -> Step | None:
        """The step of a ``<step>`` whose attributes are exactly the ten required ones, with known step type and
        buffers and integers spelled as in steps already accepted (:attr:`_step_ints`), as :meth:`_step_values`
        makes it; None for any other (that path then checks it and says what is wrong). Most steps of a file
        are such, and this takes a fifth of the time."""
        ints = self._step_ints
        try:
            if len(raw) != len(_STEP_REQUIRED) or raw["type"] not in STEP_TYPES or raw["srcbuf"] not in BUFFERS \
                    or raw["dstbuf"] not in BUFFERS:
                return None
            return Step(ints[raw["s"]], raw["type"], raw["srcbuf"], ints[raw["srcoff"]], raw["dstbuf"],
                        ints[raw["dstoff"]], ints[raw["cnt"]], ints[raw["depid"]], ints[raw["deps"]],
                        ints[raw["hasdep"]], line)
        except KeyError:
            return None

    def _too_many_steps(self) -> None:
        self._fail(f"more than {self.max_steps} steps in one file" + (
            "" if self.max_steps < MAX_STEPS else f": no MSCCL runtime loads that many (a rank's load holds "
            f"{MAX_XML_ELEMENTS} XML elements, an <algo> {MAX_XML_CHILDREN} GPUs)"))

    @staticmethod
    def _program(frame: _Frame) -> MscclProgram:
        a = frame.attrs
        return MscclProgram(a["name"], a["proto"], a["nchannels"], a["nchunksperloop"], a["ngpus"], a["coll"],
                            a["inplace"], a["outofplace"], a["minBytes"], a["maxBytes"], tuple(frame.children),
                            frame.line)


# How each element's attributes are checked and converted (functions of the class, not bound methods kept on the
# handler: those would hold it in a reference cycle, and the parsed program with it until a full collection).
_CONVERTERS = {"algo": _Handler._algo_values, "gpu": _Handler._gpu_values, "tb": _Handler._tb_values}


def _show(value: str, limit: int = 40) -> str:
    """Quote an attribute value for a message, shortened: values come from untrusted files."""
    return repr(value if len(value) <= limit else value[:limit] + "...")
