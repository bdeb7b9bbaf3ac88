"""Discrete-event timing of an MSCCL program on a topology (DESIGN section 4 cost model, section 7 semantics).

Every transfer goes through :class:`synth.schedule.costmodel.LinkClock`, the same alpha-beta link and switch-port model
the replay check uses, so a program and the schedule it came from are timed alike. Gpu id = rank.

What takes time, and why
------------------------
- A message of ``cnt`` chunks carries ``cnt * size_bytes / nchunksperloop`` bytes (nccl-tests' "size": the
  per-rank buffer, DESIGN section 4). It is booked on the link (and the switch ports it crosses) when its
  step is ready; links and ports serialise their bandwidth use in booking order, which is time order here
  because events are processed by time. Latency overlaps unless ``alpha_occupies`` (TACCL's convention).
- A threadblock executes one step at a time. A send occupies its tb until its bytes are on the link (the
  reservation's ``busy_until_us``); a receive completes when the message has arrived; a step that receives
  and sends forwards the data once it has fully arrived (store-and-forward per message).
- Reductions (``rrs``, ``rrc``, ``rrcs``, ``re``) add ``reduce_us_per_byte`` per reduced byte at the
  reducing rank. ``cpy`` and ``nop`` take no time (a local copy runs at memory bandwidth, far above links).
- A dependency is met when tb ``depid`` completes its first ``hasdep`` step ``>= deps``; a send waits while
  the connection holds the runtime's FIFO depth of untaken messages (2 for Simple, 8 for LL/LL128); a
  message is taken when the receiving step completes its receive.

The simulator does not judge correctness (that is :func:`backends.msccl.interpret.execute_program`), but a program
that deadlocks cannot be timed and raises :class:`~synth.errors.VerificationError`.
"""

from __future__ import annotations

import bisect
import heapq
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from backends.msccl import conventions
from backends.msccl.ir import STEP_TYPES, MscclProgram

from synth.model.collectives import make_collective
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS, LinkClock
from synth.errors import InputError, SynthError, VerificationError
from synth.fileio import write_atomic
from backends.msccl.interpret import ProgramIndex, index_program, runtime_fifo_depth
from synth.model.topology import Topology

UNBOUNDED_FIFO = 1 << 30  # a connection depth no program reaches: sends never wait for the receiver


@dataclass(frozen=True)
class TraceEvent:
    """One interval on one track: a step on a rank's tb (``track='tb'``) or a transfer on a link."""

    name: str
    track: str            # 'tb' or 'link'
    pid: int              # rank for tb tracks; num_ranks for the links process
    tid: int              # tb id, or link index
    start_us: float
    dur_us: float
    args: dict = field(default_factory=dict, compare=False)


class TraceEvents(Sequence):
    """The trace events of one run, in the order they happened, built on first use.

    Most callers (the verified writer, candidate selection) want only the time; formatting one named event
    per step and per transfer was a third of the simulation. Reads, compares, hashes and pickles as the
    tuple of :class:`TraceEvent` it stands for.
    """

    def __init__(self, records: list, tbs: tuple, topology: Topology):
        self._records = records     # ("tb", t, step k, start, dur) / ("link", t, k, link, start, dur, bytes, arrival)
        self._tbs = tbs
        self._topology = topology
        self._events: tuple[TraceEvent, ...] | None = None

    def _all(self) -> tuple[TraceEvent, ...]:
        if self._events is None:
            self._events = tuple(self._build())
            self._records = self._tbs = self._topology = None
        return self._events

    def _build(self):
        num_ranks, links = self._topology.num_ranks, self._topology.links
        for record in self._records:
            tb = self._tbs[record[1]]
            k = record[2]
            if record[0] == "tb":
                step = tb.steps[k]
                yield TraceEvent(f"{step.type} {step.srcbuf}[{step.srcoff}]->{step.dstbuf}[{step.dstoff}] "
                                 f"x{step.cnt}", "tb", tb.gpu, tb.id, record[3], record[4], {"step": k})
            else:
                _, _, _, link, start, dur, nbytes, arrival = record
                l = links[link]
                yield TraceEvent(f"gpu {tb.gpu} tb {tb.id} step {k}", "link", num_ranks, link, start, dur,
                                 {"bytes": nbytes, "arrival_us": arrival, "src": l.src, "dst": l.dst})

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all()) if self._events is not None else len(self._records)

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        if isinstance(other, (tuple, TraceEvents)):
            return self._all() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self):
        return (tuple, (self._all(),))


