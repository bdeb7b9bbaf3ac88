"""NCCL-style baseline algorithms as :class:`~synth.schedule.ir.Schedule` objects.

Each baseline is a *routing*: for every chunk it says over which links the chunk spreads from its origin to
everyone (an out-tree), how partial sums flow into a root (an in-tree, for combining collectives), or which
path a chunk takes to one peer. The collective then follows from the tables in :mod:`synth.model.collectives`:

========================  ==================================================================
Allgather / Broadcast     spread each chunk from its origin (the root for Broadcast)
ReduceScatter / Reduce    collect each chunk into its owner (the root for Reduce), op=reduce
Allreduce                 collect each chunk into a hub, then spread it from there (RS + AG)
Alltoall / Gather/Scatter one path per chunk from its source to its destination
========================  ==================================================================

Steps give the issue order. They are found by replaying the routing with the alpha-beta cost model at a
nominal size (``order_bytes``): every transfer starts as soon as its data is there and its link is free, links
serve transfers first come first served (ties broken by a priority, e.g. round k of a star), and ``step`` is
the rank of the transfer's (ready time, priority). So a transfer's step is always larger than the steps that
deliver its data, and :func:`synth.schedule.replay.verify` at that size reproduces exactly the time of the replay.

``chunks_per_rank`` is per ring or tree: a baseline that spreads data over ``w`` rings or trees builds the
collective with ``w * chunks_per_rank`` chunks per rank. More chunks pipeline better and cost more alphas.

>>> from synth.model.topology import load_topology
>>> from synth.schedule.replay import verify
>>> topo = load_topology("ring-4")
>>> s = build_baseline("ring", "allgather", topo)
>>> round(verify(s, topo, 4_000_000).time_us, 1)   # 3 * (0.7 us + 1 MB / 25 GB/s)
122.1
"""

from __future__ import annotations

__all__ = ["BASELINES", "MAX_BASELINE_TRANSFERS", "MAX_TABLE_TRANSFERS", "Baseline", "BaselineRun", "BaselineTable",
           "baseline_status", "best_baseline", "build_baseline", "evaluate_baselines", "find_ring", "pack_rings"]

import math
from collections.abc import Collection
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

from backends.msccl.fit import hopeless
from synth.errors import InputError
from synth.model.collectives import make_collective, normalize_name
from synth.model.topology import Topology
from synth.schedule.costmodel import load_bound_us
from synth.schedule.ir import Schedule, Transfer
from synth.schedule.replay import ReplayReport, verify
from synth.solver.deadline import UNBOUNDED, Deadline
from synth.synthesis.baselines.all_pairs import DIRECT_EXCHANGE, all_pairs_routes, direct_exchange_routes
from synth.synthesis.baselines.doubling import doubling_routes
from synth.synthesis.baselines.hierarchical import hierarchical_routes
from synth.synthesis.baselines.plans import (DEFAULT_ORDER_BYTES, Routes, check_links, count_transfers,
                                             not_applicable, order_plans, plan_collective)
from synth.synthesis.baselines.rings import bidir_ring_routes, find_ring, multi_ring_routes, pack_rings, ring_routes
from synth.synthesis.baselines.shortest import SHORTEST_PATH, shortest_path_routes
from synth.synthesis.baselines.trees import double_tree_routes

# ----------------------------------------------------------------------------------------------- registry

# Transfers one baseline schedule may hold (half of it with more chunks than the baseline's fewest), and all of a
# request's baselines together. On 256 x dgx-h100 (2 cores shared six ways) building and replaying takes about
# 80 us of CPU per transfer, and writing grows faster than the transfers: the hierarchical ReduceScatter took 63 s
# to write with 1 chunk (65k transfers) and 274 s with 2 chunks (130k) for 1% less time; a 130k-transfer Allreduce
# took 390 s. So at 256 GPUs every baseline keeps one chunk per rank (a ring Allreduce is 130k transfers), the
# table holds at most two such schedules (~25 s of CPU to build, a tenth of the default search time), the most
# promising first, and an Alltoall relayed around the ring (8.4M) is never built.
MAX_BASELINE_TRANSFERS = 1 << 17
MAX_TABLE_TRANSFERS = 1 << 18
_ALL = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall", "gather", "scatter")


