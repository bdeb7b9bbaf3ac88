"""Static checks of an MSCCL program against what the two MSCCL runtimes accept (DESIGN section 7).

:func:`lint_program` checks a parsed or generated :class:`~backends.msccl.ir.MscclProgram`; :func:`lint_text`
checks the lexical rules of the runtimes' hand-written XML lexers on the raw text. Neither executes anything:
data correctness, deadlocks and races are the interpreter's (:mod:`backends.msccl.interpret`).

Each :class:`~backends.msccl.findings.Finding` names the rule (``kind``), the gpu/tb/step and source line, and the
runtimes that reject or misrun the file because of it. How severe a finding is depends on the target:

- target ``executor`` or ``legacy``: findings about that runtime are errors (rules that are advisory by nature,
  such as size selection, stay warnings); findings that only concern the other runtime are dropped;
- target ``both`` (a portable report): a problem that breaks both runtimes is an error; a problem that breaks
  only one is a warning naming that runtime. So a legacy-format file (no ``minBytes``) is valid for ``both``
  with a warning, but invalid for ``executor``, which would silently skip it.

>>> from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
>>> send = Threadblock(0, 1, -1, 0, (Step(0, "s", "i", 0, "o", 0, 1),))
>>> recv = Threadblock(0, -1, 0, 0, (Step(0, "r", "i", 0, "o", 0, 1),))
>>> program = MscclProgram("p2p", "Simple", 1, 1, 2, "allreduce", 0, 1, 0, 1 << 30,
...                        (Gpu(0, 1, 1, 0, (send,)), Gpu(1, 1, 1, 0, (recv,))))
>>> lint_program(program)
[]
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import replace
from math import gcd

from backends.msccl import conventions
from backends.msccl.ir import (COLL_SPELLING, LEGACY_UNKNOWN_COLLECTIVES, MAX_ATTR_LEN, PROTOCOLS, STEP_TYPES, Gpu,
                               MscclProgram, Step, Threadblock)
from backends.msccl.limits import (MAX_DEPID, buffer_findings, buffer_limits, connection_findings, nchannels_findings,
                                   ngpus_findings, step_limit_findings, tb_limit_findings, tbs_per_gpu_findings,
                                   xml_elements_findings)

from synth.errors import InputError
from backends.msccl.findings import RUNTIMES, Finding

TARGETS = ("executor", "legacy", "both")
EXECUTOR, LEGACY = ("executor",), ("legacy",)
MAX_ATTRS_PER_ELEMENT = 16
# Attributes the legacy loader reads, per element (DESIGN section 7; legacy needs name, not the executor's three).
_NEEDED_ATTRIBUTES = {"algo": ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"),
                      "gpu": ("id", "i_chunks", "o_chunks", "s_chunks"), "tb": ("id", "send", "recv", "chan"),
                      "step": ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
                               "hasdep")}
MAX_FINDINGS_PER_KIND = 50        # per program; the rest are summarised in one finding
TYPICAL_MIN_SMS = 80              # V100; all tbs of a GPU must be co-resident, one per SM

# Rules whose violation makes executing the program meaningless: the runtime would not load it, or the
# interpreter would have to guess (missing GPUs, peers that do not exist, dependencies on nothing).
STRUCTURAL_KINDS = frozenset({"gpu-ids", "tb-ids", "tb-peer", "dependency", "step-buffer", "channel"})

_COLLS = ("allgather", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter", "custom")


def lint_program(program: MscclProgram, target: str = "both", *, cap: bool = True,
                 sms: int | None = None) -> list[Finding]:
    """Check one program against the runtime limits and rules of DESIGN section 7.

    Parameters
    ----------
    program : MscclProgram
        A parsed (``line`` fields set) or generated program.
    target : str
        ``executor``, ``legacy`` or ``both``; decides which findings are errors (see the module docstring).
    cap : bool
        Keep at most :data:`MAX_FINDINGS_PER_KIND` per rule plus one summary per rule (see
        :func:`cap_findings`); False returns every finding, e.g. to count them.
    sms : int or None
        The GPU's SM count: more threadblocks on a GPU is an error. None (unknown GPU): a warning above
        :data:`TYPICAL_MIN_SMS`.

    Returns
    -------
    list of Finding
        In rule order.
    """
    _check_target(target)
    raw: list[Finding] = []
    for rule in (_algo_attributes, _algo_values, _selection, _gpu_ids, _legacy_buffer_chunks):
        raw.extend(rule(program))
    for gpu in program.gpus:
        raw.extend(_gpu_findings(program, gpu, sms))
    findings = for_target(raw, target)
    return cap_findings(findings) if cap else findings


def for_target(findings, target: str) -> list[Finding]:
    """Apply the target's severity policy to findings from any checker (linter or interpreter).

    Drops findings that only concern the runtime not targeted; with target ``both``, errors that affect only
    one runtime become warnings.
    """
    _check_target(target)
    out = []
    for f in findings:
        affected = set(f.runtimes)
        if target != "both" and target not in affected:
            continue
        if target == "both" and f.severity == "error" and affected != set(RUNTIMES):
            f = replace(f, severity="warning")
        out.append(f)
    return out


def blocks_execution(findings) -> bool:
    """True when an error makes executing the program meaningless (see :data:`STRUCTURAL_KINDS`)."""
    return any(f.severity == "error" and f.kind in STRUCTURAL_KINDS for f in findings)


def lint_text(text: str, source: str = "") -> list[Finding]:
    """Check the lexical rules of the runtimes' hand-written lexers on raw XML text (DESIGN section 7).

    No ``<?xml`` prolog, no tabs, each start tag on one line, double-quoted values, at most 16 attributes per
    element, values at most 254 characters. Linear in the text (safe on untrusted input). ``source`` names
    the text like the parser's argument; findings carry only the line (not gpu/tb/step) and callers prefix
    the file, as ``synth check`` does.
    """
    findings: list[Finding] = []
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("<?xml"):
        findings.append(Finding("lexical", "the file starts with an <?xml ...?> prolog, which the MSCCL lexers "
                                "do not understand; remove it", line=_line_at(text, len(text) - len(stripped))))
    tab_lines = ([number for number, line in enumerate(text.split("\n"), 1) if "\t" in line]
                 if "\t" in text else [])
    if tab_lines:
        findings.append(Finding("lexical", f"tab characters on {len(tab_lines)} line(s), first at line "
                                f"{tab_lines[0]}; indent with spaces", line=tab_lines[0]))
    for tag, body, line in _start_tags(text):
        findings.extend(_tag_findings(tag, body, line))
    return cap_findings(findings)


# --- algo-level rules -------------------------------------------------------------------------------------

def _algo_attributes(p: MscclProgram) -> list[Finding]:
    """Attribute presence per runtime: the executor needs minBytes/maxBytes/outofplace, legacy a name."""
    out = []
    missing = [name for name, value in (("minBytes", p.min_bytes), ("maxBytes", p.max_bytes),
                                        ("outofplace", p.outofplace)) if value is None]
    if missing:
        # executor: mscclGetAlgoFromXmlFile fails on the file, and the loop over MSCCL_ALGO_DIR stops at the first
        # file that fails (DESIGN section 7)
        out.append(Finding("algo-attributes", f"<algo> lacks {', '.join(missing)}: the executor cannot load this "
                           "file, and in MSCCL_ALGO_DIR it stops loading at the first such file, so every file after "
                           "it (in path order) is lost too; NCCL runs its own algorithms instead",
                           runtimes=EXECUTOR, line=p.line))
    if not p.name:
        out.append(Finding("algo-attributes", "<algo> has no name; the legacy runtime refuses the file",
                           runtimes=LEGACY, line=p.line))
    return out


def _algo_values(p: MscclProgram) -> list[Finding]:
    """proto, coll spelling, nchannels, inplace/outofplace flags and the size range."""
    out = []
    if p.proto not in PROTOCOLS:
        out.append(Finding("proto", f"proto {p.proto!r} is not one of {', '.join(PROTOCOLS)}", line=p.line))
    out.extend(_coll_spelling(p))
    out.extend(nchannels_findings(p) + ngpus_findings(p))
    for name, value in (("inplace", p.inplace), ("outofplace", p.outofplace)):
        if value not in (None, 0, 1):
            out.append(Finding("algo-attributes", f"{name}={value} should be 0 or 1", "warning", line=p.line))
    if p.inplace == 0 and p.outofplace == 0:
        out.append(Finding("selection", "inplace=0 and outofplace=0: the algorithm is never selected",
                           runtimes=EXECUTOR, line=p.line))
    out.extend(_size_range(p))
    out.extend(_legacy_inplace(p))
    return out


def _size_range(p: MscclProgram) -> list[Finding]:
    """minBytes/maxBytes as each runtime reads them (DESIGN section 7, "Size ranges and selection")."""
    low, high = p.min_bytes, p.max_bytes
    if low is None or high is None:
        return []
    out = []
    shown = f"minBytes={low}..maxBytes={high}"
    # executor and RCCL (algorithm selection): nBytes >= minBytes && (maxBytes == 0 || nBytes <= maxBytes)
    if low < 0 or (high != 0 and low > high):
        out.append(Finding("selection", f"size range {shown} is empty for the executor (maxBytes=0 would mean no "
                           "upper limit): the algorithm is never selected", runtimes=EXECUTOR, line=p.line))
    # legacy loader: refuses minBytes > maxBytes; legacy selection: minBytes <= nBytes < maxBytes
    if low > high:
        why = " (maxBytes=0 means no upper limit only to the executor)" if high == 0 else ""
        out.append(Finding("selection", f"the legacy loader refuses minBytes > maxBytes ({shown}){why}",
                           runtimes=LEGACY, line=p.line))
    elif high <= max(low, 0):
        out.append(Finding("selection", f"size range {shown} is empty for the legacy runtime, which selects only "
                           "sizes below maxBytes: the algorithm is never selected", runtimes=LEGACY, line=p.line))
    return out


def _legacy_inplace(p: MscclProgram) -> list[Finding]:
    """Legacy selection matches the file's ``inplace`` to the call's exactly, so a file cannot serve both."""
    if p.inplace == 1 and p.outofplace == 1:
        return [Finding("selection", "the legacy runtime selects this file for in-place calls only (it matches "
                        "inplace to the call exactly); out-of-place calls run NCCL's own algorithm", "warning",
                        runtimes=LEGACY, line=p.line)]
    return []


def _legacy_buffer_chunks(p: MscclProgram) -> list[Finding]:
    """The legacy loader checks ``i_chunks * m_in == nchunksperloop`` (and for ``o_chunks``) where they are > 0;
    m is the collective's buffer multiplier (:mod:`backends.msccl.conventions`; custom: 1, so i = o = L)."""
    if p.coll in LEGACY_UNKNOWN_COLLECTIVES or p.nchunksperloop < 1:
        return []
    sizes = conventions.buffer_chunks(p.collective, p.nchunksperloop, p.ngpus)
    want = (p.nchunksperloop, p.nchunksperloop) if sizes is None else (sizes.input, sizes.output)
    out = []
    for gpu in p.gpus:
        for name, declared, required in (("i_chunks", gpu.i_chunks, want[0]), ("o_chunks", gpu.o_chunks, want[1])):
            if declared > 0 and declared != required:
                out.append(Finding("buffer-chunks", f"{name}={declared}, but the legacy loader requires "
                                   f"{_show(required)} for {p.coll} with nchunksperloop={p.nchunksperloop} (or 0) "
                                   "and refuses the file", runtimes=LEGACY, gpu=gpu.id, line=gpu.line))
    return out


