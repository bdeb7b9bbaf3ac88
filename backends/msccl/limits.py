"""The MSCCL runtimes' limits, checked in one place (DESIGN section 7).

Channels, steps per threadblock, ``cnt``, ``depid``, threadblocks per (peer, channel, direction), per channel and
per GPU (all of a GPU's threadblocks are co-resident, one per SM, so at most its SM count), and buffer offsets. ``synth check`` (through :mod:`backends.msccl.lint`), the verified writer and run planning
(:mod:`synth.runtime.program_buffers`) all judge a program with these rules; the interpreter reports a second
threadblock on a connection with :func:`connection_findings` and ``cnt`` outside the same range. Every rule returns :class:`~backends.msccl.findings.Finding` objects naming the runtimes it
concerns, so a caller keeps the ones of its target (:func:`backends.msccl.lint.for_target`).

>>> from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
>>> long_tb = Threadblock(0, 1, -1, 0, tuple(Step(k, "s", "i", 0, "o", 0, 1) for k in range(65)))
>>> program = MscclProgram("p", "Simple", 1, 1, 2, "allreduce", 0, 1, 0, 0,
...                        (Gpu(0, 1, 1, 0, (long_tb,)), Gpu(1, 1, 1, 0, ())))
>>> [(f.kind, f.runtimes) for f in runtime_limits(program)]
[('steps-per-tb', ('executor',))]
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from backends.msccl import conventions
from backends.msccl.findings import Finding
from backends.msccl.ir import BUFFERS, STEP_TYPES, Gpu, MscclProgram, Step, Threadblock

# Each number below is what the runtimes' loaders and kernels allow (DESIGN section 7).
MAX_STEPS_EXECUTOR = 64            # executor's default build (MSCCL_MAX_NUM_STEPS)
MAX_STEPS_LEGACY = 256             # legacy, and an executor rebuilt with more steps
MAX_CNT = 71                       # a step's cnt
MAX_CHANNELS = 32                  # nchannels; chan is 0..nchannels-1
MAX_TBS_PER_CHANNEL_DIRECTION = 32  # sending (or receiving) tbs on one channel of a GPU
MAX_DEPID = 127                    # depid is stored in a signed byte
INT16_MAX = 32767                  # srcoff/dstoff are int16
# Both loaders read a rank's file into one fixed table of XML elements (MAX_NODES = 4096 in msccl_parser.h and in
# legacy's graph/xml.h): the <algo>, every <gpu> element, and the loading rank's own <tb> and <step> elements
# count, and the reader fails when the table is full before its next read (one always follows), so a rank holds
# at most 4095 of them. An element's children go into a 1024-slot array without a bound check (MAX_SUBS): more
# than 1024 <gpu> elements in an <algo> overwrite the reader's memory.
MAX_XML_ELEMENTS = 4096 - 1        # counted elements per rank's load
MAX_XML_CHILDREN = 1024            # children of one element: the GPUs of one algo

# Findings that say "the runtime cannot hold this program" (rather than "the program is wrong").
LIMIT_KINDS = frozenset({"steps-per-tb", "channel", "step-cnt", "tb-connection", "tbs-per-gpu", "xml-elements"})
EXECUTOR, LEGACY = ("executor",), ("legacy",)

# Which of a step's buffer references the executing GPU touches locally, by step type.
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})


def max_steps(target: str) -> int:
    """Steps one threadblock may hold on ``target``."""
    return MAX_STEPS_EXECUTOR if target == "executor" else MAX_STEPS_LEGACY


def runtime_limits(program: MscclProgram, sms: int | None = None) -> list[Finding]:
    """Every limit the program breaks, in program order; ``sms``: the GPU's SM count (None: unknown)."""
    out = nchannels_findings(program) + ngpus_findings(program)
    for gpu in program.gpus:
        out += connection_findings(gpu) + tbs_per_gpu_findings(gpu, sms) + xml_elements_findings(program, gpu)
        limits = buffer_limits(program, gpu)
        for tb in gpu.tbs:
            out += tb_limit_findings(program, gpu, tb)
            for index, step in enumerate(tb.steps):
                where = {"gpu": gpu.id, "tb": tb.id, "step": index, "line": step.line}
                out += step_limit_findings(step, where)
                out += buffer_findings(step, limits, where)
    return out