@dataclass(frozen=True)
class Baseline:
    """A registered baseline: which collectives it implements and how it routes them on a topology."""

    name: str
    description: str
    collectives: tuple[str, ...]
    routes: Callable[[Topology, str, int | None], Routes]


BASELINES = MappingProxyType({b.name: b for b in (
    Baseline("ring", "one ring over the fastest Hamiltonian cycle; pipelined chain for rooted collectives",
             _ALL, ring_routes),
    Baseline("bidir-ring", "the ring in both directions, half the data each way", _ALL, bidir_ring_routes),
    Baseline("multi-ring", "several rings packed onto the link lanes, data split evenly", _ALL,
             multi_ring_routes),
    Baseline("double-binary-tree", "two complementary binary trees (over nodes with intra-node chains)",
             ("allreduce", "broadcast", "reduce"), double_tree_routes),
    Baseline("recursive-doubling", "exchange with partner r^2^k; Allreduce exchanges the whole buffer",
             ("allgather", "allreduce"), doubling_routes("recursive-doubling", butterfly=True)),
    Baseline("recursive-halving-doubling", "recursive halving reduce-scatter (then doubling allgather)",
             ("reducescatter", "allreduce"), doubling_routes("recursive-halving-doubling", butterfly=False)),
    Baseline("hierarchical", "intra-node ring, inter-node rails, intra-node ring",
             ("allgather", "reducescatter", "allreduce", "broadcast", "reduce"), hierarchical_routes),
    Baseline("all-pairs", "direct sends to every peer (Broadcast/Reduce: a star at the root)",
             ("allgather", "reducescatter", "allreduce", "alltoall", "gather", "scatter", "broadcast", "reduce"),
             all_pairs_routes),
    Baseline(DIRECT_EXCHANGE, "whole buffers reduced between linked peers, then across nodes: one traversal",
             ("allreduce",), direct_exchange_routes),
    Baseline(SHORTEST_PATH, "every chunk along alpha-shortest paths (out-trees from, in-trees to each rank)",
             ("allgather", "reducescatter", "broadcast", "reduce", "alltoall", "gather", "scatter"),
             shortest_path_routes),
)})