def _coll_spelling(p: MscclProgram) -> list[Finding]:
    """The collectives each loader knows, in its spelling."""
    if p.coll in LEGACY_UNKNOWN_COLLECTIVES:
        # legacy loader: "MSCCL: collective type gather is not supported"
        return [Finding("coll", f"the legacy runtime knows no {p.coll} and refuses the file; write it for the "
                        "executor", runtimes=LEGACY, line=p.line)]
    if p.coll in COLL_SPELLING.values():
        return [Finding("coll", f"coll={p.coll!r} is spelled {COLL_SPELLING[runtime]!r} for the {runtime} runtime, "
                        "which does not recognise this file's spelling", runtimes=(runtime,), line=p.line)
                for runtime in RUNTIMES if COLL_SPELLING[runtime] != p.coll]
    if p.coll not in _COLLS:
        return [Finding("coll", f"coll={p.coll!r} is not an MSCCL collective", line=p.line)]
    return []


def _selection(p: MscclProgram) -> list[Finding]:
    """Warn when NCCL would silently fall back: the algorithm runs only if count*multiplier % nchunksperloop == 0.

    ``g`` is the divisor the element count itself must have. Sizes are powers of two in practice (nccl-tests,
    framework buckets), so a ``g`` that is not a power of two means the algorithm (almost) never runs.
    """
    if p.nchunksperloop < 1:
        return [Finding("selection", f"nchunksperloop={p.nchunksperloop} must be at least 1", line=p.line)]
    multiplier = conventions.multiplier(p.collective, p.ngpus)
    g = p.nchunksperloop // gcd(p.nchunksperloop, multiplier)
    if g & (g - 1) == 0:
        return []
    return [Finding("selection", f"the algorithm only runs when count*{multiplier} % nchunksperloop="
                    f"{p.nchunksperloop} == 0, i.e. when the element count is a multiple of {g}; power-of-two "
                    "sizes never are, and NCCL then silently uses its own algorithm", "warning", line=p.line)]