@dataclass(frozen=True)
class LinkBusy:
    """How long a link's bandwidth was in use, and that as a share of the makespan."""

    src: int
    dst: int
    busy_us: float
    utilisation: float


@dataclass(frozen=True)
class SimulationReport:
    """Timing of one program at one size. Times in microseconds, bandwidths in GB/s (1e9 bytes/s)."""

    program: str
    collective: str
    num_ranks: int
    topology: str
    size_bytes: int
    chunk_bytes: float
    protocol: str
    fifo_depth: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    alpha_occupies: bool
    reduce_us_per_byte: float
    steps: int
    link_busy: tuple[LinkBusy, ...]
    events: Sequence[TraceEvent] = field(repr=False)    # a TraceEvents, or any tuple of TraceEvent
    track_names: dict = field(default_factory=dict, repr=False, compare=False)  # (pid, tid) -> name

    def to_dict(self) -> dict:
        """JSON-ready summary (without the trace events)."""
        return {"program": self.program, "collective": self.collective, "num_ranks": self.num_ranks,
                "topology": self.topology, "size_bytes": self.size_bytes, "chunk_bytes": self.chunk_bytes,
                "protocol": self.protocol, "fifo_depth": self.fifo_depth, "time_us": self.time_us,
                "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
                "alpha_occupies": self.alpha_occupies, "reduce_us_per_byte": self.reduce_us_per_byte,
                "steps": self.steps,
                "link_busy": [{"src": b.src, "dst": b.dst, "busy_us": b.busy_us, "utilisation": b.utilisation}
                              for b in self.link_busy]}


def simulate_program(program: MscclProgram, topology: Topology, size_bytes: float, reduce_us_per_byte: float = 0.0,
                     alpha_occupies: bool = False, fifo_depth: int | None = None) -> SimulationReport:
    """Time ``program`` on ``topology`` at nccl-tests size ``size_bytes``.

    Parameters
    ----------
    program : MscclProgram
    topology : Topology
        Must have exactly ``program.ngpus`` ranks and a link for every (gpu, send peer) the program uses.
    size_bytes : float
        nccl-tests' size (the per-rank buffer); a chunk is ``size_bytes / nchunksperloop`` bytes.
    reduce_us_per_byte : float
        Cost of reducing one byte at the receiving rank, microseconds.
    alpha_occupies : bool
        Whether latency also occupies the link (TACCL) instead of overlapping (the default).
    fifo_depth : int or None
        Messages a connection buffers before a send waits: None means the runtime's depth for the program's
        protocol (2 Simple, 8 LL/LL128); ``UNBOUNDED_FIFO`` gives the pure alpha-beta model of the replay check.

    Returns
    -------
    SimulationReport

    Raises
    ------
    InputError
        The program does not fit the topology (rank count, a send with no link).
    VerificationError
        The program deadlocks, so it has no finishing time.

    Examples
    --------
    A 4-rank ring Allgather on ``ring-4`` (alpha 0.7 us, 25 GB/s): 3 hops of alpha + chunk / bandwidth.

    >>> from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
    >>> from synth.model.topology import load_topology
    >>> def ring_tb(r, n):
    ...     steps = [Step(0, "s", "o", r, "o", r, 1)]
    ...     steps += [Step(k, "rcs" if k < n - 1 else "r", "o", (r - k) % n, "o", (r - k) % n, 1)
    ...               for k in range(1, n)]
    ...     return Threadblock(0, (r + 1) % n, (r - 1) % n, 0, tuple(steps))
    >>> gpus = tuple(Gpu(r, 0, 4, 0, (ring_tb(r, 4),)) for r in range(4))
    >>> program = MscclProgram("ring", "Simple", 1, 4, 4, "allgather", 1, None, None, None, gpus)
    >>> report = simulate_program(program, load_topology("ring-4"), 1_000_000)
    >>> round(report.time_us, 3)  # 3 * (0.7 + 250000 / 25000)
    32.1
    """
    if not size_bytes > 0:
        raise InputError("--size", "", f"size must be positive, got {size_bytes}")
    index = index_program(program)
    _check_fits(program, index, topology)
    chunk_bytes = program_chunk_bytes(program, size_bytes)
    depth = runtime_fifo_depth(program) if fifo_depth is None else fifo_depth
    timeline = _Timeline(index, topology, chunk_bytes, reduce_us_per_byte, alpha_occupies, depth)
    end_us = timeline.run()
    algbw = size_bytes / (end_us * BYTES_PER_US_PER_GBPS) if end_us > 0 else float("inf")
    busy = tuple(LinkBusy(topology.links[i].src, topology.links[i].dst, b, b / end_us if end_us > 0 else 0.0)
                 for i, b in enumerate(timeline.clock.busy_us) if b > 0)
    return SimulationReport(program.name, program.collective, program.ngpus, topology.name, int(size_bytes),
                            chunk_bytes, program.proto, timeline.depth, end_us, algbw, algbw * _busbw_factor(program),
                            alpha_occupies, reduce_us_per_byte, timeline.steps_done, busy,
                            TraceEvents(timeline.records, index.tbs, topology),
                            timeline.track_names())


