"""The crossing bound: a latency bound for machines of several nodes that counts what must cross a node's NIC
ports, with what can be summed before and fanned out after the crossing.

The direct bound (:func:`synth.bounds.physical.direct_bound_us`) stops where relaying becomes possible: on two
ndv2 nodes an Allreduce's data can be relayed once NVLink's alpha (0.7 us) and the NIC's (1.3 us) fit, so it gives
2.0 us at 1 KB. Relaying is not free, though. Data that crosses soon after it starts is one input, and reaches
one GPU on the far side in time; a sum of five inputs exists only after an NVLink hop, and one message serves
the GPUs around its receiver only if there is time for another hop after it lands. Every byte that crosses still
goes through one 12.5 GB/s port. Counting what each byte can carry gives the bound.

For a node ``X``, its sources ``S`` (ranks of ``X`` whose data is needed outside it) and the destinations ``D``
outside it that need them: every (source, destination) pair needs, for each byte of the pair's data, a first
message leaving ``X``. That message leaves a rank ``v`` of ``X`` at ``s`` and lands at a rank ``r`` outside at
``a``, so each of its bytes holds the sum of at most ``A(s)`` sources (those within an alpha path ``s`` of ``v``)
and reaches at most ``F(T - a)`` destinations (those within an alpha path ``T - a`` of ``r``). Its port time lies
in ``[s, a - alpha]`` (the cost model: a port is held ``bytes / port bandwidth`` from the start, and the message
lands ``alpha + bytes / link bandwidth`` after it, where the link is no faster than the port), and the port
serves one message at a time. An LP books bytes into classes (the steps of ``A`` and ``F``) under those windows
and maximises what they cover; the bound is the least ``T`` at which that reaches ``|S| |D|`` times the pair's
bytes. Allgather's bytes are not summed (a byte holds one source), ReduceScatter's are not fanned out (a byte is
one destination's), and Alltoall's, Gather's and Scatter's are neither: there the bound is the bytes that cross
through the ports plus a crossing's latency (2 x dgx-h100 Scatter 1 MB: 2.0 us + 512 KB through 8 NICs of
50 GB/s = 3.31 us, where the bandwidth bound leaves the latency out and the direct bound stops at 2.6 us).

On two ndv2 nodes the 1 KB Allreduce's bound is 2.505 us (the direct bound: 2.0 us).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from synth.model.collectives import ROOTED, data_pairs, normalize_name, pair_bytes
from synth.model.topology import Topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.solver.highs import solve_lp

CROSSING_MAX_RANKS = 128     # the bound compares every pair of ranks' alpha paths: N^2 entries
CROSSING_MAX_CLASSES = 400   # (steps of A) x (steps of F) per port; past it the bound is not computed
CROSSING_TOLERANCE_US = 1e-6     # the bisection's precision; the bound returned is its lower end


@dataclass(frozen=True)
class PortCrossing:
    """One resource that a node's outgoing messages queue on (a NIC egress port, or a direct link), as the
    crossing bound sees it.

    ``sums[k]`` sources can be summed in a message that starts at or after ``starts[k]`` (us), and a message that
    lands at least ``reaches[j]`` before the end can serve ``fans[j]`` destinations. ``capacity`` is the port's
    bytes per us and ``alpha_us`` the least alpha of the links through it."""

    capacity: float
    alpha_us: float
    starts: tuple[float, ...]
    sums: tuple[int, ...]
    reaches: tuple[float, ...]
    fans: tuple[int, ...]


# How one byte covers pairs: (summed, fanned out). Allgather's bytes hold one source each, ReduceScatter's serve
# one destination each, a personalised collective's byte is one pair's.
_KINDS = {"allreduce": (True, True), "broadcast": (True, True), "reduce": (True, True),
          "allgather": (False, True), "reducescatter": (True, False),
          "alltoall": (False, False), "gather": (False, False), "scatter": (False, False)}


def crossing_bound_us(collective_name: str, topology: Topology, size_bytes: float, root: int | None,
                      lower_us: float, alpha_paths: np.ndarray | None = None) -> float:
    """The crossing bound (module docstring), microseconds: ``lower_us`` (a bound already known) where it gives
    no more, on one node and over :data:`CROSSING_MAX_RANKS` ranks; a node is skipped where a link leaving it is
    faster than its port or its steps are too many. ``alpha_paths``: every pair's shortest alpha path, where the
    caller has it.

    >>> from synth.model.topology import load_topology
    >>> round(crossing_bound_us("allreduce", load_topology("ndv2", nodes=2), 1024, None, 2.0), 3)
    2.505
    """
    name = normalize_name(collective_name)
    n = topology.num_ranks
    if name not in _KINDS or topology.num_nodes < 2 or n > CROSSING_MAX_RANKS or (name in ROOTED and root is None):
        return lower_us
    summed, fanned = _KINDS[name]
    pairs = data_pairs(name, n, root)
    distance = topology.distances(range(n), topology.link_arrays().alpha_us) if alpha_paths is None \
        else alpha_paths
    bound = lower_us
    for node in range(topology.num_nodes):
        inside = set(range(node * topology.gpus_per_node, (node + 1) * topology.gpus_per_node))
        leaving = [(src, dst) for src, dst in pairs if src in inside and dst not in inside]
        if not leaving:
            continue
        sources, destinations = sorted({src for src, _ in leaving}), sorted({dst for _, dst in leaving})
        ports = _port_crossings(topology, inside, sources, destinations, distance, summed, fanned)
        if ports is None:
            continue
        need = len(leaving) * pair_bytes(name, size_bytes, n)
        bound = max(bound, _least_time(ports, need, bound))
    return bound


def _port_crossings(topology: Topology, inside: set[int], sources: list[int], destinations: list[int],
                    distance: np.ndarray, summed: bool, fanned: bool) -> tuple[PortCrossing, ...] | None:
    """What leaves the node, by the resource its messages queue on: an egress port (a NIC), or a direct link
    itself (TE-CCL's models join nodes by links). None where the bound does not apply: a link faster than its
    port, or too many steps."""
    senders: dict[object, set[int]] = {}
    receivers: dict[object, set[int]] = {}
    alphas: dict[object, float] = {}
    capacities: dict[object, float] = {}
    port_capacity = topology.port_capacity()
    for index, link in enumerate(topology.links):
        if link.src not in inside or link.dst in inside:
            continue
        port = link.sender_port
        if port is None:
            key, capacity = ("link", index), link.capacity_GBps
        else:
            key, capacity = port, port_capacity[port]
            if link.capacity_GBps > capacity * (1 + 1e-12):
                return None
        senders.setdefault(key, set()).add(link.src)
        receivers.setdefault(key, set()).add(link.dst)
        alphas[key] = min(alphas.get(key, math.inf), link.alpha_us)
        capacities[key] = capacity
    found = []
    for key in sorted(senders, key=str):
        starts, sums = _steps(distance[np.ix_(sources, sorted(senders[key]))].T, summed)
        reaches, fans = _steps(distance[np.ix_(sorted(receivers[key]), destinations)], fanned)
        if len(starts) * len(reaches) > CROSSING_MAX_CLASSES:
            return None
        found.append(PortCrossing(capacities[key] * BYTES_PER_US_PER_GBPS, alphas[key], starts, sums, reaches, fans))
    return tuple(found)


def _steps(reach: np.ndarray, counted: bool) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """For ``reach[row, col]`` the alpha path from a row's rank to a column's (or back), the step function
    ``t -> max over rows of the columns within t``: its steps' times and values (1 once any column is within
    reach, where the bytes are not ``counted`` this way)."""
    times = sorted({float(t) for t in reach.ravel() if math.isfinite(t)})
    values = [int((reach <= t).sum(axis=1).max()) if counted else 1 for t in times]
    keep = [k for k in range(len(times)) if k == 0 or values[k] > values[k - 1]]
    return tuple(times[k] for k in keep), tuple(values[k] for k in keep)


def _least_time(ports: tuple[PortCrossing, ...], need: float, lower_us: float) -> float:
    """The least ``T >= lower_us`` at which the ports' classes can cover ``need`` (bisection; each step an LP)."""
    if _coverage(ports, lower_us) >= need:
        return lower_us
    step = max(lower_us, 1.0)
    high = lower_us + step
    while _coverage(ports, high) < need:
        step *= 2
        high = lower_us + step
    low = max(lower_us, high - step)
    while high - low > CROSSING_TOLERANCE_US * max(1.0, high):
        mid = (low + high) / 2
        if _coverage(ports, mid) >= need:
            high = mid
        else:
            low = mid
    return low