def _gpu_ids(p: MscclProgram) -> list[Finding]:
    """Every rank 0..ngpus-1 appears exactly once."""
    out = []
    seen = Counter(g.id for g in p.gpus)
    for gpu in p.gpus:
        if not 0 <= gpu.id < p.ngpus:
            out.append(Finding("gpu-ids", f"gpu id {gpu.id} is outside 0..{p.ngpus - 1}", gpu=gpu.id, line=gpu.line))
    for gpu_id, count in sorted(seen.items()):
        if count > 1:
            first = next(g for g in p.gpus if g.id == gpu_id)
            out.append(Finding("gpu-ids", f"gpu {gpu_id} is described {count} times", gpu=gpu_id, line=first.line))
    missing = [r for r in range(p.ngpus) if r not in seen]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        out.append(Finding("gpu-ids", f"ngpus={p.ngpus} but no <gpu> for rank(s) {shown}", line=p.line))
    return out


# --- gpu-, tb- and step-level rules -----------------------------------------------------------------------

def _gpu_findings(p: MscclProgram, gpu: Gpu, sms: int | None) -> list[Finding]:
    out = _tb_ids(gpu) + connection_findings(gpu) + tbs_per_gpu_findings(gpu, sms) + xml_elements_findings(p, gpu)
    if sms is None and len(gpu.tbs) > TYPICAL_MIN_SMS:
        out.append(Finding("tb-count", f"{len(gpu.tbs)} threadblocks; all must be co-resident (one per SM) and "
                           f"some GPUs have only {TYPICAL_MIN_SMS} SMs", "warning", gpu=gpu.id, line=gpu.line))
    signals = {tb.id: _next_index(tb.steps, lambda st: st.hasdep and st.type != "nop") for tb in gpu.tbs}
    tbs_by_id = {tb.id: tb for tb in gpu.tbs}
    awaited = {st.depid for tb in gpu.tbs for st in tb.steps if st.depid >= 0}
    limits = buffer_limits(p, gpu)
    for tb in gpu.tbs:
        out.extend(_tb_findings(p, gpu, tb))
        out.extend(tb_limit_findings(p, gpu, tb))
        real = _next_index(tb.steps, lambda st: st.type != "nop")
        for index, step in enumerate(tb.steps):
            where = {"gpu": gpu.id, "tb": tb.id, "step": index, "line": step.line}
            out.extend(_step_findings(tb, index, step, where, tb.id in awaited, real))
            out.extend(step_limit_findings(step, where))
            out.extend(buffer_findings(step, limits, where))
            out.extend(_dependency_findings(tbs_by_id, signals, step, where))
    return out


