"""Tree-packing synthesis (issue 11): throughput-optimal trees, integerized for the runtimes, scheduled, verified.

1. **rate**: the optimal fractional rate is the max-flow bandwidth bound of :mod:`synth.bounds.physical`, which
   the packing LP of :mod:`synth.formulations.trees` attains (tests/test_trees.py checks every built-in).
2. **integerize**: for ``C`` chunks per rank (a power of two, so ``nchunksperloop`` divides the power-of-two
   element counts the runtimes see) the packing MILP assigns chunks to trees minimising the busiest link or
   switch port; :func:`synth.formulations.trees.decompose` splits the integer capacities into trees.
3. **schedule**: every chunk follows its tree; the list scheduler (:mod:`synth.schedule.list_scheduler`) orders and
   times the transfers at the requested size (whole chunks, store-and-forward, the runtime's FIFO depth), the
   trees sharing a link taking turns by their chunks' progress (:func:`_by_progress`); the result is replayed
   (:func:`synth.schedule.replay.verify`).

Reductions use the in-trees of the broadcast-type packing on the reversed topology (ReduceScatter from Allgather,
Reduce from Broadcast, Gather from Scatter), booked forward in the order of its time reversal (Reduce, with one
root: the Broadcast's exact time reversal); Allreduce is ReduceScatter then Allgather with the same chunks per
rank.

``C`` follows from the size (:func:`pipeline_chunks`: enough chunks that the first chunk's trip is a small share
of the time), halved while the busiest connection would carry more messages than the target's threadblock steps
over 32 channels hold, or a rank more steps than the runtimes' XML reader (:func:`rank_elements`: chains, such as a
switch's packing for Broadcast and Reduce, count as their fused lowering writes them).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from math import ceil

import numpy as np

from backends.msccl.fit import FUSED_FLOW_COLLECTIVES, connection_elements
from backends.msccl.limits import MAX_XML_ELEMENTS, xml_elements
from synth.bounds.physical import bandwidth_bound_us, lower_bound
from synth.errors import InputError
from synth.formulations.trees import (REVERSAL_OF, Commodity, Packing, broadcast_commodities, decompose,
                                      shallow_packings, solve_packing)
from synth.model.collectives import make_collective, normalize_name
from synth.model.symmetry import free_symmetry_group
from synth.model.topology import Topology, check_connected, reverse_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.ir import Schedule
from synth.schedule.list_scheduler import RUNTIME_FIFO_DEPTH, list_schedule, reverse_in_time
from synth.schedule.replay import ReplayReport, verify
from synth.schedule.transforms import CollectiveProblem, reduction_for, reverse_schedule
from synth.solver.highs import FEASIBLE, OPTIMAL, SolverOptions
from synth.synthesis.baselines import find_ring

COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter")
MAX_CHUNKS = 2048
PIPELINE_SHARE = 0.01               # of the bandwidth bound, for the first chunk's trip (see pipeline_chunks)
MIP_GAP = 0.002                     # the packing is within 0.2% of the best integer one
MILP_SECONDS = 2.0                  # per packing MILP on several nodes; the incumbent (never worse than the start)
MILP_NODES = 2000                   # per packing MILP on one node: a budget the machine's load does not change
STEPS_PER_TB = {"executor": 64, "legacy": 256}
MAX_CHANNELS = 32
# How the trees of a copy (and the Broadcast a Reduce reverses) are booked: with unbounded buffers, as the replay
# times them. Their lowerings spread each connection over channels, each with the runtime's FIFO, so more messages
# are in flight than one FIFO holds. Booked behind one FIFO of 2, dgx1 Broadcast 1 MB was planned at 11.25 us and
# its file ran at 10.17 us (now planned so), and its Reduce ran at 10.66 us (now 10.30 us); the other Allgather,
# Broadcast, Scatter and Reduce files of dgx1, dgx2, dgx-h100, ring-8 and fully-connected-8 (64 KB to 1 GB)
# simulate as before, within 0.7% of their plans.
_COPY_BOOKING = None


@dataclass(frozen=True)
class TreesResult:
    """A verified tree-packing schedule and how close its integer packing is to the fractional optimum.

    Attributes
    ----------
    schedule : Schedule
        Verified by replay; ``notes`` record the chunks, trees and loads.
    status : str
        ``optimal`` when every packing MILP was proven within :data:`MIP_GAP`, else ``feasible``.
    gap : float or None
        Largest relative gap of the integer packing(s) to the fractional optimum, e.g. 0.0045 (None: unknown).
    chunks_per_rank : int
        ``C``: chunks per rank (per root for Broadcast/Reduce) of the packing and the schedule.
    fractional_us : float
        Busiest-resource time of the fractional packing at this size (the bandwidth bound), microseconds.
    integer_us : float
        Busiest-resource time of the integer packing at this size, microseconds (>= ``fractional_us``).
    replay : ReplayReport
        The schedule's verification by replay at this size (``replay_us``: its time, microseconds).
    num_trees : int
        Distinct trees over all commodities (images under symmetry included).
    solve_seconds : float
        Wall time of the whole synthesis.
    """

    schedule: Schedule
    status: str
    gap: float | None
    chunks_per_rank: int
    fractional_us: float
    integer_us: float
    replay: ReplayReport
    num_trees: int
    solve_seconds: float

    @property
    def replay_us(self) -> float:
        return self.replay.time_us


@dataclass(frozen=True)
class _Phase:
    """One broadcast-type packing: every chunk's out-tree (link indices of the topology it was solved on,
    parents first), its progress through its tree (:func:`_by_progress`), the number of roots (commodities) and
    the chunk size at the request's size (bytes)."""

    routes: tuple[tuple[int, ...], ...]
    progress: tuple[float, ...]
    roots: int
    packing: Packing
    fractional_units: float
    num_trees: int
    chunk_bytes: float
    booked: Schedule | None = field(default=None, compare=False, repr=False)   # its one-root booking, if made