@lru_cache(maxsize=4096)
def _coverage(ports: tuple[PortCrossing, ...], end_us: float) -> float:
    """The most (source, destination) byte pairs the ports' messages can cover by ``end_us``: an LP over the
    bytes of each (port, start step, reach step) class, under one window constraint per port and pair of steps
    (the bytes of the classes starting no sooner and landing no later fit in the port's time between)."""
    cost, rows, cols, vals, upper = [], [], [], [], []
    for port in ports:
        first = len(cost)
        classes = [(k, j) for k in range(len(port.starts)) for j in range(len(port.reaches))
                   if port.starts[k] + port.alpha_us < end_us - port.reaches[j]]
        for k, j in classes:
            cost.append(-float(port.sums[k] * port.fans[j]))
        for k0, j0 in classes:
            row = len(upper)
            window = end_us - port.reaches[j0] - port.starts[k0] - port.alpha_us
            upper.append(port.capacity * window)
            for col, (k, j) in enumerate(classes, start=first):
                if k >= k0 and j >= j0:
                    rows.append(row)
                    cols.append(col)
                    vals.append(1.0)
    if not cost:
        return 0.0
    optimum = solve_lp(cost, rows, cols, vals, np.full(len(upper), -np.inf), upper, "the crossing bound LP")
    return -optimum
