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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from synth.model.collectives import Collective, collective_from_spec
from synth.errors import InputError
from synth.fileio import read_json

COPY = "copy"
REDUCE = "reduce"
SCHEDULE_FORMAT = "synth-schedule/1"


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

    @property
    def num_ranks(self) -> int:
        return self.collective.num_ranks

    def ordered(self) -> list[Transfer]:
        """Transfers in issue order: by step, then start time, then chunk."""
        return sorted(self.transfers, key=_order_key)

    def to_dict(self) -> dict:
        return {"format": SCHEDULE_FORMAT, "collective": self.collective.spec(), "topology": self.topology,
                "steps": self.steps, "rounds": self.rounds,
                "rounds_per_step": list(self.rounds_per_step) if self.rounds_per_step else None, "method": self.method, "inplace": self.inplace,
                "notes": self.notes, "transfers": [asdict(t) for t in self.ordered()]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _order_key(t: Transfer):
    return (t.step, t.start_us if t.start_us is not None else 0.0, t.chunk, t.src, t.dst)


def schedule_from_dict(raw: dict, source: str = "<memory>") -> Schedule:
    """Inverse of :meth:`Schedule.to_dict`; raises InputError on malformed input."""
    if not isinstance(raw, dict) or raw.get("format") != SCHEDULE_FORMAT:
        raise InputError(source, "format", f"not a schedule file (expected format {SCHEDULE_FORMAT!r})")
    try:
        collective = collective_from_spec(raw["collective"])
        transfers = tuple(Transfer(**t) for t in raw["transfers"])
        rps = raw.get("rounds_per_step")
        return Schedule(collective, str(raw["topology"]), transfers, int(raw["steps"]), raw.get("rounds"),
                        tuple(int(r) for r in rps) if rps else None, str(raw.get("method", "steps")),
                        bool(raw.get("inplace", False)), dict(raw.get("notes", {})))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(source, "transfers", f"malformed schedule ({exc})") from None


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
    by_id = {c.id: c for c in coll.chunks}
    touched = sorted({(t.dst, t.chunk) for t in schedule.transfers} | {(t.src, t.chunk) for t in schedule.transfers})
    for rank, cid in touched:
        chunk = by_id[cid]
        out = chunk.output_index(rank)
        inp = chunk.input_index(rank)
        if out is not None:
            slot[(rank, cid)] = ("o", out)
        elif inp is not None and not coll.combining:
            slot[(rank, cid)] = ("i", inp)
        elif inp is not None and not any(t.dst == rank and t.chunk == cid for t in schedule.transfers):
            slot[(rank, cid)] = ("i", inp)
        else:
            slot[(rank, cid)] = ("s", scratch[rank])
            scratch[rank] += 1
    return BufferLayout(slot, tuple(scratch))