def program_chunk_bytes(program: MscclProgram, size_bytes: float) -> float:
    """Bytes of one chunk of ``program`` at nccl-tests size ``size_bytes`` (the larger buffer; conventions:
    gather/scatter count one rank's part)."""
    return float(size_bytes / conventions.size_chunks(program.collective, program.nchunksperloop, program.ngpus))


def _busbw_factor(program: MscclProgram) -> float:
    """nccl-tests' bus-bandwidth factor; 1 for collectives we do not know (e.g. custom)."""
    try:
        return make_collective(program.collective, program.ngpus, 1).busbw_factor()
    except SynthError:
        return 1.0


def _check_fits(program: MscclProgram, index: ProgramIndex, topology: Topology) -> None:
    source = f"program {program.name!r}"
    if program.ngpus != topology.num_ranks:
        raise InputError(source, "ngpus", f"has {program.ngpus} GPUs but topology {topology.name} has "
                         f"{topology.num_ranks} ranks; pick a topology (or --nodes) with {program.ngpus} ranks")
    for tb in index.tbs:
        if any(tb.sends) and tb.out_conn is not None and topology.link(tb.gpu, tb.send) is None:
            raise InputError(source, f"gpu {tb.gpu} tb {tb.id}", f"sends to rank {tb.send}, but topology "
                             f"{topology.name} has no link {tb.gpu}->{tb.send}; route through a neighbour")
    for finding in index.findings:
        if finding.kind == "peer" and finding.severity == "error":
            raise InputError(source, f"gpu {finding.gpu} tb {finding.tb}", finding.message)


