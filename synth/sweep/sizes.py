"""The alpha-beta frontier over message sizes: the fastest verified algorithm per size, and size ranges for it.

Candidates are :class:`Algorithm` objects (a Schedule with a key): points of the step frontier, alpha-beta
schedules, NCCL-style baselines. Each candidate is verified once by :func:`synth.schedule.replay.verify` (links,
capacity and postcondition re-derived from the transfers; none of that depends on the size) and timed at every
size of a grid by a timer (microseconds): the bundle's is the simulated time of the algorithm's written MSCCL
file (:class:`synth.sweep.bundle.SimulatedTimes`, DESIGN section 6: the simulator is the arbiter), the default
here the replay (:func:`synth.schedule.replay.replay_time`), which every timing also keeps as the plan's own time;
the fastest one the MSCCL runtime would actually run at that size wins. The runtime runs an algorithm only when the element count
of nccl-tests' buffer is a multiple of ``nchunksperloop`` (DESIGN section 7), so an algorithm with 6 chunks per
rank never runs at power-of-two sizes and is never chosen there.

:func:`tile_ranges` turns the per-size winners into inclusive byte ranges ``[min_bytes, max_bytes]`` that cover
the requested range with no gap and no overlap; between two grid sizes with different winners the boundary is
the crossover of their times (bisection on bytes). Sizes are nccl-tests' (DESIGN section 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from synth.text_enum import TextEnum
from synth.errors import InputError
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.replay import replay_time, verify
from synth.schedule.ir import Schedule
from synth.model.topology import Topology
from synth.units import parse_size



class AlgorithmKind(TextEnum):
    """Where a candidate algorithm comes from; the order is the tie-break (synthesized before baselines)."""

    STEPS = "steps"
    ALPHA_BETA = "alphabeta"
    SOLVED = "solved"          # the plan `synth solve` writes at one size (tree packing, compositions, ...)
    BASELINE = "baseline"
    GATHERED = "gathered"      # whole inputs gathered, then summed or picked from (synth.synthesis.gathered)


STEPS, ALPHA_BETA, SOLVED, BASELINE, GATHERED = (AlgorithmKind.STEPS, AlgorithmKind.ALPHA_BETA, AlgorithmKind.SOLVED,
                                                 AlgorithmKind.BASELINE, AlgorithmKind.GATHERED)
_KIND_ORDER = {kind: i for i, kind in enumerate(AlgorithmKind)}
DTYPE_BYTES = 4                                         # nccl-tests' default datatype (float)


@dataclass(frozen=True)
class Algorithm:
    """A candidate: ``key`` is unique and file-name safe, ``label`` is for tables and plots, ``tuned_bytes`` the
    size a size-specific schedule (alpha-beta, a baseline's issue order) was made for."""

    key: str
    kind: AlgorithmKind
    label: str
    schedule: Schedule
    tuned_bytes: int | None = None

    @property
    def nchunksperloop(self) -> int:
        """MSCCL's nchunksperloop for this schedule (chunks in nccl-tests' buffer, or per rank when rooted)."""
        return self.schedule.loop_chunks


@dataclass(frozen=True)
class Timing:
    """One algorithm at one size: its time (us) and algorithm/bus bandwidth (GB/s) at that time, whether the
    MSCCL runtime would run it at this size, and the schedule's replayed time ``plan_us`` (us).

    With a timer other than the replay (the bundle's: simulated), ``timed`` says whether the timer ran: an
    algorithm whose replay is already no faster than a timed one that wins is not timed, and its ``time_us`` is
    its replay (the simulated time is never below it)."""

    key: str
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    runnable: bool
    plan_us: float | None = None
    timed: bool = True


@dataclass(frozen=True)
class SizeChoice:
    """The verdict at one size: every timing, the winner (None: no candidate runs), the fastest baseline the
    runtime runs at this size (None: none does), and the physical limit (us) when :mod:`synth.bounds.physical`
    could compute it."""

    size_bytes: int
    timings: tuple[Timing, ...]
    chosen: str | None
    best_baseline: str | None
    limit_us: float | None

    def timing(self, key: str) -> Timing | None:
        return next((t for t in self.timings if t.key == key), None)


@dataclass(frozen=True)
class SizeRange:
    """Bytes ``min_bytes..max_bytes`` (inclusive) for which the bundle selects algorithm ``key``."""

    key: str
    min_bytes: int
    max_bytes: int


def parse_size_range(text: str) -> tuple[int, int]:
    """``"1KB:1GB"`` -> (1024, 1073741824).

    >>> parse_size_range("1KB:1MB")
    (1024, 1048576)
    """
    lo, sep, hi = str(text).partition(":")
    if not sep:
        raise InputError("--sizes", "", f"cannot read {text!r}; write LOW:HIGH, e.g. 1KB:1GB")
    low, high = parse_size(lo, "--sizes"), parse_size(hi, "--sizes")
    if low > high:
        raise InputError("--sizes", "", f"{lo} is larger than {hi}; write LOW:HIGH")
    return low, high


def size_grid(low: int, high: int, factor: int = 4) -> tuple[int, ...]:
    """``low * factor**k`` up to ``high``, plus ``high`` itself when the grid misses it.

    >>> size_grid(1024, 1 << 20, 4)
    (1024, 4096, 16384, 65536, 262144, 1048576)
    """
    if factor < 2:
        raise InputError("--size-factor", "", "must be at least 2")
    if low < 1:
        raise InputError("--sizes", "", f"the smallest size must be at least 1 byte, got {low}")
    sizes = [low]
    while sizes[-1] * factor <= high:
        sizes.append(sizes[-1] * factor)
    if sizes[-1] != high:
        sizes.append(high)
    return tuple(sizes)


def runnable(algorithm: Algorithm, size_bytes: int, dtype_bytes: int = DTYPE_BYTES) -> bool:
    """Whether MSCCL would run the algorithm at this size (else NCCL silently uses its own)."""
    return size_bytes % dtype_bytes == 0 and (size_bytes // dtype_bytes) % algorithm.nchunksperloop == 0


def replay_us(algorithm: Algorithm, topology: Topology, size_bytes: float) -> float:
    """Alpha-beta replay time (us) only (the schedule's correctness does not depend on the size: see choose)."""
    return replay_time(algorithm.schedule, topology, size_bytes).time_us


Timer = Callable[[Algorithm, Topology, int], float]   # (algorithm, topology, size in bytes) -> time in us


def choose_per_size(algorithms: Iterable[Algorithm], topology: Topology, sizes: Iterable[int],
                    limit_us: Callable[[int], float | None] = lambda size: None,
                    dtype_bytes: int = DTYPE_BYTES, time_us: Timer = replay_us) -> tuple[SizeChoice, ...]:
    """Verify every algorithm once (links, capacity, postcondition: :func:`synth.schedule.replay.verify`, which raises
    VerificationError), time it at every size with ``time_us`` (default: the replay), and pick the fastest
    runnable one per size (ties: steps, alpha-beta, ``synth solve``'s plans, then baselines, then key order).

    Per size, algorithms are timed in order of their replay, and one is left untimed (:attr:`Timing.timed`) when
    its replay is no faster than the best timed runnable algorithm (it cannot win) and, for a runnable baseline,
    than the best timed runnable baseline: the timer (a simulation) is never below the replay."""
    algorithms = sorted(algorithms, key=lambda a: (_KIND_ORDER[a.kind], a.key))
    sizes = list(sizes)
    for alg in algorithms:
        verify(alg.schedule, topology, sizes[0] if sizes else 1 << 20)
    choices = []
    for size in sizes:
        plan = [replay_time(alg.schedule, topology, size).time_us for alg in algorithms]
        timings: list[Timing | None] = [None] * len(algorithms)
        best_run = best_base = float("inf")
        for k in sorted(range(len(algorithms)), key=lambda k: plan[k]):
            alg = algorithms[k]
            can_run = runnable(alg, size, dtype_bytes)
            timed = time_us is replay_us or (can_run and plan[k] < best_run) or (
                alg.kind == BASELINE and can_run and plan[k] < best_base)
            t = (plan[k] if time_us is replay_us else time_us(alg, topology, size)) if timed else plan[k]
            if timed and can_run:
                best_run = min(best_run, t)
            if timed and can_run and alg.kind == BASELINE:
                best_base = min(best_base, t)
            algbw = size / (t * BYTES_PER_US_PER_GBPS) if t > 0 else float("inf")
            timings[k] = Timing(alg.key, t, algbw, algbw * alg.schedule.busbw_factor(), can_run, plan[k],
                                timed)
        ok = [t for t in timings if t.runnable]
        chosen = min(ok, key=lambda t: t.time_us).key if ok else None
        # the comparison is with what the runtime would run at this size: a runnable baseline
        base = [t for t, a in zip(timings, algorithms) if a.kind == BASELINE and t.runnable]
        best_base_key = min(base, key=lambda t: t.time_us).key if base else None
        choices.append(SizeChoice(size, tuple(timings), chosen, best_base_key, limit_us(size)))
    return tuple(choices)


def tile_ranges(choices: tuple[SizeChoice, ...], algorithms: Iterable[Algorithm], topology: Topology,
                low: int, high: int, time_us: Timer = replay_us) -> tuple[SizeRange, ...]:
    """Inclusive byte ranges, one per run of equal winners, covering ``low..high`` exactly.

    Sizes whose grid point has no winner belong to no range (NCCL's own algorithm runs there).
    """
    by_key = {a.key: a for a in algorithms}
    ranges: list[SizeRange] = []
    prev: SizeChoice | None = None
    for choice in choices:
        if prev is None:
            start = low
        elif choice.chosen == prev.chosen:
            prev = choice
            continue
        else:
            start = _crossover(by_key.get(prev.chosen), by_key.get(choice.chosen), topology,
                               prev.size_bytes, choice.size_bytes, time_us)
            if ranges and ranges[-1].key == prev.chosen:
                ranges[-1] = SizeRange(prev.chosen, ranges[-1].min_bytes, start - 1)
        if choice.chosen is not None:
            ranges.append(SizeRange(choice.chosen, start, high))
        prev = choice
    return tuple(r for r in ranges if r.min_bytes <= r.max_bytes)


def _crossover(left: Algorithm | None, right: Algorithm | None, topology: Topology, lo: int, hi: int,
               time_us: Timer) -> int:
    """The smallest size in (lo, hi] from which ``right`` is at least as fast as ``left`` (bisection on bytes);
    ``hi`` when either side is no algorithm."""
    if left is None or right is None:
        return hi
    a, b = lo, hi      # invariant: left faster at a, right at least as fast at b
    while b - a > 1:
        mid = (a + b) // 2
        if time_us(right, topology, mid) <= time_us(left, topology, mid):
            b = mid
        else:
            a = mid
    return b
