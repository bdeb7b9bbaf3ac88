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

__all__ = ["BASELINES", "Baseline", "BaselineRun", "BaselineTable", "baseline_status", "best_baseline",
           "build_baseline", "evaluate_baselines", "find_ring", "pack_rings"]

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

from synth.errors import InputError
from synth.model.collectives import make_collective, normalize_name
from synth.model.topology import Topology
from synth.schedule.ir import Schedule
from synth.schedule.replay import ReplayReport, verify
from synth.synthesis.baselines.all_pairs import DIRECT_EXCHANGE, all_pairs_routes, direct_exchange_routes
from synth.synthesis.baselines.doubling import doubling_routes
from synth.synthesis.baselines.hierarchical import hierarchical_routes
from synth.synthesis.baselines.plans import (DEFAULT_ORDER_BYTES, Routes, check_links, not_applicable, order_plans,
                                             plan_collective)
from synth.synthesis.baselines.rings import bidir_ring_routes, find_ring, multi_ring_routes, pack_rings, ring_routes
from synth.synthesis.baselines.trees import double_tree_routes

# ----------------------------------------------------------------------------------------------- registry

# Transfers a baseline schedule may hold beyond its fewest-chunk version (256 GPUs: a ring Allgather with 2 chunks
# per rank is 130k transfers; with 4 it would be 261k).
MAX_BASELINE_TRANSFERS = 1 << 17
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
    Baseline("all-pairs", "direct sends to every peer", ("allgather", "reducescatter", "allreduce", "alltoall",
                                                          "gather", "scatter"), all_pairs_routes),
    Baseline(DIRECT_EXCHANGE, "whole buffers reduced between linked peers, then across nodes: one traversal",
             ("allreduce",), direct_exchange_routes),
)})


def build_baseline(name: str, collective_name: str, topology: Topology, chunks_per_rank: int = 1,
                   root: int | None = None, order_bytes: float = DEFAULT_ORDER_BYTES) -> Schedule:
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
    routes = spec.routes(topology, cname, root)
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
    cname = normalize_name(collective_name)
    status = {}
    for name, spec in BASELINES.items():
        if cname not in spec.collectives:
            status[name] = f"does not implement {cname}"
            continue
        try:
            spec.routes(topology, cname, root)
            status[name] = None
        except InputError as exc:
            status[name] = exc.problem
    return status


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

    def best(self, runnable_only: bool = False) -> BaselineRun:
        """The fastest run (the first built among equals); raises InputError when none qualifies.

        ``runnable_only`` keeps only schedules the MSCCL runtimes select at power-of-two sizes
        (see :attr:`synth.model.collectives.Collective.runs_at_power_of_two_sizes`).
        """
        best = None
        for run in self.runs:
            if runnable_only and not run.runnable:
                continue
            if best is None or run.report.time_us < best.report.time_us:
                best = run
        if best is None:
            reasons = list(self.reasons)
            if runnable_only:
                reasons += [f"{r.name} with {r.chunks_per_way} chunk(s): nchunksperloop "
                            f"{r.schedule.collective.loop_chunks} is not a power of two" for r in self.runs]
            raise InputError("COLLECTIVE", "", f"no baseline applies to {self.collective} on {self.topology}: "
                             + "; ".join(reasons))
        return best


def evaluate_baselines(collective_name: str, topology: Topology, size_bytes: float, root: int | None = None,
                       chunk_options: tuple[int, ...] = (1, 2, 4),
                       progress: Callable[[str], None] = lambda message: None) -> BaselineTable:
    """Build and replay every applicable baseline for each of ``chunk_options`` at ``size_bytes``.

    On large machines a baseline's transfers grow with ranks squared times chunks: a chunk count whose schedule
    would exceed :data:`MAX_BASELINE_TRANSFERS` is skipped (the reason is kept), because building, replaying and
    writing it would cost minutes while its fewer-chunk version still stands for it.

    >>> from synth.model.topology import load_topology
    >>> table = evaluate_baselines("allgather", load_topology("ring-4"), 1 << 20)
    >>> table.best().name, table.best().report.time_us > 0
    ('bidir-ring', True)
    """
    runs, reasons = [], []
    for name, reason in baseline_status(collective_name, topology, root).items():
        if reason is not None:
            reasons.append(f"{name}: {reason}")
            continue
        smallest = None      # transfers of the fewest-chunk version built
        for chunks in sorted(chunk_options):
            if smallest is not None and smallest[1] * chunks // smallest[0] > MAX_BASELINE_TRANSFERS:
                reasons.append(f"{name}/c{chunks}: about {smallest[1] * chunks // smallest[0]} transfers, over "
                               f"{MAX_BASELINE_TRANSFERS} (fewer chunks stand for it)")
                break
            schedule = build_baseline(name, collective_name, topology, chunks, root, order_bytes=size_bytes)
            report = verify(schedule, topology, size_bytes)
            runs.append(BaselineRun(name, chunks, schedule, report))
            smallest = smallest or (chunks, len(schedule.transfers))
            progress(f"  baseline {name}/c{chunks}: {report.time_us:.2f} us ({len(schedule.transfers)} transfers)")
    return BaselineTable(normalize_name(collective_name), topology.name, size_bytes, tuple(runs), tuple(reasons))


def best_baseline(collective_name: str, topology: Topology, size_bytes: float, root: int | None = None,
                  chunk_options: tuple[int, ...] = (1, 2, 4), runnable_only: bool = False) -> BaselineRun:
    """The fastest applicable baseline at ``size_bytes``; raises InputError when none applies.

    Builds every baseline: a request that needs baselines more than once keeps the :class:`BaselineTable`
    (:attr:`synth.synthesis.request.SynthesisRequest.baselines`).
    """
    return evaluate_baselines(collective_name, topology, size_bytes, root, chunk_options).best(runnable_only)