class _Timeline:
    """Event-driven state of one timing run; ``run`` returns the makespan in microseconds."""

    def __init__(self, index: ProgramIndex, topology: Topology, chunk_bytes: float, reduce_us_per_byte: float,
                 alpha_occupies: bool, depth: int):
        self.ix = index
        self.topology = topology
        self.chunk_bytes = chunk_bytes
        self.reduce_us_per_byte = reduce_us_per_byte
        self.depth = depth
        self.clock = LinkClock(topology, alpha_occupies)
        n_tbs, n_conns = len(index.tbs), len(index.connections)
        self.pc = [0] * n_tbs
        self.phase = [0] * n_tbs          # 1: received, waiting to send
        self.free_us = [0.0] * n_tbs      # when the tb can start its next step / phase
        self.step_start = [0.0] * n_tbs
        self.arrivals = [deque() for _ in range(n_conns)]   # arrival times of messages not yet taken
        self.sent = [0] * n_conns
        self.taken_us: list[list[float]] = [[] for _ in range(n_conns)]  # when each message was taken
        self.data_waiter: list[int | None] = [None] * n_conns
        self.room_waiter: list[int | None] = [None] * n_conns
        self.published: list[list[int]] = [[] for _ in range(n_tbs)]
        self.published_us: list[list[float]] = [[] for _ in range(n_tbs)]
        self.dep_waiters: list[list[int]] = [[] for _ in range(n_tbs)]
        self.link_of = [topology.link_index.get((tb.gpu, tb.send)) if tb.out_conn is not None else None
                        for tb in index.tbs]
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.records: list[tuple] = []    # raw trace events (see TraceEvents)
        self.steps_done = 0
        self.end_us = 0.0

    def _push(self, t: int, at_us: float) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at_us, self.seq, t))

    def run(self) -> float:
        for t in range(len(self.ix.tbs)):
            self._push(t, 0.0)
        while self.heap:
            now, _, t = heapq.heappop(self.heap)
            self._advance(t, now)
        stuck = [t for t, tb in enumerate(self.ix.tbs) if self.pc[t] < len(tb.steps)]
        if stuck:
            tb = self.ix.tbs[stuck[0]]
            raise VerificationError(f"program {self.ix.program.name!r} deadlocks (FIFO depth {self.depth}): "
                                    f"{len(stuck)} tb(s) never finish, first gpu {tb.gpu} tb {tb.id} at step "
                                    f"{self.pc[stuck[0]]}; run `synth check` for the wait-for cycle")
        return self.end_us

    def _advance(self, t: int, now: float) -> None:
        """Run tb ``t`` from time ``now`` until it blocks or must wait for a later time."""
        tb = self.ix.tbs[t]
        steps, receives, sends, dep_tb = tb.steps, tb.receives, tb.sends, tb.dep_tb
        n = len(steps)
        pc, phase, free_us = self.pc, self.phase, self.free_us
        while pc[t] < n:
            k = pc[t]
            step = steps[k]
            if phase[t] == 0:
                ready = free_us[t] if dep_tb[k] is None else self._ready_us(t, dep_tb[k], step.deps)
                if ready is None:
                    return
                if ready > now:
                    self._push(t, ready)
                    return
                self.step_start[t] = ready
                done = self._receive(t, ready) if receives[k] else ready
                if done is None:
                    return
                if self.reduce_us_per_byte:
                    done += self._reduce_us(step)
                phase[t] = 1
                free_us[t] = done
                if sends[k] and done > now:
                    self._push(t, done)   # book the link at the time the data is there
                    return
            if sends[k]:
                done = self._send(t, k, now)
                if done is None:
                    return
            else:
                done = free_us[t]
            self._finish(t, k, step, done)
            if done > now:
                self._push(t, done)
                return

    def _ready_us(self, t: int, u: int | None, deps: int) -> float | None:
        ready = self.free_us[t]
        if u is None:
            return ready
        flags = self.published[u]
        if not flags or flags[-1] < deps:
            self.dep_waiters[u].append(t)
            return None
        first = bisect.bisect_left(flags, deps)
        return max(ready, self.published_us[u][first])

    def _receive(self, t: int, ready: float) -> float | None:
        c = self.ix.tbs[t].in_conn
        arrivals = self.arrivals[c]
        if not arrivals:
            self.data_waiter[c] = t
            return None
        arrival = arrivals.popleft()
        done = ready if ready > arrival else arrival
        self.taken_us[c].append(done)
        waiter = self.room_waiter[c]
        if waiter is not None:
            self.room_waiter[c] = None
            self._push(waiter, max(done, self.free_us[waiter]))
        return done

    def _reduce_us(self, step) -> float:
        kind = STEP_TYPES.get(step.type)
        if kind is None or not kind[2]:
            return 0.0
        return max(step.cnt, 0) * self.chunk_bytes * self.reduce_us_per_byte

    def _send(self, t: int, k: int, now: float) -> float | None:
        """Book the message on the link once the FIFO has room; returns when the tb is free again."""
        tb = self.ix.tbs[t]
        c = tb.out_conn
        m = self.sent[c]
        ready = self.free_us[t]
        if m >= self.depth:
            taken = self.taken_us[c]
            if len(taken) <= m - self.depth:
                self.room_waiter[c] = t
                return None
            ready = max(ready, taken[m - self.depth])
        if ready > now:
            self._push(t, ready)
            return None
        nbytes = max(tb.steps[k].cnt, 0) * self.chunk_bytes
        link = self.link_of[t]
        res = self.clock.reserve(link, now, nbytes)
        self.sent[c] += 1
        self.arrivals[c].append(res.arrival_us)
        if res.arrival_us > self.end_us:
            self.end_us = res.arrival_us
        waiter = self.data_waiter[c]
        if waiter is not None:
            self.data_waiter[c] = None
            self._push(waiter, max(now, self.free_us[waiter]))
        self.records.append(("link", t, k, link, res.start_us, res.busy_until_us - res.start_us, nbytes,
                             res.arrival_us))
        return res.busy_until_us

    def _finish(self, t: int, k: int, step, done: float) -> None:
        if step.type != "nop":
            start = self.step_start[t]
            self.records.append(("tb", t, k, start, done - start))
        if step.hasdep:
            self.published[t].append(k)
            self.published_us[t].append(done)
            waiters, self.dep_waiters[t] = self.dep_waiters[t], []
            for u in waiters:
                self._push(u, max(done, self.free_us[u]))
        self.free_us[t] = done
        if done > self.end_us:
            self.end_us = done
        self.phase[t] = 0
        self.pc[t] = k + 1
        self.steps_done += 1

    def track_names(self) -> dict:
        names = {}
        for tb in self.ix.tbs:
            names[(tb.gpu, tb.id)] = f"tb {tb.id} (send {tb.send}, recv {tb.recv}, chan {tb.chan})"
        for i, link in enumerate(self.topology.links):
            if self.clock.busy_us[i] > 0:
                names[(self.topology.num_ranks, i)] = f"link {link.src}->{link.dst}"
        return names