def build_baseline(name: str, collective_name: str, topology: Topology, chunks_per_rank: int = 1,
                   root: int | None = None, order_bytes: float = DEFAULT_ORDER_BYTES,
                   routes: Routes | None = None) -> Schedule:
    """Build a baseline schedule.

    Parameters
    ----------
    name : str
        A key of :data:`BASELINES`.
    collective_name : str
    topology : Topology
    chunks_per_rank : int
        Chunks per rank *per ring or tree* (pipelining depth).
    root : int, optional
        Root of rooted collectives (default 0).
    order_bytes : float
        Size (nccl-tests' convention, bytes) at which the issue order is tuned; any size verifies.
    routes : Routes, optional
        The baseline's routing on ``topology`` for this collective and root, when the caller has it already
        (finding rings and trees on a cluster takes seconds); default: found here.

    Raises
    ------
    InputError
        Unknown baseline, unsupported collective, or a topology without the links the baseline needs.
    """
    spec = BASELINES.get(name)
    if spec is None:
        raise InputError("NAME", "", f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
    cname = normalize_name(collective_name)
    if cname not in spec.collectives:
        raise not_applicable(name, f"does not implement {cname}; it implements {', '.join(spec.collectives)}")
    if chunks_per_rank < 1:
        raise InputError("--chunks", "", f"must be at least 1, got {chunks_per_rank}")
    routes = spec.routes(topology, cname, root) if routes is None else routes
    coll = make_collective(cname, topology.num_ranks, chunks_per_rank * routes.ways, root)
    transfers = routes.explicit(coll)
    if transfers is None:
        plans = plan_collective(coll, routes)
        check_links(plans, topology, name)
        transfers = order_plans(plans, topology, coll.chunk_bytes(order_bytes))
    steps = 1 + max((t.step for t in transfers), default=-1)
    notes = {"baseline": name, "chunks_per_way": chunks_per_rank, **routes.describe()}
    return Schedule(coll, topology.name, tuple(transfers), steps, method=f"baseline:{name}", notes=notes)


def baseline_status(collective_name: str, topology: Topology, root: int | None = None) -> dict[str, str | None]:
    """For every baseline, None if it applies to the collective on the topology, else the reason it does not."""
    return {name: None if isinstance(found, Routes) else found
            for name, found in _routings(normalize_name(collective_name), topology, root).items()}


def _routings(cname: str, topology: Topology, root: int | None) -> dict[str, Routes | str]:
    """Every baseline's routing of the collective on the topology, or the reason it has none."""
    found: dict[str, Routes | str] = {}
    for name, spec in BASELINES.items():
        if cname not in spec.collectives:
            found[name] = f"does not implement {cname}"
            continue
        try:
            found[name] = spec.routes(topology, cname, root)
        except InputError as exc:
            found[name] = exc.problem
    return found


@dataclass(frozen=True)
class BaselineRun:
    """One baseline schedule built for a size, with its replayed time."""

    name: str
    chunks_per_way: int
    schedule: Schedule
    report: ReplayReport

    @property
    def runnable(self) -> bool:
        """Whether the MSCCL runtimes select it at power-of-two sizes (power-of-two ``nchunksperloop``)."""
        return self.schedule.collective.runs_at_power_of_two_sizes


@dataclass(frozen=True)
class BaselineTable:
    """Every applicable baseline at one size (each chunk option), built and replayed once per request.

    ``reasons`` says why each baseline that is missing does not apply.
    """

    collective: str
    topology: str
    size_bytes: float
    runs: tuple[BaselineRun, ...]
    reasons: tuple[str, ...]

    def best(self, runnable_only: bool = False, unloadable: Collection[tuple[str, int]] = ()) -> BaselineRun:
        """The fastest run (the first built among equals); raises InputError when none qualifies.

        ``runnable_only`` keeps only schedules the MSCCL runtimes select at power-of-two sizes
        (see :attr:`synth.model.collectives.Collective.runs_at_power_of_two_sizes`). ``unloadable``: ``(name,
        chunks per way)`` whose files the writer refused for a runtime limit; those runs, and the same baseline
        with more chunks, are left out.
        """
        fewest: dict[str, int] = {}
        for name, chunks in unloadable:
            fewest[name] = min(chunks, fewest.get(name, chunks))
        best = None
        for run in self.runs:
            if (runnable_only and not run.runnable) or run.chunks_per_way >= fewest.get(run.name, 1 << 62):
                continue
            if best is None or run.report.time_us < best.report.time_us:
                best = run
        if best is None:
            reasons = list(self.reasons)
            if runnable_only:
                reasons += [f"{r.name} with {r.chunks_per_way} chunk(s): nchunksperloop "
                            f"{r.schedule.collective.loop_chunks} is not a power of two" for r in self.runs
                            if not r.runnable]
            reasons += [f"{name} with {chunks} or more chunk(s): the runtime cannot load its files"
                        for name, chunks in fewest.items()]
            raise InputError("COLLECTIVE", "", f"no baseline applies to {self.collective} on {self.topology}: "
                             + "; ".join(reasons))
        return best


@dataclass(frozen=True)
class _Option:
    """One baseline at one chunk count, before it is built: its routing and how many transfers it will hold."""

    name: str
    chunks_per_way: int
    routes: Routes
    transfers: int

    @property
    def label(self) -> str:
        return f"{self.name}/c{self.chunks_per_way}"


def evaluate_baselines(collective_name: str, topology: Topology, size_bytes: float, root: int | None = None,
                       chunk_options: tuple[int, ...] = (1, 2, 4),
                       progress: Callable[[str], None] = lambda message: None, deadline: Deadline = UNBOUNDED,
                       max_transfers: int | None = None, max_table_transfers: int | None = None) -> BaselineTable:
    """Build and replay every applicable baseline for each of ``chunk_options`` at ``size_bytes``.

    On large machines a baseline's transfers grow with ranks squared times chunks (ranks cubed for an Alltoall
    relayed around a ring), and each costs time to build, replay and write. So every schedule's transfers are
    counted from its routing first (:func:`~synth.synthesis.baselines.plans.count_transfers`), and none is built
    that holds more than ``max_transfers`` (default :data:`MAX_BASELINE_TRANSFERS`; half of it with more chunks
    than the baseline's fewest) or would take the table past ``max_table_transfers`` (default
    :data:`MAX_TABLE_TRANSFERS`), nor one whose program no GPU of the topology could hold (a threadblock per
    peer, more peers than SMs). Every baseline gets its fewest chunks first, the most promising first (the least
    time on its busiest link or switch port, a lower bound on its replay); more chunks (deeper pipelining) go to
    the baselines that were fastest so far. Once ``deadline`` has passed, no further baseline is built. (Slow
    baselines are still built: when the fastest cannot be written, a slower one may.)

    Each skip is kept in :attr:`BaselineTable.reasons` and told to ``progress``, and the table is not left empty
    where a baseline could be written: if none is within the budget per baseline, or the deadline passed before
    any was built, the one with the fewest transfers is built all the same (the runtime's own choice must always
    compete), unless even it is over the table's budget (8.4M transfers for an Alltoall relayed around 256 GPUs:
    no GPU could run that many steps). Runs are listed in the registry's order, fewer chunks first.

    >>> from synth.model.topology import load_topology
    >>> table = evaluate_baselines("allgather", load_topology("ring-4"), 1 << 20)
    >>> table.best().name, table.best().report.time_us > 0
    ('bidir-ring', True)
    >>> table = evaluate_baselines("allgather", load_topology("ring-4"), 1 << 20, max_transfers=12)
    >>> [run.name for run in table.runs], [reason for reason in table.reasons if "budget" in reason][0]
    (['ring', 'shortest-path'], 'ring/c2, c4: 24, 48 transfers, over the budget of 12 per baseline, 6 with more chunks than its fewest')
    """
    cname = normalize_name(collective_name)
    per_schedule = MAX_BASELINE_TRANSFERS if max_transfers is None else max_transfers
    per_table = MAX_TABLE_TRANSFERS if max_table_transfers is None else max_table_transfers
    reasons, options = [], []

    def skip(reason: str) -> None:
        reasons.append(reason)
        progress(f"  baseline {reason}")

    for name, routes in _routings(cname, topology, root).items():
        if not isinstance(routes, Routes):
            reasons.append(f"{name}: {routes}")
            continue
        options += [_Option(name, chunks, routes, count_transfers(cname, topology.num_ranks, chunks * routes.ways,
                                                                  routes, root)) for chunks in sorted(chunk_options)]
    footprints: dict[str, _Footprint] = {}

    def footprint(option: _Option) -> _Footprint:
        if option.name not in footprints:
            footprints[option.name] = _footprint(cname, topology, option.routes, root, size_bytes)
        return footprints[option.name]

    left = _within_budget(options, per_schedule, per_table, footprint, skip)
    runs, fastest_us, spent, over_table, late = [], {}, 0, [], []

    def next_option() -> _Option:
        if deadline.expired and not runs:
            return min(left, key=lambda o: o.transfers)       # out of time with none built: the quickest one
        level = min(o.chunks_per_way for o in left)
        return min((o for o in left if o.chunks_per_way == level),
                   key=lambda o: (fastest_us.get(o.name, math.inf), footprint(o).busiest_us))

    while left:
        option = next_option()
        left.remove(option)
        if deadline.expired and runs:
            late.append(option)
            continue
        if runs and spent + option.transfers > per_table:
            over_table.append(option)
            continue
        progress(f"  baseline {option.label}: building {option.transfers} transfers")
        try:
            schedule = build_baseline(option.name, cname, topology, option.chunks_per_way, root,
                                      order_bytes=size_bytes, routes=option.routes)
        except InputError as exc:
            reasons.append(f"{option.label}: {exc.problem}")
            continue
        report = verify(schedule, topology, size_bytes)
        runs.append(BaselineRun(option.name, option.chunks_per_way, schedule, report))
        spent += option.transfers
        fastest_us[option.name] = min(report.time_us, fastest_us.get(option.name, math.inf))
        progress(f"  baseline {option.label}: {report.time_us:.2f} us ({len(schedule.transfers)} transfers)")
    if over_table:
        skip(f"{', '.join(o.label for o in options if o in over_table)}: not built, the baselines built hold "
             f"{spent} transfers and the budget of the table is {per_table}")
    if late:
        skip(f"{', '.join(o.label for o in options if o in late)}: not built, the time limit was reached")
    order = {(o.name, o.chunks_per_way): i for i, o in enumerate(options)}
    runs.sort(key=lambda r: order[(r.name, r.chunks_per_way)])
    return BaselineTable(cname, topology.name, size_bytes, tuple(runs), tuple(reasons))


def _within_budget(options: list[_Option], per_schedule: int, per_table: int,
                   footprint: Callable[[_Option], _Footprint], skip: Callable[[str], None]) -> list[_Option]:
    """The options a GPU can hold whose transfers are within ``per_schedule`` (half of it with more chunks than
    the baseline's fewest); when there is none, the cheapest one a GPU can hold, if it is within ``per_table``.
    ``skip`` hears why each of the others is left out."""
    fewest_chunks = min((o.chunks_per_way for o in options), default=1)
    unloadable = {o.name: why for o in options if o.chunks_per_way == fewest_chunks and o.transfers <= per_schedule
                  and (why := footprint(o).unloadable)}
    for name, why in unloadable.items():
        skip(f"{name}: {why}")
    loadable = [o for o in options if o.name not in unloadable]
    fewest = {}
    for o in loadable:
        fewest.setdefault(o.name, o.chunks_per_way)
    left = [o for o in loadable
            if o.transfers <= (per_schedule if o.chunks_per_way == fewest[o.name] else per_schedule // 2)]
    for name in fewest:
        over = [o for o in loadable if o.name == name and o not in left]
        if over:
            skip(f"{name}/c{', c'.join(str(o.chunks_per_way) for o in over)}: "
                 f"{', '.join(str(o.transfers) for o in over)} transfers, over the budget of {per_schedule} per "
                 f"baseline, {per_schedule // 2} with more chunks than its fewest")
    if left:
        return left
    for cheapest in sorted(loadable, key=lambda o: o.transfers):
        if cheapest.transfers > per_table:
            skip(f"none built: the fewest transfers, {cheapest.transfers} of {cheapest.label}, are over the "
                 f"budget of the table ({per_table}) too")
            break
        if cheapest.name in unloadable:
            continue
        if why := footprint(cheapest).unloadable:
            unloadable[cheapest.name] = why
            skip(f"{cheapest.name}: {why}")
            continue
        skip(f"{cheapest.label}: built all the same, no baseline has fewer transfers")
        return [cheapest]
    return []


@dataclass(frozen=True)
class _Footprint:
    """What a baseline's routing says before it is built: why no GPU could hold its program (None: it may fit),
    and the time its busiest link or switch port needs at the size (us; a lower bound on its replayed time at any
    chunk count, since more chunks move the same bytes over the same links)."""

    unloadable: str | None
    busiest_us: float


def _footprint(cname: str, topology: Topology, routes: Routes, root: int | None, size_bytes: float) -> _Footprint:
    """The footprint of a routing, from its edges with one chunk per way. A program needs a threadblock per peer
    (:func:`backends.msccl.fit.hopeless`); a link or port serialises the bytes it carries (the replay's
    :func:`~synth.schedule.costmodel.load_bound_us` without latency)."""
    collective = make_collective(cname, topology.num_ranks, routes.ways, root)
    transfers = routes.explicit(collective)
    if transfers is None:
        transfers = [Transfer(p.chunk, u, v, 0) for p in plan_collective(collective, routes)
                     for u, v in p.reduce_edges + p.copy_edges]
    unloadable = None
    if topology.sms_per_gpu is not None and topology.num_ranks - 1 > topology.sms_per_gpu:
        unloadable = hopeless(Schedule(collective, topology.name, tuple(transfers), 1), topology)
    busiest_us = load_bound_us(((t.src, t.dst) for t in transfers), topology, collective.chunk_bytes(size_bytes),
                               latency=False)
    return _Footprint(unloadable, busiest_us)


def best_baseline(collective_name: str, topology: Topology, size_bytes: float, root: int | None = None,
                  chunk_options: tuple[int, ...] = (1, 2, 4), runnable_only: bool = False) -> BaselineRun:
    """The fastest applicable baseline at ``size_bytes``; raises InputError when none applies.

    Builds every baseline: a request that needs baselines more than once keeps the :class:`BaselineTable`
    (:attr:`synth.synthesis.request.SynthesisRequest.baselines`).
    """
    return evaluate_baselines(collective_name, topology, size_bytes, root, chunk_options).best(runnable_only)
