"""Typed MSCCL program: the in-memory form of an MSCCL XML algorithm file (DESIGN section 7).

The emitter lowers a Schedule into a :class:`MscclProgram` and renders it; the parser reads XML into the same
classes; the executor, linter and simulator run them. Field names follow the XML attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

# Step types and what each does: (receives, sends, reduces, writes dst locally)
STEP_TYPES = {
    "s": (False, True, False, False),
    "r": (True, False, False, True),
    "rcs": (True, True, False, True),
    "rrs": (True, True, True, False),
    "rrc": (True, False, True, True),
    "rrcs": (True, True, True, True),
    "cpy": (False, False, False, True),
    "re": (False, False, True, True),
    "nop": (False, False, False, False),
}
BUFFERS = ("i", "o", "s")
PROTOCOLS = ("Simple", "LL", "LL128")
# Spelling of the reduce-scatter collective per runtime target.
COLL_SPELLING = {"executor": "reducescatter", "legacy": "reduce_scatter"}
# Collectives the legacy loader refuses ("MSCCL: collective type gather is not supported").
LEGACY_UNKNOWN_COLLECTIVES = ("gather", "scatter")

# Characters an algorithm name written by synth may hold: no quote, angle bracket, ampersand or line break can
# reach the runtimes' lexers, which decode no XML escapes (see :func:`safe_name`).
NAME_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.,:=+()")
# Longest attribute value the runtimes' lexers read (DESIGN section 7); the other limits: backends.msccl.limits.
MAX_ATTR_LEN = 254


@dataclass(frozen=True)
class Step:
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int = -1
    deps: int = -1
    hasdep: int = 0
    line: int = 0  # source line when parsed, 0 when generated

    def __init__(self, s: int, type: str, srcbuf: str, srcoff: int, dstbuf: str, dstoff: int, cnt: int,
                 depid: int = -1, deps: int = -1, hasdep: int = 0, line: int = 0):
        # every field at once: the generated __init__ of a frozen dataclass sets them one by one through
        # object.__setattr__, at twice the cost, and a program holds tens of thousands of steps, each made by the
        # lowering and again by the parser (a test keeps this signature equal to the fields)
        object.__setattr__(self, "__dict__", {"s": s, "type": type, "srcbuf": srcbuf, "srcoff": srcoff,
                                              "dstbuf": dstbuf, "dstoff": dstoff, "cnt": cnt, "depid": depid,
                                              "deps": deps, "hasdep": hasdep, "line": line})


@dataclass(frozen=True)
class Threadblock:
    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[Step, ...]
    line: int = 0


@dataclass(frozen=True)
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[Threadblock, ...]
    line: int = 0


@dataclass(frozen=True)
class MscclProgram:
    """One ``<algo>`` document. ``min_bytes``/``max_bytes``/``outofplace`` are None when the file lacks them."""

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: int
    outofplace: int | None
    min_bytes: int | None
    max_bytes: int | None
    gpus: tuple[Gpu, ...]
    line: int = 0

    @property
    def num_steps(self) -> int:
        """Steps of every threadblock of every GPU (``nop`` steps too)."""
        return sum(len(tb.steps) for gpu in self.gpus for tb in gpu.tbs)

    @property
    def collective(self) -> str:
        """The collective in our spelling (``reducescatter`` for both runtimes' spellings)."""
        return "reducescatter" if self.coll in ("reduce_scatter", "reducescatter") else self.coll


def safe_name(text: str) -> str:
    """``text`` with every character outside :data:`NAME_ALPHABET` replaced by ``_``, cut to fit a value.

    >>> safe_name('synth_allgather_box" evil="1')
    'synth_allgather_box__evil=_1'
    """
    return "".join(ch if ch in NAME_ALPHABET else "_" for ch in text)[:MAX_ATTR_LEN]