def _next_index(steps, wanted) -> list[int | None]:
    """Per position k, the first position >= k whose step is ``wanted`` (None if none): one backward pass, so
    rules that look ahead stay linear in long runs of nops."""
    out: list[int | None] = [None] * (len(steps) + 1)
    for k in range(len(steps) - 1, -1, -1):
        out[k] = k if wanted(steps[k]) else out[k + 1]
    return out


def _tb_ids(gpu: Gpu) -> list[Finding]:
    """Threadblock ids are 0..k-1, each once (the runtimes index arrays by them)."""
    ids = Counter(tb.id for tb in gpu.tbs)
    out = [Finding("tb-ids", f"tb id {tb_id} is used {count} times", gpu=gpu.id, tb=tb_id, line=gpu.line)
           for tb_id, count in sorted(ids.items()) if count > 1]
    expected = set(range(len(gpu.tbs)))
    if set(ids) != expected and not out:
        odd = sorted(set(ids) - expected)
        out.append(Finding("tb-ids", f"tb ids must be 0..{len(gpu.tbs) - 1} without gaps; found {odd[:10]}",
                           gpu=gpu.id, line=gpu.line))
    return out


def _tb_findings(p: MscclProgram, gpu: Gpu, tb: Threadblock) -> list[Finding]:
    """Peers of one threadblock (its channel and step count are limits: :mod:`backends.msccl.limits`)."""
    out = []
    where = {"gpu": gpu.id, "tb": tb.id, "line": tb.line}
    for name, peer in (("send", tb.send), ("recv", tb.recv)):
        if peer != -1 and (peer == gpu.id or not 0 <= peer < p.ngpus):
            why = "itself" if peer == gpu.id else f"not a rank (0..{p.ngpus - 1})"
            out.append(Finding("tb-peer", f"{name}={peer} is {why}; use -1 or another rank", **where))
    return out


