"""Gathered schedules: the Allgather baseline of every rank's whole input, then on each rank its sum (an
Allreduce) or its block of each input (an Alltoall) (:attr:`synth.schedule.ir.Schedule.gathered`, written by
:mod:`backends.msccl.gathered`).

Relays forward other ranks' inputs untouched, so the data crosses the machine once, where partial sums cross it
twice: ring-8 Allreduce 1 KB takes 4 hops (2.87 us simulated) where reduce-then-broadcast takes 8 (5.6 us). An
Alltoall's per-pair chunks are n^2 messages where the gathered one sends an input per message: on ndv2 x4 at
1 KB each link between nodes carries 384 of them, which queue at the runtime's FIFOs. It moves n times the bytes,
so it is offered only where the latency bound is the limit; ``synth solve`` and ``synth pareto`` both take it
from here.

>>> from synth.model.topology import load_topology
>>> found = gathered_schedules(load_topology("ring-8"), "allreduce", 1024)[0]     # the fastest replay
>>> found.schedule.gathered, found.baseline, round(found.report.time_us, 3)
('allreduce', 'shortest-path/c4', 2.872)
>>> gathered_schedules(load_topology("ring-8"), "allreduce", 1 << 30)    # bandwidth binds
[]
>>> gathered_schedules(load_topology("ring-8"), "alltoall", 1024)[0].schedule.loop_chunks     # 8 blocks of 4
32
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.bounds.physical import Bound, lower_bound
from synth.model.topology import Topology
from synth.schedule.ir import GATHERED_KINDS, Schedule
from synth.schedule.replay import ReplayReport, verify
from synth.solver.deadline import UNBOUNDED, Deadline
from synth.synthesis.baselines import evaluate_baselines

# n whole buffers go to every rank, and each rank sums (or copies from) each of them: offered on machines of up to
# this many ranks.
GATHERED_MAX_RANKS = 32


@dataclass(frozen=True)
class GatheredSchedule:
    """A verified gathered schedule, the Allgather baseline it gathers with (``name/cK``: its chunks per way) and
    its replay at the gathered collective's size."""

    schedule: Schedule
    baseline: str
    report: ReplayReport


def gathered_schedules(topology: Topology, collective: str, size_bytes: float, deadline: Deadline = UNBOUNDED,
                       bound: Bound | None = None) -> list[GatheredSchedule]:
    """The gathered Allreduce or Alltoall over every Allgather baseline (at n times ``size_bytes``) whose file
    the runtimes select at power-of-two sizes, fastest replay first; empty where it is not offered: another
    collective, the bandwidth bound binding, more than :data:`GATHERED_MAX_RANKS` ranks, or no such baseline.
    Every one is offered because the fastest replay is not always the fastest file (ndv2 x4 Allreduce 1 KB over
    the shortest paths: 4 chunks per way replay at 8.43 us and simulate at 10.92 us, 2 chunks at 8.51 us both
    ways). ``bound``: the request's (:func:`~synth.bounds.physical.lower_bound`), where the caller has it."""
    n = topology.num_ranks
    if collective not in GATHERED_KINDS or n > GATHERED_MAX_RANKS:
        return []
    if (bound or lower_bound(collective, topology, size_bytes)).binding != "latency":
        return []
    table = evaluate_baselines("allgather", topology, size_bytes * n, deadline=deadline)
    runs = [(replace(run.schedule, gathered=collective), run) for run in table.runs]
    runs = sorted(((schedule, run) for schedule, run in runs if schedule.runs_at_power_of_two_sizes),
                  key=lambda pair: pair[1].report.time_us)
    return [GatheredSchedule(schedule, f"{run.name}/c{run.chunks_per_way}", verify(schedule, topology, size_bytes))
            for schedule, run in runs]