def synthesize_trees(topology: Topology, collective_name: str, size_bytes: float, root: int | None = None,
                     options: SolverOptions = SolverOptions(), target: str = "executor",
                     chunks: int | None = None) -> TreesResult:
    """Tree-packing schedule for a non-Alltoall collective at ``size_bytes`` (nccl-tests' size).

    Parameters
    ----------
    topology : Topology
    collective_name : str
        Allgather, ReduceScatter, Allreduce, Broadcast, Reduce, Gather or Scatter (or an alias).
    size_bytes : float
        nccl-tests' size in bytes; chunks per rank and the order are chosen for it.
    root : int, optional
        Root of rooted collectives (default 0).
    options : SolverOptions
        HiGHS settings. Each packing MILP on one node explores at most :data:`MILP_NODES` branch-and-bound nodes
        (``options.time_limit_s`` stays a safety valve), so its answer does not depend on the machine's load (dgx1
        needs at most 331; under a 2 s wall-clock limit a loaded machine once cut dgx1 Allreduce's root LP short,
        98.9% of the limit instead of 99.4%); on several nodes, whose MILPs do not finish their root within
        seconds, it runs at most ``min(options.time_limit_s, MILP_SECONDS)`` seconds.
    target : str
        ``executor`` or ``legacy``: its steps-per-threadblock limit caps the chunks per rank.
    chunks : int, optional
        Chunks per rank (a power of two); default :func:`pipeline_chunks`.

    Raises
    ------
    InputError
        Alltoall (not a tree collective), a bad size, target or chunk count, or a disconnected topology.

    Examples
    --------
    >>> from synth.model.topology import load_topology
    >>> r = synthesize_trees(load_topology("ring-4"), "allgather", 4_000_000)
    >>> r.chunks_per_rank, round(r.fractional_us, 3)
    (256, 60.0)
    """
    name = normalize_name(collective_name)
    if name not in COLLECTIVES:
        raise InputError("--method", "", f"trees does not apply to {name}; use routed or timexp")
    if size_bytes <= 0:
        raise InputError("--size", "", f"size must be positive, got {size_bytes!r}")
    if target not in STEPS_PER_TB:
        raise InputError("--target", "", f"unknown target {target!r}; use executor or legacy")
    if chunks is not None and (chunks < 1 or chunks & (chunks - 1)):
        raise InputError("--chunks", "", f"chunks per rank must be a power of two, got {chunks}")
    check_connected(topology)
    t0 = time.perf_counter()
    one_node = topology.num_nodes == 1
    milp_options = replace(options, time_limit_s=options.time_limit_s if one_node else min(options.time_limit_s,
                                                                                            MILP_SECONDS),
                           node_limit=MILP_NODES if one_node else options.node_limit,
                           mip_gap=max(options.mip_gap, MIP_GAP))
    c = chunks or pipeline_chunks(topology, name, size_bytes, root)
    result = None
    while result is None:
        result = _solve(topology, name, size_bytes, root, milp_options, c, target)
        if result is None and (chunks or c == 1):
            raise InputError("--chunks", "", f"{c} chunks per rank put more messages on a connection than "
                             f"{MAX_CHANNELS} channels of {STEPS_PER_TB[target]} steps hold, or more steps on a "
                             f"rank than the runtimes' XML reader holds ({MAX_XML_ELEMENTS} elements); use fewer")
        c //= 2
    schedule = result.schedule
    notes = dict(schedule.notes)
    notes.update(method="trees", chunks_per_rank=result.chunks_per_rank, fractional_us=result.fractional_us,
                 integer_us=result.integer_us, trees=result.num_trees)
    return replace(result, schedule=replace(schedule, notes=notes), solve_seconds=time.perf_counter() - t0)