def _step_findings(tb: Threadblock, index: int, step: Step, where: dict, awaited: bool,
                   real: list) -> list[Finding]:
    """Position, count, direction against the tb's peers, and nop placement."""
    out = []
    if step.s != index:
        # both loaders read steps in file order and accept any s while no dependency names the tb's steps
        if awaited:
            out.append(Finding("step-index", f"s={step.s} but the step is at position {index}, and dependencies "
                               "name steps of this tb: the runtimes count them by position", **where))
        else:
            out.append(Finding("step-index", f"s={step.s} but the step is at position {index}; the runtimes "
                               "ignore it (no dependency names this tb), other tools may not", "warning", **where))
    if step.type not in STEP_TYPES:
        return out + [Finding("step-type", f"type {step.type!r} is unknown", **where)]
    receives, sends, _, _ = STEP_TYPES[step.type]
    if sends and tb.send == -1:
        out.append(Finding("tb-direction", f"'{step.type}' sends but the tb has send=-1", **where))
    if receives and tb.recv == -1:
        out.append(Finding("tb-direction", f"'{step.type}' receives but the tb has recv=-1", **where))
    if step.type == "nop":
        out.extend(_nop_findings(tb, real[index + 1], where))
    if step.hasdep not in (0, 1):
        out.append(Finding("dependency", f"hasdep={step.hasdep} should be 0 or 1", "warning", **where))
    return out


