"""The routed formulation (TACCL-style, sketch-guided), DESIGN section 6: route every chunk, then order, then time.

This module is the *route* stage as a MILP; :mod:`synth.schedule.list_scheduler` orders and times the routes and the replay gives
the real figure (routing alone ignores contention order, so its objective is an estimate, never the answer).

Per orbit-representative chunk ``c`` and allowed link ``e`` (only real links the sketch allows, pruned by hop
distance) a binary ``x[c, e]``; per rank an arrival time ``t[c, v]`` (us); the bandwidth makespan ``Z`` and the
path makespan ``T``:

- every destination that is not a source receives the chunk exactly once, other ranks at most once; a rank
  that does not need the chunk forwards it only if it received it;
- ``t[c, v] >= t[c, u] + d_e - M_e (1 - x[c, e])`` with ``d_e = alpha_e + beta_e / pieces`` (a hop of a
  pipelined chunk) and the tight ``M_e = max(H, lb_u) + d_e - lb_v``, where the horizon ``H`` is the objective
  of the starting routes (a solution with ``T > H`` cannot beat the start) and ``lb_v`` the shortest ``d`` path
  (a rank no path reaches by ``H``, off the start's routes, keeps ``t = lb``: the ``max`` keeps the start
  feasible there, ndv2 x2 Gather 1 KB under ``ndv2-nic-relay``);
  ``T >= t[c, v]`` at destinations;
- link and switch-port load ``<= Z``: one row per resource orbit, counting the chunk's images under the
  symmetry group (the load of a resource is the same for every resource in its orbit);
- with the sketch's ``uc-min`` switch strategy, a binary ``y`` per orbit of switch links marks the connections
  as used; each distinct connection costs ``UC_MIN_WEIGHT`` chunk times, so at large sizes (where the extra
  hops of a ring-like tree cost little) few peers per GPU are used, as TACCL's uc-min intends.

The objective ``Z + T`` (+ a tiny traffic tie-break) estimates the pipelined makespan: the busiest resource plus
the time to fill the pipeline. Starting routes (a constructive heuristic or a baseline) are passed to HiGHS as
the initial solution.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.formulations.routes import (AlphaBetaProblem, Routes, expand_symmetric, prune_routes, resource_keys, route_loads,
                      tree_order)
from synth.solver.highs import Model, RowBuilder, SolveResult

HOP_SLACK = 1          # links more than this many hops beyond the shortest route are not offered
TRAFFIC_WEIGHT = 1e-4  # objective weight of total traffic (a tie-break)
UC_MIN_WEIGHT = 0.25   # objective cost (in chunk times) of one distinct switch connection under uc-min


@dataclass(frozen=True)
class RoutedEncoding:
    """The routing MILP plus what decoding needs: the chunk and link of every ``x`` column."""

    model: Model
    problem: AlphaBetaProblem
    pieces: int
    x_chunk: np.ndarray
    x_link: np.ndarray
    z_col: int
    t_col: int
    horizon_us: float
    start: np.ndarray | None


def _hop_matrix(problem: AlphaBetaProblem) -> np.ndarray:
    return np.array(problem.topology.hop_distances())


def _lower_bounds(problem: AlphaBetaProblem, c: int, cols_link: list[int], d: np.ndarray) -> np.ndarray:
    """Shortest ``d``-path arrival (us) from chunk ``c``'s sources over its offered links (inf if unreachable)."""
    topo = problem.topology
    n = topo.num_ranks
    lb = np.full(n, np.inf)
    for s in problem.collective.chunks[c].sources:
        lb[s] = 0.0
    for _ in range(n):  # Bellman-Ford over a small link set
        changed = False
        for li in cols_link:
            link = topo.links[li]
            if lb[link.src] + d[li] < lb[link.dst] - 1e-12:
                lb[link.dst] = lb[link.src] + d[li]
                changed = True
        if not changed:
            break
    return lb


def offered_links(problem: AlphaBetaProblem, c: int, hops: np.ndarray, extra=()) -> list[int]:
    """Links offered to chunk ``c``: allowed by the mask and on a route at most ``HOP_SLACK`` hops longer than
    the shortest to the farthest destination (plus ``extra``, e.g. the starting routes' links)."""
    topo = problem.topology
    chunk = problem.collective.chunks[c]
    src = sorted(chunk.sources)
    dests = sorted(chunk.dest_ranks - chunk.sources)
    from_src = hops[src].min(axis=0)
    to_dest = hops[:, dests].min(axis=1) if len(dests) == 1 else np.zeros(topo.num_ranks, dtype=np.int64)
    limit = max(from_src[d] for d in dests) + HOP_SLACK
    out = set(extra)
    for li in np.flatnonzero(problem.mask[c]):
        link = topo.links[li]
        if from_src[link.src] + 1 + to_dest[link.dst] <= limit:
            out.add(int(li))
    return sorted(out)