def pipeline_chunks(topology: Topology, collective_name: str, size_bytes: float, root: int | None = None) -> int:
    """The smallest power of two ``C`` (at most :data:`MAX_CHUNKS`) for which a chunk's store-and-forward trip
    over the hop diameter (chunk bytes over the slowest link, per hop) costs at most :data:`PIPELINE_SHARE` of
    the bandwidth bound: fewer chunks leave links idle while the first chunks travel, more only add messages."""
    name = normalize_name(collective_name)
    bound = lower_bound(name, topology, size_bytes, root=root)
    slowest = min(link.capacity_GBps for link in topology.links) * BYTES_PER_US_PER_GBPS
    hops = topology.num_ranks - 1 if name in ("broadcast", "reduce") else bound.hops   # chains, see _pack
    # the buffer holds ``per_chunk * c`` chunks for ``c`` per rank (making the collective for each ``c`` cost a
    # tenth of a tree solve)
    per_chunk = make_collective(name, topology.num_ranks, 1, root).size_chunks
    c = 1
    while c < MAX_CHUNKS:
        chunk_bytes = size_bytes / (per_chunk * c)
        if hops * chunk_bytes / slowest <= PIPELINE_SHARE * bound.bandwidth_us:
            break
        c *= 2
    return c


def rank_elements(schedule: Schedule, target: str = "executor") -> int:
    """The XML elements the busiest rank's load counts (:func:`backends.msccl.limits.xml_elements`) in the lowering
    that needs the fewest: plain, a step per message end (a send, a receive) and a threadblock per send or receive
    peer at least; or, where every chunk goes down a chain (:func:`_chain_forwards`), fused, one step fewer per
    chunk a rank forwards (``rcs``, ``rrs``) and a threadblock per ``target``'s steps per threadblock at least.

    The runtimes' XML reader holds :data:`~backends.msccl.limits.MAX_XML_ELEMENTS` per rank, so a finer packing
    cannot load as planned: dgx1 Broadcast and Reduce 1 GB with 2048 chunks per rank need some 4,100 steps on a
    relay in the plain lowering, and their files merged chunks in pairs or did not fit at all after a minute of
    trying; their trees branch, and fused chains of trees break the 64 steps per threadblock there. A chain
    (dgx2's) fuses into 32 channels of 64 steps per relay: 2048 chunks per rank, 99.3% of the limit against 98.6%
    with 1024. A tree's relays fuse one flow each instead (:func:`_flows_may_fuse`): dgx1 Broadcast and Reduce
    1 GB, 99.2% in 2048 chunks.

    >>> from synth.model.collectives import make_collective
    >>> from synth.schedule.ir import Transfer
    >>> ring = Schedule(make_collective("allgather", 3, 1), "ring-3",
    ...                 (Transfer(0, 0, 1, 0), Transfer(0, 1, 2, 1), Transfer(1, 1, 2, 0), Transfer(1, 2, 0, 1),
    ...                  Transfer(2, 2, 0, 0), Transfer(2, 0, 1, 1)), 2)
    >>> rank_elements(ring)   # the algo, 3 gpus, 1 tb; a receive-copy-send, a send, a receive (plain: 4 steps)
    8
    """
    edges: dict[int, list[tuple[int, int]]] = {}
    for t in schedule.transfers:
        edges.setdefault(t.chunk, []).append((t.src, t.dst))
    routes = Counter(tuple(e) for e in edges.values())
    return connection_elements(Counter((t.src, t.dst) for t in schedule.transfers), schedule.collective.num_ranks,
                                _chain_forwards(routes.items()), STEPS_PER_TB[target])


