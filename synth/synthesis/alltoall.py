"""Alltoall by integerized path flows (issue 11): the multi-commodity LP's paths, a power-of-two number of chunks
per (source, destination) pair assigned to them by a small MILP, scheduled with the runtime's FIFO depth.

1. **paths**: for every ordered pair of ranks, its simple paths of at most one hop more than the fewest
   (at most :data:`MAX_PATHS`, fastest first); a link through a switch is one hop that also uses the switch's
   two ports (:func:`synth.formulations.routes.resource_keys`).
2. **LP**: the multi-commodity flow over those paths, every pair sending its block, minimising the busiest
   resource's time; its value is the concurrent-flow bound of :mod:`synth.bounds.physical` when the paths
   suffice (one hop of detour does on the built-in machines).
3. **integerize**: ``C`` chunks per pair (a power of two, so ``nchunksperloop`` divides the power-of-two element
   counts the runtimes see) on the paths the LP uses, by a MILP minimising the busiest resource
   (started from the LP's largest-remainder rounding; at most :data:`MILP_SECONDS`).
4. **schedule**: each chunk follows its path; :func:`synth.schedule.list_scheduler.list_schedule` orders and
   times them with the runtime's FIFO depth, and the replay verifies the result.

Times in microseconds, sizes in bytes, bandwidths in GB/s.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from synth.errors import InputError, SolverError
from synth.formulations.routes import resource_keys
from synth.model.collectives import make_collective
from synth.model.symmetry import free_symmetry_group
from synth.model.topology import Topology, check_connected
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.ir import Schedule
from synth.schedule.list_scheduler import list_schedule
from synth.schedule.replay import ReplayReport, verify
from synth.solver.highs import FEASIBLE, OPTIMAL, Model, SolverOptions, solve_model

MAX_PATHS = 8                 # per pair: the fewest-hop paths and one-hop detours, fastest first
MILP_SECONDS = 2.0
MIP_GAP = 0.002
PIPELINE_SHARE = 0.01         # of the busiest resource's time, for one chunk's trip (see chunk_options)
MAX_CHUNKS = 64
MESSAGES_PER_CONNECTION = {"executor": 64 * 4, "legacy": 256 * 4}   # steps per tb x a few channels


@dataclass(frozen=True)
class PathFlows:
    """Candidate paths of every pair and the chunks each carries.

    ``paths[k]`` are link-index tuples of pair ``pairs[k]``; ``chunks[k][p]`` how many of the pair's chunks
    take path ``p`` (reals from the LP, integers from the MILP); ``busiest`` the busiest resource's time in
    units of (chunk / GB/s)."""

    pairs: tuple[tuple[int, int], ...]
    paths: tuple[tuple[tuple[int, ...], ...], ...]
    chunks: tuple[tuple[float, ...], ...]
    busiest: float
    status: str
    gap: float | None


@dataclass(frozen=True)
class AlltoallResult:
    """A verified Alltoall schedule and its integer path flows.

    ``fractional_us`` / ``integer_us``: the busiest resource's time at the size for the LP and the MILP;
    ``replay`` the schedule's verification by replay at the size (``replay_us``: its time; all microseconds)."""

    schedule: Schedule
    status: str
    gap: float | None
    chunks_per_pair: int
    fractional_us: float
    integer_us: float
    replay: ReplayReport
    solve_seconds: float

    @property
    def replay_us(self) -> float:
        return self.replay.time_us


def candidate_paths(topology: Topology, src: int, dst: int, limit: int = MAX_PATHS) -> tuple[tuple[int, ...], ...]:
    """Simple paths ``src -> dst`` (link indices) with at most one hop more than the fewest, fastest first
    (by alpha plus a unit of data over each hop's bandwidth), at most ``limit``.

    >>> from synth.model.topology import load_topology
    >>> ring = load_topology("ring-4")
    >>> [[(ring.links[li].src, ring.links[li].dst) for li in p] for p in candidate_paths(ring, 0, 2)]
    [[(0, 1), (1, 2)], [(0, 3), (3, 2)]]
    """
    out_links: dict[int, list[int]] = {}
    for i, link in enumerate(topology.links):
        out_links.setdefault(link.src, []).append(i)
    hops = _hops_to(topology, dst)
    if src not in hops:
        raise InputError(topology.source, "links", f"rank {dst} cannot be reached from rank {src}; add links")
    budget = hops[src] + 1
    found: list[tuple[int, ...]] = []

    def walk(at: int, used: tuple[int, ...], seen: frozenset) -> None:
        if at == dst:
            found.append(used)
            return
        for li in out_links.get(at, ()):
            nxt = topology.links[li].dst
            if nxt not in seen and nxt in hops and len(used) + 1 + hops[nxt] <= budget:
                walk(nxt, used + (li,), seen | {nxt})

    walk(src, (), frozenset([src]))

    def cost(path):
        return (len(path), sum(topology.links[li].alpha_us + 1.0 / topology.links[li].capacity_GBps
                               for li in path), path)

    return tuple(sorted(found, key=cost)[:limit])