def _nop_findings(tb: Threadblock, next_real: int | None, where: dict) -> list[Finding]:
    """A nop (or chain of nops) adds a dependency to the next real step, which must itself have one."""
    after = None if next_real is None else tb.steps[next_real]
    if after is None:
        return [Finding("nop", "nop is not followed by a real step: its dependency is attached to nothing",
                        **where)]
    if after.depid < 0:
        return [Finding("nop", f"nop is followed by step {after.s}, which has no dependency of its own; the "
                        "runtimes attach a nop's dependency only to a step that has one", **where)]
    return []


def _dependency_findings(tbs_by_id: dict, signals: dict, step: Step, where: dict) -> list[Finding]:
    """depid/deps name an existing tb and step on this GPU whose progress is actually signalled.

    A waiting step is released when tb ``depid`` publishes progress >= ``deps``; only non-nop steps with
    hasdep=1 publish. If none at or after ``deps`` does, the wait never ends (hang).
    """
    if step.depid == -1:
        if step.deps != -1:
            return [Finding("dependency", f"deps={step.deps} without depid is ignored", "warning", **where)]
        return []
    if not 0 <= step.depid <= MAX_DEPID:
        return []   # a limit (backends.msccl.limits)
    target = tbs_by_id.get(step.depid)
    if target is None:
        return [Finding("dependency", f"depid={step.depid} names no tb on this gpu", **where)]
    if not 0 <= step.deps < len(target.steps):
        return [Finding("dependency", f"deps={step.deps} but tb {step.depid} has {len(target.steps)} step(s): "
                        "the wait never ends", **where)]
    awaited = target.steps[step.deps]
    if awaited.hasdep and awaited.type != "nop":
        return []
    why = "is a nop" if awaited.type == "nop" else "has hasdep=0"
    next_signal = signals[step.depid][step.deps + 1]
    later = None if next_signal is None else target.steps[next_signal]
    if later is None:
        return [Finding("dependency", f"waits for tb {step.depid} step {step.deps}, which {why} and so never "
                        "signals (nor does any later step): the program hangs", **where)]
    return [Finding("dependency", f"waits for tb {step.depid} step {step.deps}, which {why}; it is released "
                    f"only when step {later.s} signals", "warning", **where)]


# --- lexical helpers --------------------------------------------------------------------------------------

_NAME_END = re.compile(r"[\s/>]")


def _start_tags(text: str):
    """Yield (tag, attribute text, line) of every start tag, skipping comments, with a linear scan."""
    pos, line, n = 0, 1, len(text)
    while pos < n:
        lt = text.find("<", pos)
        if lt < 0:
            return
        line += text.count("\n", pos, lt)
        if text.startswith("<!--", lt):
            end = text.find("-->", lt + 4)
            stop = n if end < 0 else end + 3
        else:
            end = text.find(">", lt + 1)
            stop = n if end < 0 else end + 1
            inner = text[lt + 1:stop - 1 if end >= 0 else n]
            if inner[:1].isalpha() or inner[:1] == "_":
                end_of_name = _NAME_END.search(inner)   # \s is str.isspace() for str patterns
                name_end = end_of_name.start() if end_of_name else len(inner)
                yield inner[:name_end], inner[name_end:].rstrip("/"), line
        line += text.count("\n", lt, stop)
        pos = stop


