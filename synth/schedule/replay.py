"""Replay check: re-derive a Schedule's correctness and alpha-beta time from its transfers alone.

The solver's objective is never trusted: every ``synth solve`` replays the decoded schedule here before any
output is written. Data is tracked exactly as multisets of input contributions ``(rank, input index)``, so a
contribution that is reduced twice or never arrives is caught, not just a wrong value.

Step semantics (SCCL): all transfers of step ``s`` read what their source held at the start of step ``s``.
Timing (DESIGN section 4): a transfer starts when its source holds the chunk and its link and switch ports are
free (links serialise in step order), and arrives ``alpha + bytes / bandwidth`` later.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from synth.model.collectives import Collective
from synth.schedule.costmodel import LinkClock, algbw_GBps
from synth.errors import VerificationError
from synth.schedule.ir import REDUCE, Schedule
from synth.model.topology import Topology


@dataclass(frozen=True)
class ReplayReport:
    """Outcome of a replay: time in microseconds, bandwidths in GB/s."""

    time_us: float
    size_bytes: int
    algbw_GBps: float
    busbw_GBps: float
    num_transfers: int
    max_link_utilisation: float  # busiest link's busy time / makespan
    alpha_occupies: bool = False


def check_links(schedule: Schedule, topology: Topology) -> list[str]:
    """Problems with links and per-step capacity (lanes x rounds of the step; switch ports once per round)."""
    problems = []
    if schedule.num_ranks != topology.num_ranks:
        return [f"schedule is for {schedule.num_ranks} ranks but topology {topology.name} has {topology.num_ranks}"]
    links: dict[tuple[int, int], object] = {}     # (src, dst) -> link, looked up once per pair
    missing = object()
    for t in schedule.transfers:
        pair = (t.src, t.dst)
        if links.get(pair, missing) is missing:
            links[pair] = topology.link(t.src, t.dst)
        if links[pair] is None:
            problems.append(f"chunk {t.chunk} sent {t.src}->{t.dst} at step {t.step}, but there is no such link")
    if schedule.rounds_per_step is None:
        return problems
    load = Counter()
    port_load = Counter()
    for t in schedule.transfers:
        link = links[(t.src, t.dst)]
        if link is None:
            continue
        load[(t.src, t.dst, t.step)] += 1
        for port in link.ports:
            port_load[(port, t.step)] += 1
    rounds = schedule.rounds_per_step
    for (src, dst, step), count in sorted(load.items()):
        cap = topology.link(src, dst).lanes * (rounds[step] if step < len(rounds) else 0)
        if count > cap:
            problems.append(f"link {src}->{dst} carries {count} chunks in step {step}, capacity {cap}")
    for ((switch, port, direction), step), count in sorted(port_load.items()):
        cap = rounds[step] if step < len(rounds) else 0
        if count > cap:
            problems.append(f"switch {switch} port {port} {direction} carries {count} chunks in step {step}, "
                            f"capacity {cap}")
    return problems


def replay_data(schedule: Schedule) -> list[str]:
    """Replay the transfers on multisets; return every postcondition violation (empty when correct).

    A multiset is a dict of positive counts; it is never changed once made (a reduction makes a new one), so a
    copy shares it."""
    coll: Collective = schedule.collective
    state: dict[tuple[int, int], dict] = {}
    for c in coll.chunks:
        for rank, idx in c.initial:
            state[(rank, c.id)] = {(rank, idx): 1}
    problems = []
    by_step = defaultdict(list)
    for t in schedule.transfers:
        if not (0 <= t.src < coll.num_ranks and 0 <= t.dst < coll.num_ranks and 0 <= t.chunk < len(coll.chunks)):
            problems.append(f"transfer {t} names an unknown rank or chunk")
            continue
        by_step[t.step].append(t)
    for step in sorted(by_step):
        moves = []      # (transfer, what its source holds at the start of the step)
        for t in by_step[step]:
            held = state.get((t.src, t.chunk))
            if not held:
                problems.append(f"step {step}: rank {t.src} sends chunk {t.chunk} to {t.dst} before holding it")
                continue
            moves.append((t, held))
        for t, sent in moves:
            key = (t.dst, t.chunk)
            held = state.get(key)
            if t.op == REDUCE and held is not None:
                state[key] = add_multisets(held, sent)
            else:
                state[key] = sent
    for c in coll.chunks:
        want = dict(c.expected)
        for rank, _ in c.destinations:
            got = state.get((rank, c.id), {})
            if got != want:
                problems.append(_describe_mismatch(rank, c.id, Counter(got), Counter(want)))
    return problems


def add_multisets(a: dict, b: dict) -> dict:
    """The sum of two multisets of contributions held as plain dicts of positive counts (much faster than
    Counter's ``+``): a copy of the larger (in C) with the smaller added in, so a growing partial sum plus one
    local chunk costs O(1) Python work. Neither argument is changed."""
    if len(a) < len(b):
        a, b = b, a
    out = dict(a)
    for contribution, count in b.items():
        out[contribution] = out.get(contribution, 0) + count
    return out


def _describe_mismatch(rank: int, chunk: int, got: Counter, want: Counter) -> str:
    if not got:
        return f"rank {rank} never receives chunk {chunk}"
    extra = got - want
    missing = want - got
    parts = []
    if missing:
        parts.append(f"missing contributions {sorted(missing)}")
    if extra:
        parts.append(f"contributions counted too often {sorted(extra)}")
    return f"rank {rank} chunk {chunk}: " + "; ".join(parts)


def replay_time(schedule: Schedule, topology: Topology, size_bytes: int, reduce_us_per_byte: float = 0.0,
                alpha_occupies: bool = False) -> ReplayReport:
    """Alpha-beta time of the schedule at ``size_bytes`` (nccl-tests' per-rank buffer size)."""
    nbytes = schedule.chunk_bytes(size_bytes)
    clock = LinkClock(topology, alpha_occupies)
    ready: dict[tuple[int, int], float] = defaultdict(float)
    by_step = defaultdict(list)
    for t in schedule.ordered():
        by_step[t.step].append(t)
    end = 0.0
    link_of: dict[tuple[int, int], int] = {}     # looked up once per pair (composed machines search for it)
    for step in sorted(by_step):
        arrivals = []
        for t in by_step[step]:
            pair = (t.src, t.dst)
            link_index = link_of.get(pair)
            if link_index is None:
                link_index = link_of[pair] = topology.link_index[pair]
            res = clock.reserve(link_index, ready[(t.src, t.chunk)], nbytes)
            arrive = res.arrival_us + (nbytes * reduce_us_per_byte if t.op == REDUCE else 0.0)
            arrivals.append(((t.dst, t.chunk), arrive))
        for key, arrive in arrivals:
            ready[key] = max(ready[key], arrive)
            end = max(end, arrive)
    algbw = algbw_GBps(size_bytes, end)
    util = max(clock.busy_us) / end if end > 0 and clock.busy_us else 0.0
    return ReplayReport(end, size_bytes, algbw, algbw * schedule.busbw_factor(), len(schedule.transfers), util,
                        alpha_occupies)


def verify(schedule: Schedule, topology: Topology, size_bytes: int, reduce_us_per_byte: float = 0.0,
           alpha_occupies: bool = False) -> ReplayReport:
    """Check links, capacity and postcondition, then time the schedule (:func:`replay_time`); raise
    VerificationError if wrong."""
    problems = check_links(schedule, topology)
    problems += replay_data(schedule)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise VerificationError(f"schedule fails the replay check: {shown}")
    return replay_time(schedule, topology, size_bytes, reduce_us_per_byte, alpha_occupies)