def nchannels_findings(p: MscclProgram) -> list[Finding]:
    if 1 <= p.nchannels <= MAX_CHANNELS:
        return []
    return [Finding("channel", f"nchannels={p.nchannels} is outside 1..{MAX_CHANNELS}", line=p.line)]


def ngpus_findings(p: MscclProgram) -> list[Finding]:
    """At most :data:`MAX_XML_CHILDREN` GPUs: the loaders keep an algo's ``<gpu>`` elements in an array that size."""
    if p.ngpus <= MAX_XML_CHILDREN:
        return []
    return [Finding("xml-elements", f"ngpus={p.ngpus}; the runtimes' XML reader holds at most {MAX_XML_CHILDREN} "
                    "<gpu> elements in an <algo> (MAX_SUBS; more overwrite its memory)", line=p.line)]


def xml_elements(ngpus: int, tbs: int, steps: int) -> int:
    """The elements a rank's load of the file counts (:data:`MAX_XML_ELEMENTS`): the ``<algo>``, every ``<gpu>``,
    and the rank's own ``tbs`` threadblocks and ``steps`` steps (``nop`` steps too)."""
    return 1 + ngpus + tbs + steps


def gpu_xml_elements(p: MscclProgram, gpu: Gpu) -> int:
    """The elements GPU ``gpu``'s load of program ``p`` counts (:func:`xml_elements`)."""
    return xml_elements(p.ngpus, len(gpu.tbs), sum(len(tb.steps) for tb in gpu.tbs))


def xml_elements_findings(p: MscclProgram, gpu: Gpu) -> list[Finding]:
    """The rank's load of the file holds at most :data:`MAX_XML_ELEMENTS` elements (:func:`xml_elements`)."""
    count = gpu_xml_elements(p, gpu)
    if count <= MAX_XML_ELEMENTS:
        return []
    return [Finding("xml-elements", f"rank {gpu.id} loads {count} XML elements (the <algo>, {p.ngpus} <gpu>, its "
                    f"{len(gpu.tbs)} <tb> and their <step>s); the runtimes' XML reader holds at most "
                    f"{MAX_XML_ELEMENTS} (MAX_NODES = {MAX_XML_ELEMENTS + 1})", gpu=gpu.id, line=gpu.line)]


def connection_findings(gpu: Gpu) -> list[Finding]:
    """One tb per (peer, channel, direction); at most 32 sending and 32 receiving tbs per channel."""
    out = []
    owner: dict[tuple[int, int, str], int] = {}
    per_channel: Counter = Counter()
    for tb in gpu.tbs:
        for direction, peer in (("send", tb.send), ("recv", tb.recv)):
            if peer < 0:
                continue
            per_channel[(tb.chan, direction)] += 1
            key = (peer, tb.chan, direction)
            if key in owner:
                out.append(Finding("tb-connection", f"tbs {owner[key]} and {tb.id} both {direction} "
                                   f"{'to' if direction == 'send' else 'from'} gpu {peer} on channel {tb.chan}; "
                                   "at most one tb per (peer, channel, direction)", gpu=gpu.id, tb=tb.id,
                                   line=tb.line))
            else:
                owner[key] = tb.id
    for (chan, direction), count in sorted(per_channel.items()):
        if count > MAX_TBS_PER_CHANNEL_DIRECTION:
            out.append(Finding("tb-connection", f"{count} tbs {direction} on channel {chan}; at most "
                               f"{MAX_TBS_PER_CHANNEL_DIRECTION}", gpu=gpu.id, line=gpu.line))
    return out


def tbs_per_gpu_findings(gpu: Gpu, sms: int | None) -> list[Finding]:
    """All of a GPU's threadblocks run at once, one per SM (both runtimes launch them as one grid and they wait
    on each other), so a GPU holds at most ``sms`` of them; nothing is checked when ``sms`` is None."""
    if sms is None or len(gpu.tbs) <= sms:
        return []
    return [Finding("tbs-per-gpu", f"{len(gpu.tbs)} threadblocks; all must be co-resident (one per SM) and the "
                    f"GPU has {sms} SMs, so at most {sms}", gpu=gpu.id, line=gpu.line)]