def _chain_forwards(routes) -> Counter | None:
    """Per rank, the chunks it receives and passes on, where every route (``(edges (src, dst), chunks)`` pairs) is
    a chain (each rank takes a chunk from one peer and passes it to at most one) and the chains pair a rank's peers
    alike (a chunk from ``u`` always goes on to ``w``, and a chunk to ``w`` always came from ``u``); None otherwise.

    Then the fused lowering holds them with a ``rcs``/``rrs`` step per forward: its chunks round robin over 32
    channels (:func:`backends.msccl.lowering.spread_index`), each set on one channel with a threadblock per rank and
    pair of peers, so a connection of 2048 messages takes 32 threadblocks of 64 steps."""
    forwards: Counter = Counter()
    out_of: dict[tuple[int, int], int] = {}     # (rank, in peer) -> out peer
    in_of: dict[tuple[int, int], int] = {}      # (rank, out peer) -> in peer
    for edges, count in routes:
        came_from: dict[int, int] = {}
        goes_to: dict[int, int] = {}
        for src, dst in edges:
            if dst in came_from or src in goes_to:
                return None
            came_from[dst] = src
            goes_to[src] = dst
        for rank, u in came_from.items():
            w = goes_to.get(rank)
            if w is None:
                continue
            if out_of.setdefault((rank, u), w) != w or in_of.setdefault((rank, w), u) != u:
                return None
            forwards[rank] += count
    return forwards


def _solve(topology, name, size_bytes, root, options, chunks, target) -> TreesResult | None:
    """The verified schedule with ``chunks`` per rank, or None when a connection would carry more messages than
    the target's threadblocks can hold over all channels, or a rank more elements than the runtimes' XML reader
    holds (:func:`rank_elements`), both known from the packings' routes before any scheduling."""
    problem = CollectiveProblem(topology, name, root, chunks)
    packed: dict = {}
    if not _routes_fit(_packings(problem, size_bytes, options, packed), topology.num_ranks, target,
                       _flows_may_fuse(topology, name, size_bytes, chunks)):
        return None
    schedule, phases = _schedule(problem, size_bytes, options, packed)
    report = verify(schedule, topology, size_bytes)
    chunk_bytes = phases[0].chunk_bytes
    frac = sum(p.fractional_units for p in phases) * chunk_bytes / BYTES_PER_US_PER_GBPS
    integer = sum(p.packing.units for p in phases) * chunk_bytes / BYTES_PER_US_PER_GBPS
    gaps = [p.packing.gap for p in phases]
    status = OPTIMAL if all(p.packing.status == OPTIMAL for p in phases) and all(
        g is not None and g <= MIP_GAP for g in gaps) else FEASIBLE
    gap = None if any(g is None for g in gaps) else max(gaps)
    return TreesResult(schedule, status, gap, chunks, frac, integer, report,
                       sum(p.num_trees for p in phases), 0.0)


@dataclass(frozen=True)
class _Packed:
    """A packing :func:`_schedule` makes a problem of, with the topology it was packed on (its links are the
    route indices) and whether that is the problem's topology reversed (a link ``a -> b`` then carries the
    schedule's transfers ``b -> a``)."""

    phase: _Phase
    topology: Topology
    reversed: bool

    def routes(self) -> list[tuple[tuple[tuple[int, int], ...], int]]:
        """The distinct routes as the schedule's edges ``(src, dst)``, each with its number of chunks."""
        links = self.topology.links
        ends = [(l.dst, l.src) if self.reversed else (l.src, l.dst) for l in links]
        return [(tuple(ends[li] for li in route), count) for route, count in Counter(self.phase.routes).items()]

    def connections(self) -> Counter:
        """Messages per connection ``(src, dst)`` of the schedule: one per chunk and link of its route."""
        per_link = Counter(li for route in self.phase.routes for li in route)
        ends = ((l.dst, l.src) if self.reversed else (l.src, l.dst) for l in self.topology.links)
        return Counter({pair: per_link[li] for li, pair in enumerate(ends) if per_link[li]})