def _tag_findings(tag: str, body: str, line: int) -> list[Finding]:
    """Lexical rules of one start tag: one line, double quotes, <= 16 attributes, values <= 254 chars."""
    out = []
    if "\n" in body or "\r" in body:
        out.append(Finding("lexical", f"<{tag}> spans several lines; the lexers need each element's attributes "
                           "on one line", line=line))
    if "'" not in body and body.count("=") <= MAX_ATTRS_PER_ELEMENT and len(body) <= MAX_ATTR_LEN:
        return out   # no single quote, at most 16 '=', no value that long: nothing below can fire (most tags)
    values = _attribute_values(body)
    if any(quote == "'" for _, quote, _ in values):
        out.append(Finding("lexical", f"<{tag}> uses single quotes; the lexers only accept double quotes",
                           line=line))
    if len(values) > MAX_ATTRS_PER_ELEMENT:
        out.extend(_attribute_count(tag, [name for name, _, _ in values], line))
    longest = max((len(v) for _, _, v in values), default=0)
    if longest > MAX_ATTR_LEN:
        out.append(Finding("lexical", f"<{tag}> has a {longest}-character attribute value; at most {MAX_ATTR_LEN}",
                           line=line))
    return out


def _attribute_count(tag: str, names: list[str], line: int) -> list[Finding]:
    """More than 16 attributes: the executor's lexer fails on the element; the legacy lexer drops the rest,
    which matters only when a dropped one is needed (DESIGN section 7)."""
    dropped = names[MAX_ATTRS_PER_ELEMENT:]
    out = [Finding("lexical", f"<{tag}> has {len(names)} attributes; the executor reads at most "
                   f"{MAX_ATTRS_PER_ELEMENT}", runtimes=EXECUTOR, line=line)]
    needed = [name for name in dropped if name in _NEEDED_ATTRIBUTES.get(tag, ())]
    if needed:
        out.append(Finding("lexical", f"<{tag}> has {len(names)} attributes; the legacy lexer drops those after the "
                           f"{MAX_ATTRS_PER_ELEMENT}th, among them {', '.join(needed)}, which it needs",
                           runtimes=LEGACY, line=line))
    else:
        out.append(Finding("lexical", f"<{tag}> has {len(names)} attributes; the legacy lexer drops "
                           f"{', '.join(dropped)}", "warning", runtimes=LEGACY, line=line))
    return out


def _attribute_values(body: str) -> list[tuple[str, str, str]]:
    """(name, quote, value) of each ``name=value`` in a start tag, scanning once (no regex backtracking)."""
    out = []
    pos = body.find("=")
    while pos >= 0:
        start = pos + 1
        while start < len(body) and body[start].isspace():
            start += 1
        if start >= len(body) or body[start] not in "\"'":
            pos = body.find("=", start)
            continue
        quote = body[start]
        end = body.find(quote, start + 1)
        if end < 0:
            break
        name = body[:pos].rstrip().rsplit(None, 1)[-1] if body[:pos].strip() else ""
        out.append((name, quote, body[start + 1:end]))
        pos = body.find("=", end + 1)
    return out


# --- small helpers ----------------------------------------------------------------------------------------

def _show(value) -> str:
    return str(value.numerator) if getattr(value, "denominator", 1) == 1 else f"{float(value):.3g}"


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise InputError("--target", "", f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def cap_findings(findings) -> list[Finding]:
    """Keep at most :data:`MAX_FINDINGS_PER_KIND` findings per (kind, severity), summarising the rest in one.

    A badly broken file can have a finding per step (millions); a report that long helps nobody.
    """
    kept: list[Finding] = []
    dropped: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    shown: Counter = Counter()
    for f in findings:
        key = (f.kind, f.severity)
        if shown[key] < MAX_FINDINGS_PER_KIND:
            shown[key] += 1
            kept.append(f)
        else:
            dropped[key].append(f)
    for (kind, severity), rest in dropped.items():
        runtimes = tuple(r for r in RUNTIMES if any(r in f.runtimes for f in rest))
        first = f", first at line {rest[0].line}" if rest[0].line else ""
        kept.append(Finding(kind, f"{len(rest)} more {kind} finding(s) like the above{first}", severity,
                            runtimes=runtimes, line=rest[0].line))
    return kept