def _hops_to(topology: Topology, dst: int) -> dict[int, int]:
    into: dict[int, list[int]] = {}
    for link in topology.links:
        into.setdefault(link.dst, []).append(link.src)
    hops, frontier = {dst: 0}, [dst]
    while frontier:
        nxt = []
        for v in frontier:
            for u in into.get(v, ()):
                if u not in hops:
                    hops[u] = hops[v] + 1
                    nxt.append(u)
        frontier = nxt
    return hops


def solve_path_flows(topology: Topology, chunks: int, integer: bool, options: SolverOptions = SolverOptions(),
                     paths: tuple[tuple[tuple[int, ...], ...], ...] | None = None,
                     start: np.ndarray | None = None) -> PathFlows:
    """The LP (``integer=False``) or MILP over the pairs' candidate paths: every pair sends ``chunks`` chunks,
    the busiest resource's load (chunks / GB/s) is minimised. ``paths`` restricts the paths (default
    :func:`candidate_paths`); ``start`` is a feasible integer point (chunks per path, flattened)."""
    n = topology.num_ranks
    pairs = tuple((s, d) for s in range(n) for d in range(n) if s != d)
    if paths is None:
        paths = tuple(candidate_paths(topology, s, d) for s, d in pairs)
    per_link, bandwidth = resource_keys(topology)
    resources = {key: k for k, key in enumerate(sorted(bandwidth, key=repr))}
    columns = [(k, p) for k, ps in enumerate(paths) for p in range(len(ps))]
    num = len(columns)
    rows, cols, vals = [], [], []
    for j, (k, p) in enumerate(columns):           # each pair sends all its chunks
        rows.append(k)
        cols.append(j)
        vals.append(1.0)
    base = len(pairs)
    for j, (k, p) in enumerate(columns):           # load of every resource <= T * bandwidth
        load = Counter()
        for li in paths[k][p]:
            for key in per_link[li]:
                load[key] += 1
        for key, count in load.items():
            rows.append(base + resources[key])
            cols.append(j)
            vals.append(count / bandwidth[key])
    t_col = num
    for key, r in resources.items():
        rows.append(base + r)
        cols.append(t_col)
        vals.append(-1.0)
    cost = np.zeros(num + 1)
    cost[t_col] = 1.0
    model = Model(cost, np.zeros(num + 1), np.full(num + 1, np.inf),
                  np.array([integer] * num + [False]), np.array(rows), np.array(cols), np.array(vals, dtype=float),
                  np.concatenate([np.full(base, float(chunks)), np.full(len(resources), -np.inf)]),
                  np.concatenate([np.full(base, float(chunks)), np.zeros(len(resources))]))
    initial = None
    if start is not None:
        initial = np.append(start, _busiest(model, start))
    result = solve_model(model, options, initial=initial)
    if result.x is None:
        raise SolverError(f"the alltoall path-flow {'MILP' if integer else 'LP'} found no solution "
                          f"({result.highs_status})")
    x = np.round(result.x[:num]) if integer else result.x[:num]
    flows, j = [], 0
    for ps in paths:
        flows.append(tuple(float(v) for v in x[j:j + len(ps)]))
        j += len(ps)
    return PathFlows(pairs, paths, tuple(flows), _busiest(model, x), result.status, result.gap)


def _busiest(model: Model, x: np.ndarray) -> float:
    """The busiest resource's load of the path flows ``x`` (the smallest feasible T)."""
    t_col = model.num_cols - 1
    keep = model.cols != t_col
    loads = np.zeros(model.num_rows)
    np.add.at(loads, model.rows[keep], model.vals[keep] * x[model.cols[keep]])
    resource_rows = np.isinf(model.row_lower)
    return float(loads[resource_rows].max(initial=0.0))


def _round(fractional: PathFlows, chunks: int) -> tuple[tuple[tuple[tuple[int, ...], ...], ...], np.ndarray]:
    """The paths the LP uses (each pair's fastest path when it uses none) and its largest-remainder rounding to
    ``chunks`` per pair, flattened."""
    used, start = [], []
    for ps, flow in zip(fractional.paths, fractional.chunks):
        keep = [p for p, f in enumerate(flow) if f > 1e-6] or [0]
        share = np.array([flow[p] for p in keep])
        share = share / share.sum() * chunks if share.sum() > 0 else np.full(len(keep), chunks / len(keep))
        whole = np.floor(share + 1e-9)
        for p in np.argsort(-(share - whole), kind="stable")[:int(chunks - whole.sum())]:
            whole[p] += 1
        used.append(tuple(ps[p] for p in keep))
        start.extend(whole)
    return tuple(used), np.array(start)