def _packings(problem: CollectiveProblem, size_bytes: float, options: SolverOptions, packed: dict
              ) -> list[_Packed]:
    """The packings :func:`_schedule` makes ``problem`` of, kept in ``packed`` so that it does not solve them
    again."""
    if problem.collective in REVERSAL_OF:
        on = reverse_topology(problem.topology)
        dual = REVERSAL_OF[problem.collective]
        return [_Packed(_pack(on, dual, size_bytes, problem.root, problem.chunks_per_rank, options, packed), on,
                        True)]
    reduction = reduction_for(problem)
    if reduction is not None:
        return [p for sub in reduction.apply() for p in _packings(sub, size_bytes, options, packed)]
    return [_Packed(_pack(problem.topology, problem.collective, size_bytes, problem.root, problem.chunks_per_rank,
                          options, packed), problem.topology, False)]


def _flows_may_fuse(topology: Topology, name: str, size_bytes: float, chunks: int) -> bool:
    """Whether a plain lowering too long for the XML reader may have flows fused to fit it
    (:func:`backends.msccl.fit.fused_flow_fits`): a Broadcast or Reduce whose chunk takes at least a hop's alpha on the
    slowest link. Smaller chunks queue behind the runtime's FIFO whatever the lowering (dgx1 Broadcast 1 MB in 2048
    chunks of 512 bytes: 18.9 us simulated for a plan of 9.9, and 14 s of fitting), and the next chunk count down
    is the better try."""
    if name not in FUSED_FLOW_COLLECTIVES:
        return False
    chunk_bytes = make_collective(name, topology.num_ranks, chunks, 0).chunk_bytes(size_bytes)
    slowest = min(link.capacity_GBps for link in topology.links) * BYTES_PER_US_PER_GBPS
    return chunk_bytes / slowest >= max(link.alpha_us for link in topology.links)


def _routes_fit(packings: list[_Packed], num_ranks: int, target: str, fuse_flows: bool = False) -> bool:
    """Whether the schedule of these packings can be lowered: no connection carries more messages than the
    target's threadblocks hold over :data:`MAX_CHANNELS` channels, and no rank more elements than the runtimes'
    XML reader holds (counted as :func:`rank_elements` does, from the routes, before the list scheduler spends
    seconds on a chunk count that would be halved), or with ``fuse_flows`` (:func:`_flows_may_fuse`), none once
    flows are fused (:func:`_flow_fusion_fits`)."""
    per_connection: Counter = Counter()
    for p in packings:
        per_connection.update(p.connections())
    if max(per_connection.values()) > STEPS_PER_TB[target] * MAX_CHANNELS:
        return False
    routes = [route for p in packings for route in p.routes()]
    forwards = _chain_forwards(routes)
    if connection_elements(per_connection, num_ranks, forwards, STEPS_PER_TB[target]) <= MAX_XML_ELEMENTS:
        return True
    return fuse_flows and _flow_fusion_fits(per_connection, routes, num_ranks, STEPS_PER_TB[target])


def _flow_fusion_fits(per_connection: Counter, routes, num_ranks: int, steps_per_tb: int) -> bool:
    """Whether each rank's plain steps, on a threadblock per ``steps_per_tb`` messages of each connection, fit the
    XML reader once half the chunks of its largest flow (received from one peer and forwarded) are fused
    (:func:`backends.msccl.fit.fused_flow_fits`, which fuses only as many as it must): dgx1 Broadcast 1 GB, whose
    trees branch, in 2048 chunks (99.2% of the limit, 1024: 98.6%)."""
    ends: Counter = Counter()
    tbs: Counter = Counter()
    for (src, dst), messages in per_connection.items():
        for rank in (src, dst):
            ends[rank] += messages
            tbs[rank] += ceil(messages / steps_per_tb)
    flows: Counter = Counter()       # (rank, in peer) -> chunks it forwards
    for edges, count in routes:
        parent = {dst: src for src, dst in edges}
        for src in {src for src, _ in edges}:
            if src in parent:
                flows[(src, parent[src])] += count
    largest: Counter = Counter()
    for (rank, _), count in flows.items():
        largest[rank] = max(largest[rank], count)
    return all(xml_elements(num_ranks, tbs[r], ends[r]) - largest[r] // 2 <= MAX_XML_ELEMENTS
               for r in range(num_ranks))