def tb_limit_findings(p: MscclProgram, gpu: Gpu, tb: Threadblock) -> list[Finding]:
    """The tb's channel is one of the program's, and it holds no more steps than the runtime runs."""
    out = []
    where = {"gpu": gpu.id, "tb": tb.id, "line": tb.line}
    if not 0 <= tb.chan < min(p.nchannels, MAX_CHANNELS):
        out.append(Finding("channel", f"chan={tb.chan} is outside 0..{min(p.nchannels, MAX_CHANNELS) - 1} "
                           f"(nchannels={p.nchannels})", **where))
    n = len(tb.steps)
    if n > MAX_STEPS_LEGACY:
        out.append(Finding("steps-per-tb", f"{n} steps; both runtimes allow at most {MAX_STEPS_LEGACY} per tb",
                           **where))
    elif n > MAX_STEPS_EXECUTOR:
        out.append(Finding("steps-per-tb", f"{n} steps; the executor's default build allows {MAX_STEPS_EXECUTOR} "
                           f"per tb (legacy and a rebuilt executor {MAX_STEPS_LEGACY})", runtimes=EXECUTOR, **where))
    return out


def step_limit_findings(step: Step, where: dict) -> list[Finding]:
    """``cnt`` in 1..71 (both loaders skip the check for ``nop``) and ``depid`` in -1 or 0..127."""
    out = []
    if step.type != "nop" and step.type in STEP_TYPES and not 1 <= step.cnt <= MAX_CNT:
        out.append(Finding("step-cnt", f"cnt={step.cnt} is outside 1..{MAX_CNT}", **where))
    if step.depid != -1 and not 0 <= step.depid <= MAX_DEPID:
        out.append(Finding("dependency", f"depid={step.depid} is outside -1 or 0..{MAX_DEPID}", **where))
    return out


def buffer_limits(p: MscclProgram, gpu: Gpu) -> dict:
    """Per buffer: (declared chunks, real chunks or None, offset added, aliased) for the range check.

    Real chunks follow from the collective (:mod:`backends.msccl.conventions`). In-place, ``i`` and ``o`` are
    one buffer; each starts at the collective's in-place offset inside it.
    """
    real = conventions.buffer_chunks(p.collective, p.nchunksperloop, p.ngpus)
    limits = {"i": (gpu.i_chunks, real and _whole(real.input), 0, False),
              "o": (gpu.o_chunks, real and _whole(real.output), 0, False), "s": (gpu.s_chunks, None, 0, False)}
    if p.inplace != 1:
        return limits
    unified_declared = max(gpu.i_chunks, gpu.o_chunks)
    unified_real = None if real is None else _whole(real.size)
    shift_i, shift_o = conventions.inplace_offsets(p.collective, gpu.id, p.nchunksperloop, p.ngpus)
    limits["i"] = (unified_declared, unified_real, _whole(shift_i), True)
    limits["o"] = (unified_declared, unified_real, _whole(shift_o), True)
    return limits


def _whole(value: Fraction) -> Fraction | int:
    """A whole Fraction as an int: the same comparisons, without Fraction arithmetic on every step."""
    return int(value) if value.denominator == 1 else value


def buffer_findings(step: Step, limits: dict, where: dict) -> list[Finding]:
    """Offsets are >= 0 and fit int16; offset+cnt stays inside the buffer the GPU touches.

    Nobody checks this at load time (DESIGN section 7): a file that breaks it reads or writes out of bounds.
    """
    if step.type == "nop" or step.type not in STEP_TYPES:
        return []
    out = []
    for role, buf, off in (("src", step.srcbuf, step.srcoff), ("dst", step.dstbuf, step.dstoff)):
        if not 0 <= off <= INT16_MAX:
            out.append(Finding("step-buffer", f"{role}off={off} is outside 0..{INT16_MAX} (int16)", **where))
            continue
        local = step.type in (READS_SRC if role == "src" else WRITES_DST)
        if not local or buf not in BUFFERS:
            continue
        declared, real, shift, aliased = limits[buf]
        end = shift + off + step.cnt
        if end > declared:
            size = (f"the in-place buffer of {declared} chunks ({buf} starts at chunk {_show(shift)})" if aliased
                    else f"{buf}_chunks={declared}")
            out.append(Finding("step-buffer", f"{role} {buf}[{off}:{off + step.cnt}] is beyond {size}", **where))
        elif real is not None and end > real:
            out.append(Finding("step-buffer", f"{role} {buf}[{off}:{off + step.cnt}] is beyond the real buffer "
                               f"({_show(real)} chunks for this collective and nchunksperloop)", **where))
    return out


def _show(value) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.3g}"