def chunk_options(topology: Topology, size_bytes: float, target: str = "executor") -> list[int]:
    """Chunks per pair worth trying: the fewest (a power of two) for which one chunk's store-and-forward trip over
    two hops of the slowest link costs at most :data:`PIPELINE_SHARE` of an even spread of the traffic, and
    fewer (4 and 1), all keeping every connection within the target's messages."""
    n = topology.num_ranks
    slowest = min(link.capacity_GBps for link in topology.links) * BYTES_PER_US_PER_GBPS
    total = sum(link.capacity_GBps for link in topology.links) * BYTES_PER_US_PER_GBPS
    spread_us = size_bytes * (n - 1) / total       # every rank's n-1 blocks over every link, one hop
    block = size_bytes / n
    c = 1
    while c < MAX_CHUNKS and 2 * block / c / slowest > PIPELINE_SHARE * spread_us:
        c *= 2
    # a connection carries at most (pairs through it) x c messages; n - 1 pairs per link is a safe estimate
    while c > 1 and (n - 1) * c > MESSAGES_PER_CONNECTION[target]:
        c //= 2
    return sorted({c} | {x for x in (4, 1) if x < c}, reverse=True)


def synthesize_alltoall(topology: Topology, size_bytes: float, chunks: int,
                        options: SolverOptions = SolverOptions()) -> AlltoallResult:
    """A verified Alltoall schedule with ``chunks`` (a power of two) per (source, destination) pair.

    Examples
    --------
    >>> from synth.model.topology import load_topology
    >>> r = synthesize_alltoall(load_topology("ring-4"), 1 << 20, 2)
    >>> r.chunks_per_pair, r.integer_us >= r.fractional_us * (1 - 1e-9)
    (2, True)
    """
    if chunks < 1 or chunks & (chunks - 1):
        raise InputError("--chunks", "", f"chunks per pair must be a power of two, got {chunks}")
    if size_bytes <= 0:
        raise InputError("--size", "", f"size must be positive, got {size_bytes!r}")
    check_connected(topology)
    t0 = time.perf_counter()
    n = topology.num_ranks
    coll = make_collective("alltoall", n, chunks)
    milp = replace(options, time_limit_s=min(options.time_limit_s, MILP_SECONDS),
                   mip_gap=max(options.mip_gap, MIP_GAP))
    fractional = solve_path_flows(topology, chunks, integer=False, options=options)
    used, start = _round(fractional, chunks)
    integer = solve_path_flows(topology, chunks, integer=True, options=milp, paths=used, start=start)
    routes: list[tuple[int, ...]] = [()] * len(coll.chunks)
    for (s, d), ps, flow in zip(integer.pairs, integer.paths, integer.chunks):
        j = 0
        for path, count in zip(ps, flow):
            for _ in range(int(count)):
                routes[(s * n + d) * chunks + j] = path
                j += 1
    schedule = list_schedule(topology, coll, routes, size_bytes, "alltoall-paths",
                             notes={"method": "alltoall-paths", "chunks_per_pair": chunks})
    report = verify(schedule, topology, size_bytes)
    unit_us = coll.chunk_bytes(size_bytes) / BYTES_PER_US_PER_GBPS
    status = OPTIMAL if integer.status == OPTIMAL and (integer.gap or 0.0) <= MIP_GAP else FEASIBLE
    gap = None if math.isinf(integer.busiest) else integer.busiest / fractional.busiest - 1
    return AlltoallResult(schedule, status, gap, chunks, fractional.busiest * unit_us, integer.busiest * unit_us,
                          report, time.perf_counter() - t0)


def alltoall_candidates(request, progress):
    """The path-flow schedules for an open Alltoall request, as candidates of
    :func:`synth.synthesis.select.verified_candidates` (one per chunk count of :func:`chunk_options`)."""
    from synth.synthesis.select import PATHS_LABEL, Candidate
    from synth.synthesis.steps import SynthesisResult

    counts = [request.chunks] if request.chunks else chunk_options(request.topology, request.size_bytes,
                                                                   request.target)
    found = []
    for chunks in counts:
        result = synthesize_alltoall(request.topology, request.size_bytes, chunks, request.options)
        schedule = result.schedule
        report = result.replay    # verified by replay at the request's size
        progress(f"  alltoall paths C={chunks}: {report.time_us:.2f} us")
        found.append(Candidate(f"{PATHS_LABEL}c{chunks}",
                               SynthesisResult(schedule, result.status, result.solve_seconds, result.gap,
                                               len(free_symmetry_group(request.topology)), schedule.steps, None,
                                               chunks), report))
    return found
