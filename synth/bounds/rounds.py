"""A lower bound on rounds per chunk (R/C) for the step formulation, from fluid flow LPs (DESIGN section 6).

In the step model a link with ``lanes`` lanes carries at most ``lanes`` chunks per round and a switch port at
most its port capacity (the same count :mod:`synth.formulations.steps` uses). In any schedule with R rounds and C
chunks per rank, every chunk a rank needs travels from a source to that rank, so:

- **per destination** ``t``: the chunks ``t`` needs flow from their sources into ``t`` with each link used at most
  ``lanes * R`` times. For Allgather this gives the in-lane bound ``(n-1)/in_lanes(t)``, for Broadcast
  ``1/maxflow(root -> t)``; any cut separating sources from ``t`` is respected.
- **all chunks together** when every chunk has a single destination (Alltoall, Gather, Scatter): one send
  carries one chunk, so all the paths share the capacity: a maximum concurrent multi-commodity flow. For DGX-1
  Alltoall this is the bisection bound 8/3 (16 chunks over 6 lanes per direction).

Relaxing paths to fluid flows gives LPs (solved with HiGHS through :func:`synth.solver.highs.solve_model`) whose optimum
``T`` is the least rounds for one chunk per rank; flows scale with C, so ``R / C >= T``. Combining collectives use
their dual (ReduceScatter: Allgather on the reversed topology; Reduce: Broadcast reversed) as
:mod:`synth.synthesis.steps` does; Allreduce is ReduceScatter then Allgather with ``R/2`` rounds each, so its bound is
``2 * max`` of the two.

>>> from synth.model.topology import load_topology
>>> round(rounds_per_chunk_bound(load_topology("ring-4"), "allgather"), 6)
1.5
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from synth.model.collectives import Collective, make_collective, normalize_name
from synth.formulations.steps import _port_caps
from synth.solver.highs import OPTIMAL, Model, RowBuilder, SolverOptions, solve_model
from synth.model.topology import Topology
from synth.schedule.transforms import CollectiveProblem, Concatenation, Reversal, reduction_for


def rounds_per_chunk_bound(topology: Topology, collective_name: str, root: int | None = None) -> float:
    """Least rounds per chunk (R/C, dimensionless) any step schedule of the collective needs on ``topology``.

    Parameters
    ----------
    topology : Topology
    collective_name : str
        Any of the eight collectives (aliases accepted).
    root : int, optional
        Root of Broadcast, Reduce, Gather, Scatter (default 0).

    Returns
    -------
    float
        The LP optimum; compare ratios against it with a small tolerance (it is a float).
    """
    name = normalize_name(collective_name)
    problem = CollectiveProblem(topology, name, root)
    reduction = reduction_for(problem)
    if isinstance(reduction, Concatenation):  # every part gets the same share of the rounds
        parts = reduction.apply()
        return len(parts) * max(rounds_per_chunk_bound(p.topology, p.collective, p.root) for p in parts)
    if isinstance(reduction, Reversal):
        (problem,) = reduction.apply()
    topo = problem.topology
    coll = make_collective(problem.collective, topology.num_ranks, 1, problem.root)
    best = max((_min_rounds(topo, [demand]) for demand in _per_destination(coll)), default=0.0)
    if all(len(c.dest_ranks - c.sources) <= 1 for c in coll.chunks):
        best = max(best, _min_rounds(topo, _per_source(coll)))
    return best


def _per_destination(coll: Collective) -> list[dict[int, float]]:
    """One single-sink commodity per destination rank: net supply per rank (sources +, the sink -)."""
    out = []
    for t in range(coll.num_ranks):
        supply = defaultdict(float)
        for c in coll.chunks:
            if t in c.dest_ranks and t not in c.sources and len(c.sources) == 1:
                (s,) = c.sources
                supply[s] += 1.0
                supply[t] -= 1.0
        if supply:
            out.append(dict(supply))
    return out


def _per_source(coll: Collective) -> list[dict[int, float]]:
    """One commodity per source rank of single-destination chunks (the concurrent-flow LP)."""
    by_source: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for c in coll.chunks:
        targets = c.dest_ranks - c.sources
        if len(c.sources) == 1 and targets:
            (s,) = c.sources
            (t,) = targets
            by_source[s][s] += 1.0
            by_source[s][t] -= 1.0
    return [dict(v) for _, v in sorted(by_source.items())]


def _min_rounds(topology: Topology, commodities: list[dict[int, float]]) -> float:
    """``min T`` such that every commodity's supplies reach its demands with link flow <= lanes*T (shared)."""
    if not commodities:
        return 0.0
    links = topology.links
    nlinks, n, k = len(links), topology.num_ranks, len(commodities)
    t_col = k * nlinks
    rb = RowBuilder()
    src = np.array([l.src for l in links])
    dst = np.array([l.dst for l in links])
    # conservation: out - in = supply, one row per (commodity, rank)
    for i, supply in enumerate(commodities):
        cols = i * nlinks + np.arange(nlinks)
        rb.add(np.concatenate([src, dst]), np.concatenate([cols, cols]),
               np.concatenate([np.ones(nlinks), -np.ones(nlinks)]),
               [supply.get(v, 0.0) for v in range(n)], [supply.get(v, 0.0) for v in range(n)])
    # link capacity: sum over commodities - lanes * T <= 0
    lanes = np.array([l.lanes for l in links], dtype=float)
    flow_cols = np.arange(k * nlinks)
    rb.add(np.concatenate([flow_cols % nlinks, np.arange(nlinks)]),
           np.concatenate([flow_cols, np.full(nlinks, t_col)]),
           np.concatenate([np.ones(k * nlinks), -lanes]), np.full(nlinks, -np.inf), 0.0)
    # switch ports: the links through a port share its per-round capacity
    caps = _port_caps(topology)
    ports = defaultdict(list)
    for li, link in enumerate(links):
        for port in link.ports:
            ports[port].append(li)
    for (switch, port, _), members in sorted(ports.items()):
        members = np.array(members)
        cols = (np.arange(k)[:, None] * nlinks + members[None, :]).ravel()
        rb.add(np.zeros(len(cols) + 1, dtype=int), np.append(cols, t_col),
               np.append(np.ones(len(cols)), -float(caps[(switch, port)])), [-np.inf], [0.0])
    rows, cols, vals, lo, hi = rb.arrays()
    ncols = t_col + 1
    cost = np.zeros(ncols)
    cost[t_col] = 1.0
    model = Model(cost, np.zeros(ncols), np.full(ncols, np.inf), np.zeros(ncols, dtype=bool), rows, cols, vals,
                  lo, hi)
    result = solve_model(model, SolverOptions(time_limit_s=60.0))
    if result.status != OPTIMAL:
        return 0.0  # no bound is still a valid bound; the sweep then relies on its chunk cap
    return float(result.x[t_col])