# ----------------------------------------------------------------------------------------------- traces

def trace_document(report_or_events, num_ranks: int | None = None) -> dict:
    """Chrome/Perfetto trace (``traceEvents``, ``ph: X``, ``ts``/``dur`` in microseconds).

    One process per rank with one track per tb, and one process "links" with one track per used link.
    Accepts a :class:`SimulationReport` or an iterable of :class:`TraceEvent`.
    """
    if isinstance(report_or_events, SimulationReport):
        events, names, n = report_or_events.events, report_or_events.track_names, report_or_events.num_ranks
    else:
        events, names = tuple(report_or_events), {}
        n = num_ranks if num_ranks is not None else 1 + max((e.pid for e in events if e.track == "tb"), default=-1)
    out = []
    tb_pids = sorted({e.pid for e in events if e.track == "tb"})
    for pid in tb_pids:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid}"}})
    if any(e.track == "link" for e in events):
        out.append({"ph": "M", "name": "process_name", "pid": n, "args": {"name": "links"}})
    tracks = sorted({(e.pid, e.tid, e.track) for e in events})
    for pid, tid, track in tracks:
        default = f"tb {tid}" if track == "tb" else f"link {tid}"
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": names.get((pid, tid), default)}})
    for e in events:
        out.append({"name": e.name, "cat": e.track, "ph": "X", "ts": e.start_us, "dur": e.dur_us, "pid": e.pid,
                    "tid": e.tid, "args": dict(e.args)})
    return {"traceEvents": out, "displayTimeUnit": "ns"}


def write_trace(report_or_events, path: str | Path) -> None:
    """Write :func:`trace_document` as JSON to ``path`` atomically (temporary file, then rename)."""
    write_atomic(path, json.dumps(trace_document(report_or_events)))