def _schedule(problem: CollectiveProblem, size_bytes: float, options: SolverOptions, packed: dict
              ) -> tuple[Schedule, list[_Phase]]:
    """The problem's schedule and the packings it is made of. In-tree collectives (ReduceScatter, Reduce, and
    Gather with copies) pack and schedule their broadcast-type dual on the reversed topology, and every chunk
    takes the reversed trees, booked forward in time in the reversal's order
    (:func:`synth.schedule.list_scheduler.reverse_in_time`: the plan sees the order in which partial sums meet
    and the runtime's FIFOs; a Reduce, whose partial sums meet in one tree per chunk, is the exact reversal of
    its Broadcast); Allreduce is made of its parts (:func:`reduction_for`); the others are packed
    directly."""
    chunks = problem.chunks_per_rank
    topology = problem.topology
    if problem.collective in REVERSAL_OF:
        reversed_topology = reverse_topology(topology)
        dual = REVERSAL_OF[problem.collective]
        phase = _pack(reversed_topology, dual, size_bytes, problem.root, chunks, options, packed)
        dual_collective = make_collective(dual, topology.num_ranks, chunks, problem.root)
        if phase.roots == 1:
            # one root: the exact time reversal of the Broadcast as the runtime runs it (dgx1 Reduce 1 GB: 99.05%
            # of the limit, simulated 99.03% with each connection's messages in order; booked forward, 98.9%),
            # booked as the Broadcast is (_COPY_BOOKING)
            forward = phase.booked or list_schedule(reversed_topology, dual_collective, phase.routes, size_bytes,
                                                    "trees", fifo_depth=_COPY_BOOKING, **_by_progress(phase))
            if phase.packing.relay_stars:
                # a relay adds the n - 2 other ranks' parts of a chunk one after the other, which the exact
                # reversal does not see: dgx-a100 Reduce 1 MB planned at 6.32 us that way ran at 6.91 us;
                # booked forward with the runtime's FIFOs, planned 6.42 us, it runs at 6.27 us
                return reverse_in_time(forward, topology, _collective(problem, chunks), size_bytes, "trees",
                                       rule="rank"), [phase]
            return reverse_schedule(forward, _collective(problem, chunks), topology.name), [phase]
        forward = list_schedule(reversed_topology, dual_collective, phase.routes, size_bytes, "trees",
                                fifo_depth=None, **_by_progress(phase))
        return reverse_in_time(forward, topology, _collective(problem, chunks), size_bytes, "trees",
                               rule="rank"), [phase]
    reduction = reduction_for(problem)
    if reduction is not None:
        solved = [_schedule(sub, size_bytes, options, packed) for sub in reduction.apply()]
        return reduction.invert([s for s, _ in solved]), [p for _, phases in solved for p in phases]
    phase = _pack(topology, problem.collective, size_bytes, problem.root, chunks, options, packed)
    return phase.booked or list_schedule(topology, _collective(problem, chunks), phase.routes, size_bytes, "trees",
                                         fifo_depth=_COPY_BOOKING, **_by_progress(phase)), [phase]


def _by_progress(phase: _Phase) -> dict:
    """How the list scheduler orders the packing's transfers. Every chunk's rank is its progress through its tree
    (``(q + 1/2) / n`` for the q-th of a tree's n chunks), so the trees sharing a link take turns in proportion to
    their chunks instead of the deepest tree going first and starving the others' links. With one root
    (Broadcast, and Reduce through it) that progress is a due time at the busiest-resource rate and the scheduler
    books the least slack first (``rule="deadline"``: due time minus the remaining path), so chunks of deep trees
    leave the root early (dgx1 Broadcast 1 GB: 98.3% of the limit with longest-path-first on chains, 99.05% on
    shallow trees by slack). With a root per rank the longest-path rule keeps every rank's trees flowing, and
    progress only breaks its ties (dgx1 Allgather 1 GB: 99.5% against 99.4% by slack)."""
    if phase.roots > 1:
        rank = np.array([phase.progress[c] for c, route in enumerate(phase.routes) for _ in route])
        return dict(rank=rank, rule="work")
    due_us = phase.packing.units * phase.chunk_bytes / BYTES_PER_US_PER_GBPS
    rank = np.array([phase.progress[c] * due_us for c, route in enumerate(phase.routes) for _ in route])
    return dict(rank=rank, rule="deadline")


