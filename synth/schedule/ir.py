"""Schedule IR: which chunk moves over which link, when, and whether it is copied or reduced.

A :class:`Schedule` is what every formulation decodes into and what the replay check, the simulator and the
backends read. Transfers carry a ``step`` (the order in which a rank issues them; step formulations use the
SCCL step, time-based formulations an order index) and, when known, ``start_us``/``end_us``.

The buffer layout (where each chunk lives on each rank) follows from the collective: a chunk a rank must output
lives at its output index, a chunk it only contributes lives at its input index, anything else it relays lives in
scratch (see :func:`buffer_layout`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from synth.model.collectives import COLLECTIVES, ROOTED, Collective, busbw_factor, make_collective
from synth.model.topology import MAX_RANKS, Topology
from synth.errors import InputError, shown
from synth.fileio import read_json

COPY = "copy"
REDUCE = "reduce"
SCHEDULE_FORMAT = "synth-schedule/1"
# What a gathered schedule (Schedule.gathered) computes from the whole inputs it gathers
GATHERED_SUM = "allreduce"          # each rank adds the n inputs
GATHERED_PICK = "alltoall"          # each rank copies out its block of each input
GATHERED_KINDS = (GATHERED_SUM, GATHERED_PICK)


@dataclass(frozen=True)
class Transfer:
    """One chunk moving from ``src`` to ``dst`` over the link ``(src, dst)``.

    ``op`` is ``copy`` (dst's copy becomes src's) or ``reduce`` (dst adds src's partial sum to its own).
    """

    chunk: int
    src: int
    dst: int
    step: int
    op: str = COPY
    start_us: float | None = None
    end_us: float | None = None

    def __init__(self, chunk: int, src: int, dst: int, step: int, op: str = COPY, start_us: float | None = None,
                 end_us: float | None = None):
        # every field at once: the generated __init__ of a frozen dataclass sets them one by one through
        # object.__setattr__, at twice the cost, and a schedule holds tens of thousands of transfers (a test keeps
        # this signature equal to the fields)
        object.__setattr__(self, "__dict__", {"chunk": chunk, "src": src, "dst": dst, "step": step, "op": op,
                                              "start_us": start_us, "end_us": end_us})


@dataclass(frozen=True)
class Schedule:
    """A complete algorithm for one collective on one topology."""

    collective: Collective
    topology: str
    transfers: tuple[Transfer, ...]
    steps: int
    rounds: int | None = None
    rounds_per_step: tuple[int, ...] | None = None
    method: str = "steps"
    inplace: bool = False
    notes: dict = field(default_factory=dict, compare=False)
    gathered: str = ""

    def __post_init__(self):
        if isinstance(self.gathered, bool):      # True: the gathered Allreduce, as before there were two kinds
            object.__setattr__(self, "gathered", GATHERED_SUM if self.gathered else "")
        if self.gathered not in ("",) + GATHERED_KINDS:
            raise ValueError(f"gathered is {' or '.join(GATHERED_KINDS)} or empty, not {self.gathered!r}")
        if self.gathered and self.collective.name != "allgather":
            raise ValueError(f"a gathered schedule moves an Allgather of whole inputs, not {self.collective.name}")

    @property
    def num_ranks(self) -> int:
        return self.collective.num_ranks

    # A gathered schedule (``gathered``: the collective it computes) moves an Allgather of every rank's whole
    # input, its ``collective`` (C chunks per rank), and each rank then combines the n inputs locally
    # (backends.msccl.gathered): an Allreduce adds them into its output, an Alltoall copies out its block of each.
    # Relays forward whole inputs untouched, which partial sums cannot do, so it crosses the machine once (ring-8
    # Allreduce: 4 hops, where reduce-then-broadcast takes 8; ndv2 x4 Alltoall: one message per link and step
    # where per-pair chunks queue at its FIFOs), at n times the bytes. The members below describe what the
    # schedule computes: use them, not ``collective``'s, for sizes, names and selection.

    @property
    def computes(self) -> str:
        """The collective the schedule computes: ``gathered``'s for a gathered one, else its collective's name."""
        return self.gathered or self.collective.name

    @property
    def loop_chunks(self) -> int:
        """MSCCL's ``nchunksperloop`` of the file: a gathered Allreduce's buffer is one rank's input, C chunks; a
        gathered Alltoall's is n blocks of C (each Allgather chunk, 1/C of an input, is n of its chunks)."""
        if self.gathered == GATHERED_PICK:
            return self.num_ranks * self.collective.chunks_per_rank
        return self.collective.chunks_per_rank if self.gathered else self.collective.loop_chunks

    @property
    def runs_at_power_of_two_sizes(self) -> bool:
        """Whether the runtimes select the file at power-of-two sizes (a power-of-two :attr:`loop_chunks`)."""
        return self.loop_chunks & (self.loop_chunks - 1) == 0

    def chunk_bytes(self, size_bytes: float) -> float:
        """Bytes one transfer moves at nccl-tests' ``size_bytes`` of what the schedule computes: a gathered
        schedule's transfers carry 1/C of a rank's whole input."""
        return size_bytes / self.collective.chunks_per_rank if self.gathered else \
            self.collective.chunk_bytes(size_bytes)

    def moved_size(self, size_bytes: float) -> float:
        """nccl-tests' size of the collective the transfers move, with chunks of :meth:`chunk_bytes`: a gathered
        schedule of ``size_bytes`` moves the Allgather of n times that."""
        return size_bytes * self.num_ranks if self.gathered else size_bytes

    def busbw_factor(self) -> float:
        """nccl-tests' bus-bandwidth factor of what the schedule computes."""
        return busbw_factor(self.computes, self.num_ranks)

    def ordered(self) -> list[Transfer]:
        """Transfers in issue order: by step, then start time, then chunk."""
        return sorted(self.transfers, key=_order_key)

    def to_dict(self) -> dict:
        return {"format": SCHEDULE_FORMAT, "collective": self.collective.spec(), "topology": self.topology,
                "steps": self.steps, "rounds": self.rounds,
                "rounds_per_step": list(self.rounds_per_step) if self.rounds_per_step else None, "method": self.method, "inplace": self.inplace,
                "gathered": self.gathered, "notes": self.notes, "transfers": [asdict(t) for t in self.ordered()]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _order_key(t: Transfer):
    return (t.step, t.start_us if t.start_us is not None else 0.0, t.chunk, t.src, t.dst)


# The largest collective a schedule file may describe: its tables are built before any other check, at about
# 10 us per chunk and 0.4 us per (chunk, rank) entry, so both are bounded: allgather on 1024 ranks (1024 chunks,
# 1M entries) and alltoall on 256 ranks (65536 chunks) build in well under a second; 10**9 ranks or chunks, or
# alltoall on 1024 ranks (10 s), are refused at once.
MAX_COLLECTIVE_CHUNKS = 1 << 16
MAX_COLLECTIVE_CELLS = 1 << 21
MAX_SCHEDULE_CHUNKS_PER_RANK = 1 << 16
MAX_SCHEDULE_STEPS = 1 << 24          # more steps than a 16 MB file can hold transfers
_PER_RANK_CHUNKS = ("allgather", "reducescatter", "allreduce", "gather", "scatter")
_WIDE = ("allgather", "reducescatter", "broadcast", "reduce")   # each chunk names every rank once


def collective_size(name: str, num_ranks: int, chunks_per_rank: int) -> tuple[int, int]:
    """``(chunks, entries)``: how many chunks the collective has and how many (chunk, rank) entries its tables
    hold, computed without building them.

    >>> collective_size("allgather", 4, 1), collective_size("alltoall", 4, 1)
    ((4, 20), (16, 32))
    """
    n, c = num_ranks, chunks_per_rank
    chunks = n * n * c if name == "alltoall" else n * c if name in _PER_RANK_CHUNKS else c
    width = 2 * n if name == "allreduce" else n if name in _WIDE else 1
    return chunks, chunks * (width + 1)


def _count(value, source: str, where: str, low: int, high: int) -> int:
    """An integer JSON value (never a bool, a float or a string) in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(source, where, f"must be an integer in {low}..{high}, got {shown(value)}")
    return value


def _time(value, source: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(source, where, f"must be a finite time in us >= 0 (or null), got {shown(value)}")
    return float(value)


def _collective(raw, source: str) -> Collective:
    """Check the collective spec (name, sizes bounded before any table is built, root) and build it."""
    if not isinstance(raw, dict):
        raise InputError(source, "collective", "must be an object {name, num_ranks, chunks_per_rank, root}")
    extra = sorted(set(raw) - {"name", "num_ranks", "chunks_per_rank", "root"})
    if extra:
        raise InputError(source, f"collective.{extra[0]}", "unknown field; use name, num_ranks, chunks_per_rank, "
                         "root")
    name = raw.get("name")
    if not isinstance(name, str) or name.strip().lower() not in COLLECTIVES:
        raise InputError(source, "collective.name", f"unknown collective {shown(name)}; use one of "
                         f"{', '.join(COLLECTIVES)}")
    name = name.strip().lower()
    n = _count(raw.get("num_ranks"), source, "collective.num_ranks", 2, MAX_RANKS)
    c = _count(raw.get("chunks_per_rank", 1), source, "collective.chunks_per_rank", 1, MAX_SCHEDULE_CHUNKS_PER_RANK)
    chunks, cells = collective_size(name, n, c)
    if chunks > MAX_COLLECTIVE_CHUNKS or cells > MAX_COLLECTIVE_CELLS:
        raise InputError(source, "collective", f"{name} on {n} ranks with {c} chunk(s) per rank has {chunks} "
                         f"chunks and {cells} table entries, more than the {MAX_COLLECTIVE_CHUNKS} and "
                         f"{MAX_COLLECTIVE_CELLS} a schedule file may describe")
    root = raw.get("root")
    if name in ROOTED:
        root = _count(0 if root is None else root, source, "collective.root", 0, n - 1)
    elif root is not None:
        raise InputError(source, "collective.root", f"{name} has no root; give null")
    return make_collective(name, n, c, root)


def _transfers(raw, collective: Collective, source: str) -> tuple[Transfer, ...]:
    if not isinstance(raw, list):
        raise InputError(source, "transfers", "must be a list of transfer objects")
    n, chunks = collective.num_ranks, len(collective.chunks)
    fields = {"chunk", "src", "dst", "step", "op", "start_us", "end_us"}
    out, seen = [], set()
    for k, item in enumerate(raw):
        where = f"transfers[{k}]"
        if not isinstance(item, dict):
            raise InputError(source, where, "must be an object {chunk, src, dst, step, op, start_us, end_us}")
        extra = sorted(set(item) - fields)
        if extra:
            raise InputError(source, f"{where}.{extra[0]}", f"unknown field; use {', '.join(sorted(fields))}")
        missing = sorted({"chunk", "src", "dst", "step"} - set(item))
        if missing:
            raise InputError(source, f"{where}.{missing[0]}", "is missing")
        chunk = _count(item["chunk"], source, f"{where}.chunk", 0, chunks - 1)
        src = _count(item["src"], source, f"{where}.src", 0, n - 1)
        dst = _count(item["dst"], source, f"{where}.dst", 0, n - 1)
        if src == dst:
            raise InputError(source, where, f"sends chunk {chunk} from rank {src} to itself")
        step = _count(item["step"], source, f"{where}.step", 0, MAX_SCHEDULE_STEPS)
        op = item.get("op", COPY)
        if op not in (COPY, REDUCE):
            raise InputError(source, f"{where}.op", f"unknown op {shown(op)}; use copy or reduce")
        start = _time(item.get("start_us"), source, f"{where}.start_us")
        end = _time(item.get("end_us"), source, f"{where}.end_us")
        if start is not None and end is not None and end < start:
            raise InputError(source, f"{where}.end_us", f"{end} is before start_us {start}")
        key = (chunk, src, dst, step)
        if key in seen:
            raise InputError(source, where, f"repeats chunk {chunk} {src}->{dst} at step {step}; give each "
                             "transfer once")
        seen.add(key)
        out.append(Transfer(chunk, src, dst, step, op, start, end))
    return tuple(out)


def schedule_from_dict(raw: dict, source: str = "<memory>") -> Schedule:
    """Inverse of :meth:`Schedule.to_dict`, checking every field before any work (raises InputError).

    Sizes are bounded before the collective's tables are built (:data:`MAX_COLLECTIVE_CELLS`); ids are in
    range, ``op`` is copy or reduce, times are finite and non-negative, and no transfer is given twice.
    """
    if not isinstance(raw, dict) or raw.get("format") != SCHEDULE_FORMAT:
        raise InputError(source, "format", f"not a schedule file (expected format {SCHEDULE_FORMAT!r})")
    known = {"format", "collective", "topology", "steps", "rounds", "rounds_per_step", "method", "inplace",
             "gathered", "notes", "transfers"}
    extra = sorted(set(raw) - known)
    if extra:
        raise InputError(source, extra[0], f"unknown field; schedule fields are {', '.join(sorted(known))}")
    for key in ("transfers", "collective", "topology", "steps"):
        if key not in raw:
            raise InputError(source, key, "is missing")
    collective = _collective(raw["collective"], source)
    topology = raw["topology"]
    if not isinstance(topology, str):
        raise InputError(source, "topology", f"must be a topology name (a string), got {shown(topology)}")
    steps = _count(raw["steps"], source, "steps", 1, MAX_SCHEDULE_STEPS)
    rounds = raw.get("rounds")
    if rounds is not None:
        rounds = _count(rounds, source, "rounds", 1, MAX_SCHEDULE_STEPS)
    rps = raw.get("rounds_per_step")
    if rps is not None:
        if not isinstance(rps, list) or len(rps) > MAX_SCHEDULE_STEPS:
            raise InputError(source, "rounds_per_step", "must be a list of integers (or null)")
        rps = tuple(_count(r, source, f"rounds_per_step[{k}]", 0, MAX_SCHEDULE_STEPS) for k, r in enumerate(rps))
    method = raw.get("method", "steps")
    if not isinstance(method, str):
        raise InputError(source, "method", f"must be a string, got {shown(method)}")
    inplace = raw.get("inplace", False)
    if not isinstance(inplace, bool):
        raise InputError(source, "inplace", f"must be true or false, got {shown(inplace)}")
    gathered = raw.get("gathered", "")
    if isinstance(gathered, bool):      # files written before the gathered Alltoall: true is the Allreduce
        gathered = GATHERED_SUM if gathered else ""
    if gathered not in ("",) + GATHERED_KINDS:
        raise InputError(source, "gathered", f"must be {' or '.join(GATHERED_KINDS)} or empty (true or false in "
                         f"older files), got {shown(gathered)}")
    if gathered and collective.name != "allgather":
        raise InputError(source, "gathered", f"a gathered {gathered} moves an Allgather of whole inputs: give "
                         f"collective.name allgather, not {collective.name}")
    notes = raw.get("notes") or {}
    if not isinstance(notes, dict):
        raise InputError(source, "notes", "must be an object")
    transfers = _transfers(raw["transfers"], collective, source)
    return Schedule(collective, topology, transfers, steps, rounds, rps or None, method, inplace, notes, gathered)


def check_schedule_fits(schedule: Schedule, topology: Topology, source: str) -> None:
    """Refuse, before lowering or simulating, a schedule for another rank count or over a missing link."""
    if schedule.num_ranks != topology.num_ranks:
        raise InputError(source, "collective.num_ranks", f"the schedule is for {schedule.num_ranks} ranks but "
                         f"topology {topology.name} has {topology.num_ranks}; give the topology it was made for")
    for k, t in enumerate(schedule.transfers):
        if (t.src, t.dst) not in topology.link_index:
            raise InputError(source, f"transfers[{k}]", f"sends {t.src}->{t.dst}, but topology {topology.name} "
                             "has no such link; give the topology it was made for")


def load_schedule(path: str | Path) -> Schedule:
    """Read a schedule JSON file (:func:`synth.fileio.read_json`'s limits) into a :class:`Schedule`."""
    return schedule_from_dict(read_json(path, "schedule"), str(path))


@dataclass(frozen=True)
class BufferLayout:
    """Where every (rank, chunk) lives: ``slot[(rank, chunk)] = (buffer, index)`` with buffer in i/o/s."""

    slot: dict
    scratch_chunks: tuple[int, ...]  # per rank


def buffer_layout(schedule: Schedule) -> BufferLayout:
    """Place each chunk a rank touches: output index if it must end there, else input index, else scratch.

    Combining collectives accumulate partial sums in the output slot (or scratch), never in the input buffer,
    so the user's input is not modified.
    """
    coll = schedule.collective
    slot = {}
    scratch = [0] * coll.num_ranks
    outputs = {c.id: dict(c.destinations) for c in coll.chunks}   # one dict per chunk, not one per lookup
    inputs = {c.id: dict(c.initial) for c in coll.chunks}
    received = {(t.dst, t.chunk) for t in schedule.transfers}
    touched = sorted(received | {(t.src, t.chunk) for t in schedule.transfers})
    for rank, cid in touched:
        out = outputs[cid].get(rank)
        inp = inputs[cid].get(rank)
        if out is not None:
            slot[(rank, cid)] = ("o", out)
        elif inp is not None and not coll.combining:
            slot[(rank, cid)] = ("i", inp)
        elif inp is not None and (rank, cid) not in received:
            slot[(rank, cid)] = ("i", inp)
        else:
            slot[(rank, cid)] = ("s", scratch[rank])
            scratch[rank] += 1
    return BufferLayout(slot, tuple(scratch))