def encode_routed(problem: AlphaBetaProblem, start: Routes, pieces: int = 1, z_lower_us: float = 0.0) -> RoutedEncoding:
    """Build the routing MILP for ``problem`` with ``start`` (symmetric routes) as the initial solution.

    ``pieces`` is the planned pipelining factor; it sets the per-hop latency ``alpha + beta / pieces``.
    ``z_lower_us`` is a known lower bound on the bandwidth makespan (e.g. the cut bound of
    :mod:`synth.bounds.physical`); it only helps HiGHS close the gap.
    """
    topo = problem.topology
    coll = problem.collective
    beta = problem.beta_us()
    d = np.array([l.alpha_us for l in topo.links]) + beta / pieces
    hops = _hop_matrix(problem)
    active = set(problem.active_chunks())
    reps = [c for c in problem.reps if c in active]
    n = topo.num_ranks

    # ---- columns: x per (rep chunk, offered link), t per (rep chunk, non-source rank), Z, T, y (uc-min)
    x_chunk, x_link, lbs = [], [], {}
    for c in reps:
        offered = offered_links(problem, c, hops, start.links[c])
        lb = _lower_bounds(problem, c, offered, d)
        lbs[c] = lb
        x_chunk += [c] * len(offered)
        x_link += offered
    x_chunk = np.array(x_chunk, dtype=np.int64)
    x_link = np.array(x_link, dtype=np.int64)
    nx_ = len(x_chunk)
    t_index = {}
    for c in reps:
        for v in range(n):
            if v not in coll.chunks[c].sources and np.isfinite(lbs[c][v]):
                t_index[(c, v)] = nx_ + len(t_index)
    z_col = nx_ + len(t_index)
    t_col = z_col + 1
    per_link, res_bw = resource_keys(topo)
    uc_min = problem.sketch.switch_strategy == "uc-min"
    link_orbit = {i: int(r) for i, r in enumerate(problem.symmetry.link_orbit_reps(topo))}
    y_index = {}
    if uc_min:
        for li in sorted({link_orbit[l] for l in x_link if topo.links[l].switch is not None}):
            y_index[li] = t_col + 1 + len(y_index)
    ncols = t_col + 1 + len(y_index)

    # ---- start solution and horizon
    x0 = np.zeros(ncols)
    chosen = {(c, li) for c in reps for li in start.links[c]}
    for k in range(nx_):
        if (int(x_chunk[k]), int(x_link[k])) in chosen:
            x0[k] = 1.0
    arrive = {}
    for c in reps:
        at = {s: 0.0 for s in coll.chunks[c].sources}
        for li in start.links[c]:
            link = topo.links[li]
            at[link.dst] = at[link.src] + d[li]
        arrive[c] = at
    t_start = max((v for c in reps for r, v in arrive[c].items() if r in coll.chunks[c].dest_ranks), default=0.0)
    z_start = route_loads(problem, start)[0]
    horizon = (z_start + t_start) * (1 + 1e-6) + 1e-6
    for (c, v), col in t_index.items():     # ranks the start does not reach: their column's upper bound
        x0[col] = min(arrive[c][v], horizon) if v in arrive[c] else max(horizon, lbs[c][v])
    x0[z_col] = z_start
    x0[t_col] = t_start
    for li, col in y_index.items():
        x0[col] = 1.0 if any(link_orbit[l] == li for c in reps for l in start.links[c]) else 0.0

    rb = RowBuilder()
    into = defaultdict(list)
    for k in range(nx_):
        into[(int(x_chunk[k]), topo.links[x_link[k]].dst)].append(k)

    # ---- receive once (destinations) / at most once (others)
    r_ent, c_ent, lo, hi = [], [], [], []
    for c in reps:
        chunk = coll.chunks[c]
        for v in range(n):
            if v in chunk.sources:
                continue
            cols = into.get((c, v), [])
            if v in chunk.dest_ranks:
                lo.append(1.0)
            elif cols:
                lo.append(0.0)
            else:
                continue
            hi.append(1.0)
            r_ent += [len(lo) - 1] * len(cols)
            c_ent += cols
    rb.add(r_ent, c_ent, 1.0, lo, hi)

    # ---- a non-destination relay forwards only what it received: x[c, u->v] - sum x[c, .->u] <= 0
    r_ent, c_ent, v_ent, nrows = [], [], [], 0
    for k in range(nx_):
        c, u = int(x_chunk[k]), topo.links[x_link[k]].src
        chunk = coll.chunks[c]
        if u in chunk.sources or u in chunk.dest_ranks:
            continue
        r_ent.append(nrows), c_ent.append(k), v_ent.append(1.0)
        for k2 in into.get((c, u), []):
            r_ent.append(nrows), c_ent.append(k2), v_ent.append(-1.0)
        nrows += 1
    rb.add(r_ent, c_ent, v_ent, np.full(nrows, -np.inf), 0.0)

    # ---- arrival times: t_v - t_u - M x >= d - M  (t_u = 0 at sources)
    r_ent, c_ent, v_ent, lo = [], [], [], []
    for k in range(nx_):
        c, li = int(x_chunk[k]), int(x_link[k])
        link = topo.links[li]
        tv = t_index.get((c, link.dst))
        if tv is None:
            continue
        tu = t_index.get((c, link.src))
        # t_u is at most max(H, lb_u) (a rank the start cannot reach by H has only its lower bound)
        big_m = (horizon if tu is None else max(horizon, lbs[c][link.src])) + d[li] - lbs[c][link.dst]
        row = len(lo)
        r_ent += [row, row]
        c_ent += [tv, k]
        v_ent += [1.0, -big_m]
        if tu is not None:
            r_ent.append(row), c_ent.append(tu), v_ent.append(-1.0)
        lo.append(d[li] - big_m)
    rb.add(r_ent, c_ent, v_ent, lo, np.inf)

    # ---- T >= t at destinations
    r_ent, c_ent, v_ent, nrows = [], [], [], 0
    for (c, v), col in t_index.items():
        if v in coll.chunks[c].dest_ranks:
            r_ent += [nrows, nrows]
            c_ent += [t_col, col]
            v_ent += [1.0, -1.0]
            nrows += 1
    rb.add(r_ent, c_ent, v_ent, np.zeros(nrows), np.inf)

    # ---- loads: one row per resource orbit, all images counted
    nbytes = problem.chunk_bytes
    res_rep = problem.symmetry.resource_orbit_reps(topo, per_link)
    row_of: dict = {}
    r_ent, c_ent, v_ent = [], [], []
    images = problem.symmetry.link_images(topo)
    for k in range(nx_):
        for img in images[:, x_link[k]]:
            for key in per_link[img]:
                if res_rep[key] != key:
                    continue
                row = row_of.setdefault(key, len(row_of))
                busy = nbytes / (res_bw[key] * BYTES_PER_US_PER_GBPS)
                r_ent.append(row), c_ent.append(k), v_ent.append(busy)
    nload = len(row_of)
    r_ent += list(range(nload))
    c_ent += [z_col] * nload
    v_ent += [-1.0] * nload
    rb.add(r_ent, c_ent, v_ent, np.full(nload, -np.inf), 0.0)

    # ---- uc-min: x[c, e] <= y[orbit(e)]
    if y_index:
        r_ent, c_ent, v_ent, nrows = [], [], [], 0
        for k in range(nx_):
            col = y_index.get(link_orbit[int(x_link[k])])
            if col is None:
                continue
            r_ent += [nrows, nrows]
            c_ent += [k, col]
            v_ent += [1.0, -1.0]
            nrows += 1
        rb.add(r_ent, c_ent, v_ent, np.full(nrows, -np.inf), 0.0)

    rows, cols, vals, row_lo, row_hi = rb.arrays()
    cost = np.zeros(ncols)
    cost[:nx_] = TRAFFIC_WEIGHT * beta[x_link] * problem.symmetry.order
    cost[z_col] = 1.0
    cost[t_col] = 1.0
    orbit_size = defaultdict(int)
    for rep in link_orbit.values():
        orbit_size[rep] += 1
    for li, col in y_index.items():
        cost[col] = UC_MIN_WEIGHT * float(beta.min()) * orbit_size[li]
    col_lower = np.zeros(ncols)
    col_upper = np.ones(ncols)
    for (c, v), col in t_index.items():
        col_lower[col] = lbs[c][v]
        col_upper[col] = max(horizon, lbs[c][v])
    col_lower[z_col] = min(z_lower_us, z_start)
    col_upper[z_col] = np.inf
    col_lower[t_col] = min(t_start, max((lbs[c][v] for c in reps for v in coll.chunks[c].dest_ranks
                                         if np.isfinite(lbs[c][v])), default=0.0))
    col_upper[t_col] = horizon
    integer = np.zeros(ncols, dtype=bool)
    integer[:nx_] = True
    integer[t_col + 1:] = True
    names = tuple(f"x_c{c}_{topo.links[l].src}to{topo.links[l].dst}" for c, l in zip(x_chunk, x_link)) + \
        tuple(f"t_c{c}_r{v}" for (c, v) in t_index) + ("Z", "T") + tuple(f"y_link{li}" for li in y_index)
    model = Model(cost, col_lower, col_upper, integer, rows, cols, vals, row_lo, row_hi, names)
    x0[z_col] = max(x0[z_col], col_lower[z_col])
    return RoutedEncoding(model, problem, pieces, x_chunk, x_link, z_col, t_col, horizon, x0)


def decode_routed(enc: RoutedEncoding, result: SolveResult) -> Routes:
    """Routes of every chunk from the chosen ``x`` columns (images by symmetry, dead relays pruned)."""
    problem = enc.problem
    x = result.x
    chosen = np.flatnonzero(x[: len(enc.x_chunk)] > 0.5)
    per_rep: dict[int, list[int]] = {c: [] for c in problem.reps}
    for k in chosen:
        per_rep[int(enc.x_chunk[k])].append(int(enc.x_link[k]))
    rep_routes = {c: tree_order(problem.topology, problem.collective.chunks[c].sources, links)
                  for c, links in per_rep.items()}
    return prune_routes(problem, expand_symmetric(problem, rep_routes))