def _collective(problem: CollectiveProblem, chunks: int):
    return make_collective(problem.collective, problem.topology.num_ranks, chunks, problem.root)


def _pack(topology: Topology, name: str, size_bytes: float, root, chunks: int, options: SolverOptions,
          packed: dict | None = None) -> _Phase:
    """Pack, integerize and decompose one broadcast-type collective on ``topology`` into every chunk's out-tree;
    ``packed`` keeps the phases made for one request by their links: an Allreduce's ReduceScatter packs an
    Allgather on the reversed topology, which on a machine with links both ways is its Allgather's packing again
    (dgx1: a second MILP and decomposition, 0.6 s).

    The fractional optimum is taken from the max-flow bound (equal to the packing LP, which the tests check on
    every built-in topology, and much faster than the LP on a switch's all-pairs links)."""
    key = (topology.links, topology.switches, name, root, chunks)
    if packed is not None and key in packed:
        return packed[key]
    phase = _pack_once(topology, name, size_bytes, root, chunks, options)
    if packed is not None:
        packed[key] = phase
    return phase


def _pack_once(topology: Topology, name: str, size_bytes: float, root, chunks: int, options: SolverOptions
               ) -> _Phase:
    """The packing MILP's link loads, decomposed into trees; for a Broadcast whose spanning trees can be listed,
    also its shallowest optimal trees (:func:`~synth.formulations.trees.shallow_packing`) and, where a level costs
    more than the rate wins, shallower ones (:func:`~synth.formulations.trees.shallow_packings`), and the phase
    whose booking (as :func:`_schedule` books it) ends first. Neither wins everywhere: shallow trees take dgx1
    Broadcast 1 GB from 97.8% to 98.6% of the limit from GPU 0, while from GPU 3 or 5 the decomposition's
    trees are faster (98.0% and 98.3%, shallow 96.9% and 96.7%).

    On a switch the shallow trees are relay stars (two hops where the chain takes n - 1), booked
    with the runtime's FIFOs, which pace their many messages per connection: booked with unbounded buffers they
    were chosen over the chain at 64 MB on dgx-a100, and ran 1.7% slower (233.8 us against 229.9 us)."""
    commodities = broadcast_commodities(name, topology.num_ranks, root)
    group = free_symmetry_group(topology) if name == "allgather" else ()
    coll = make_collective(name, topology.num_ranks, chunks, root)
    bound_us = bandwidth_bound_us(name, topology, size_bytes, root)[0]
    fractional_units = bound_us * BYTES_PER_US_PER_GBPS / coll.chunk_bytes(size_bytes)
    packing = solve_packing(topology, commodities, chunks, integer=True, group=group, options=options,
                            floor_units=fractional_units, fewest_links=name == "broadcast",
                            start_trees=_ring_chain(topology, commodities) if name == "broadcast" else None)
    roots = len(commodities)
    phase = _phase(topology, name, coll, packing, [decompose(topology, rep, packing.counts[k], chunks)
                                                    for k, rep in enumerate(packing.commodities)],
                   roots, fractional_units, size_bytes)
    if name != "broadcast":
        return phase
    phase = _booked(topology, coll, phase, size_bytes)
    # near the bandwidth bound on a switch the relay stars have little to win (dgx2 1 GB: they took 1.1 s to lose)
    near = bool(topology.switches) and _end_us(phase.booked) <= bound_us * (1 + RELAY_STARS_NOT_NEEDED)
    chunk_bytes = coll.chunk_bytes(size_bytes)
    hop_us = max(link.alpha_us + chunk_bytes / (link.capacity_GBps * BYTES_PER_US_PER_GBPS)
                 for link in topology.links)
    shallow = shallow_packings(topology, commodities[0], chunks, fractional_units, options, relay_stars=not near,
                               unit_us=chunk_bytes / BYTES_PER_US_PER_GBPS, hop_us=hop_us)
    # the shallowest trees at the rate, booked even with a few more units (at 2048 chunks the shallow trees' 13.68
    # units against 13.66 end 9 us sooner, 99.2% of the limit); shallower ones only where they end sooner
    for k, (packing, trees) in enumerate(shallow):
        other = _booked(topology, coll, _phase(topology, name, coll, packing, [trees], roots, fractional_units,
                                               size_bytes), size_bytes,
                        RUNTIME_FIFO_DEPTH if packing.relay_stars else _COPY_BOOKING)
        if _end_us(other.booked) < _end_us(phase.booked) or (k == 0 and _end_us(other.booked) == _end_us(
                phase.booked)):
            phase = other
    return phase


# A Broadcast packing on a switch booked within this share of the bandwidth bound is not compared with relay stars,
# which cannot beat the bound either: dgx2 1 GB books the chain 0.74% above it, and the relay stars end later (as on
# dgx-a100 and dgx-h100, 64 MB and 1 GB). On all-pairs links without a switch they still win there, since the
# chain's file runs behind its plan: fully-connected-8 Broadcast 1 GB simulates at 99.17% of the limit with them,
# 98.83% without. (Listed arborescences are cheap and still compared: at 1 GB they take dgx1 to 99%.)
RELAY_STARS_NOT_NEEDED = 0.01


def _phase(topology: Topology, name: str, coll, packing: Packing, trees_of, roots: int, fractional_units: float,
           size_bytes: float) -> _Phase:
    """Every chunk's route and progress from a packing and its representatives' trees (``trees_of[k]``);
    ``roots``: the demand's commodities (a symmetric packing solves fewer representatives)."""
    chunks = packing.chunks
    routes: list[tuple[int, ...]] = [()] * len(coll.chunks)
    progress = [0.0] * len(coll.chunks)
    num_trees = 0
    for k, rep in enumerate(packing.commodities):
        for perm in packing.images[k]:
            image = Commodity(perm[rep.root], tuple(perm[s] for s in rep.sinks))
            ids = _chunk_ids(name, image, chunks)
            j = 0
            for tree in trees_of[k]:
                links = tuple(topology.link_index[(perm[topology.links[li].src], perm[topology.links[li].dst])]
                              for li in tree.links)
                for q in range(tree.chunks):
                    routes[ids[j]] = links
                    progress[ids[j]] = (q + 0.5) / tree.chunks
                    j += 1
                num_trees += 1
    return _Phase(tuple(routes), tuple(progress), roots, packing, fractional_units, num_trees,
                  coll.chunk_bytes(size_bytes))


def _booked(topology: Topology, coll, phase: _Phase, size_bytes: float, fifo_depth: int | None = _COPY_BOOKING
            ) -> _Phase:
    """The one-root phase with its booking as :func:`_schedule` makes it (a Broadcast, or the forward schedule a
    Reduce reverses), which :func:`_schedule` then takes instead of booking it again."""
    return replace(phase, booked=list_schedule(topology, coll, phase.routes, size_bytes, "trees",
                                               fifo_depth=fifo_depth, **_by_progress(phase)))


def _end_us(schedule: Schedule) -> float:
    return max(t.end_us for t in schedule.transfers)


def _ring_chain(topology: Topology, commodities) -> tuple[tuple[int, ...], ...] | None:
    """For a Broadcast, the chain from the root along the topology's ring (which attains the bound on a switch,
    where every port then serves each chunk once), or None without a ring."""
    ring = find_ring(topology)
    if ring is None:
        return None
    root = commodities[0].root
    at = ring.index(root)
    order = ring[at:] + ring[:at]
    return (tuple(topology.link_index[(a, b)] for a, b in zip(order, order[1:])),)


def _chunk_ids(name: str, commodity: Commodity, chunks: int) -> list[int]:
    """Chunk ids of :func:`synth.model.collectives.make_collective` that a commodity's chunks are."""
    if name == "allgather":
        return [commodity.root * chunks + j for j in range(chunks)]
    if name == "scatter":
        return [commodity.sinks[0] * chunks + j for j in range(chunks)]
    return list(range(chunks))
