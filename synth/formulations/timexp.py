"""The time-expanded formulation (TE-CCL-style), DESIGN section 6.

Time is cut into ``K`` epochs of ``epoch_us``. A chunk sent over link ``e`` in epoch ``k`` occupies the link
for ``occupy[e] = ceil(beta_e / epoch)`` epochs (switch ports likewise) and can be forwarded from epoch
``k + delay[e]`` with ``delay[e] = ceil((alpha_e + beta_e) / epoch)``: rounding up makes every solution a valid
alpha-beta schedule of at most ``K * epoch_us``.

Two variants, both built as arrays, both with one orbit representative per chunk orbit (capacity rows count
all images):

- **copies** (non-combining collectives, binary): ``f[c, e, k]`` sends, ``h[c, v, k]`` "rank ``v`` holds chunk
  ``c`` at the start of epoch ``k``" with ``h[k] <= h[k-1] + arrivals at k``; a rank sends only what it holds
  (to as many links as it likes: copies); every destination holds the chunk at the end; per link and switch
  port a sliding window of ``occupy`` epochs carries at most one chunk. Objective: the finish epoch ``F``
  (``F >= K + 1 - sum_k h[c, d, k]``) plus a small reward for holding early (TE-CCL's "meet demands early").
- **flow** (unicast collectives such as Alltoall, continuous LP): buffers ``b[c, v, k]`` conserve the chunk
  (no copies), ``f`` may be fractional, link capacity is fluid (``epoch / beta_e`` chunks per epoch). The
  solution is decomposed into paths per chunk and cut into pieces (see :func:`decode_flow`).

Warm start: a symmetric epoch list schedule of the starting routes (:func:`epoch_start`) is passed to HiGHS and
gives the horizon. Rolling horizon (:func:`solve_rolling`): for large instances the epochs are solved in
windows, earlier windows fixed, later ones empty, demands enforced only in the last window.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.errors import InfeasibleError
from synth.formulations.routes import AlphaBetaProblem, Routes, resource_keys
from synth.solver.highs import FEASIBLE, OPTIMAL, Model, RowBuilder, SolveResult, SolverOptions, solve_model
from synth.formulations.routed import _hop_matrix, offered_links

_TOL = 1e-9
HOLD_REWARD = 1e-3   # objective reward per (chunk, destination, epoch) held, relative to one epoch of F


@dataclass(frozen=True)
class EpochGrid:
    """Epoch length (us), number of epochs, and per link its occupancy and delay in epochs."""

    epoch_us: float
    num_epochs: int
    occupy: np.ndarray            # per link
    delay: np.ndarray             # per link
    resource_occupy: tuple        # per link: ((resource key, epochs), ...)


def make_grid(problem: AlphaBetaProblem, epoch_us: float, num_epochs: int, fluid: bool = False) -> EpochGrid:
    """Occupancies and delays for ``epoch_us``; ``fluid`` (flow LP) uses ``delay = 1 + ceil(alpha / epoch)``."""
    topo = problem.topology
    per_link, res_bw = resource_keys(topo)
    beta = problem.beta_us()
    alpha = np.array([l.alpha_us for l in topo.links])
    occupy = np.maximum(1, np.ceil(beta / epoch_us - _TOL)).astype(np.int64)
    if fluid:
        delay = 1 + np.ceil(alpha / epoch_us - _TOL).astype(np.int64)
    else:
        delay = np.maximum(1, np.ceil((alpha + beta) / epoch_us - _TOL)).astype(np.int64)
    res_occ = []
    for i in range(len(topo.links)):
        items = []
        for key in per_link[i]:
            busy = problem.chunk_bytes / (res_bw[key] * BYTES_PER_US_PER_GBPS)
            items.append((key, int(max(1, math.ceil(busy / epoch_us - _TOL)))))
        res_occ.append(tuple(items))
    return EpochGrid(epoch_us, num_epochs, occupy, delay, tuple(res_occ))


def choose_epoch(problem: AlphaBetaProblem, routes: Routes, max_epochs: int) -> float:
    """The shortest chunk time over the links the routes use, enlarged until the routes' epoch schedule fits
    ``max_epochs`` (or stops getting shorter: a link that carries ``m`` chunks needs ``m`` epochs however long
    they are)."""
    beta = problem.beta_us()
    used = sorted({li for r in routes.links for li in r})
    epoch = float(beta[used].min()) if used else float(beta.min())
    best_k = None
    for _ in range(30):
        _, k = epoch_start(problem, make_grid(problem, epoch, 10 ** 9), routes)
        if k <= max_epochs or (best_k is not None and k >= best_k):
            return epoch
        best_k = k
        epoch *= k / max_epochs * (1 + 1e-6)
    return epoch


def symmetric_resources_ok(problem: AlphaBetaProblem, grid: EpochGrid) -> bool:
    """False if two images of one link share a resource (then a symmetric epoch model cannot be exact)."""
    images = problem.symmetry.link_images(problem.topology)
    for li in range(len(problem.topology.links)):
        keys = [k for img in images[:, li] for k, _ in grid.resource_occupy[img]]
        if len(keys) != len(set(keys)):
            return False
    return True


def epoch_start(problem: AlphaBetaProblem, grid: EpochGrid, routes: Routes) -> tuple[dict, int]:
    """A symmetric epoch list schedule of ``routes``: the start epoch of every representative transfer and the
    number of epochs it needs. Images of a transfer are booked in the same epoch."""
    topo = problem.topology
    coll = problem.collective
    images = problem.symmetry.link_images(problem.topology)
    free: dict = {}
    start: dict = {}
    ready: dict = {}
    tasks = []
    for c in problem.reps:
        for s in coll.chunks[c].sources:
            ready[(c, s)] = 0
        for li in routes.links[c]:
            tasks.append((c, li))
    pending = {t: True for t in tasks}
    tail = _tails(problem, routes, grid)
    heap = [(0, -tail[(c, li)], c, li) for c, li in tasks if topo.links[li].src in coll.chunks[c].sources]
    heapq.heapify(heap)
    finish = 0
    while heap:
        est, neg_tail, c, li = heapq.heappop(heap)
        link = topo.links[li]
        e = ready[(c, link.src)]
        for img in images[:, li]:
            for key, _ in grid.resource_occupy[img]:
                e = max(e, free.get(key, 0))
        if e > est:
            heapq.heappush(heap, (e, neg_tail, c, li))
            continue
        start[(c, li)] = e
        del pending[(c, li)]
        for img in images[:, li]:
            for key, occ in grid.resource_occupy[img]:
                free[key] = e + occ
        arrive = e + int(grid.delay[li])
        ready[(c, link.dst)] = arrive
        finish = max(finish, arrive)
        for c2, li2 in [(c, x) for x in routes.links[c] if topo.links[x].src == link.dst]:
            heapq.heappush(heap, (arrive, -tail[(c2, li2)], c2, li2))
    return start, finish


def _tails(problem: AlphaBetaProblem, routes: Routes, grid: EpochGrid) -> dict:
    topo = problem.topology
    tail = {}
    for c in problem.reps:
        route = routes.links[c]
        for li in reversed(route):
            below = [tail[(c, x)] for x in route if topo.links[x].src == topo.links[li].dst]
            tail[(c, li)] = int(grid.delay[li]) + max(below, default=0)
    return tail


@dataclass(frozen=True)
class TimexpEncoding:
    """The epoch model and its column index."""

    model: Model
    problem: AlphaBetaProblem
    grid: EpochGrid
    fluid: bool
    f_chunk: np.ndarray
    f_link: np.ndarray
    f_epoch: np.ndarray
    h_index: dict               # (chunk, rank, epoch) -> column
    demand_cols: np.ndarray     # h columns of (chunk, destination, K)
    finish_col: int
    start: np.ndarray | None


def encode_timexp(problem: AlphaBetaProblem, grid: EpochGrid, start_epochs: dict | None = None,
                  fluid: bool = False, extra_links: dict | None = None) -> TimexpEncoding:
    """Build the epoch model (``fluid``: the flow LP for unicast chunks; else the binary copy model)."""
    topo = problem.topology
    coll = problem.collective
    K = grid.num_epochs
    hops = _hop_matrix(problem)
    active = set(problem.active_chunks())
    reps = [c for c in problem.reps if c in active]
    n = topo.num_ranks
    delay = grid.delay

    # earliest epoch a chunk can be at each rank (shortest delay path over offered links)
    offered, earliest = {}, {}
    for c in reps:
        links = offered_links(problem, c, hops, (extra_links or {}).get(c, ()))
        offered[c] = links
        e = np.full(n, 10 ** 9, dtype=np.int64)
        for s in coll.chunks[c].sources:
            e[s] = 0
        for _ in range(n):
            changed = False
            for li in links:
                l = topo.links[li]
                if e[l.src] + delay[li] < e[l.dst]:
                    e[l.dst] = e[l.src] + delay[li]
                    changed = True
            if not changed:
                break
        earliest[c] = e

    for c in reps:
        chunk = coll.chunks[c]
        late = [d for d in chunk.dest_ranks - chunk.sources if earliest[c][d] > K]
        if late:
            raise InfeasibleError(f"{K} epochs of {grid.epoch_us:g} us are too few for chunk {c} to reach rank "
                                  f"{late[0]}")

    # columns
    f_chunk, f_link, f_epoch = [], [], []
    for c in reps:
        dests = coll.chunks[c].dest_ranks
        for li in offered[c]:
            l = topo.links[li]
            last = K - delay[li] - (0 if l.dst in dests else 1)
            for k in range(int(earliest[c][l.src]), int(last) + 1):
                f_chunk.append(c), f_link.append(li), f_epoch.append(k)
    f_chunk = np.array(f_chunk, dtype=np.int64)
    f_link = np.array(f_link, dtype=np.int64)
    f_epoch = np.array(f_epoch, dtype=np.int64)
    nf = len(f_chunk)
    h_index = {}
    for c in reps:
        srcs = coll.chunks[c].sources
        for v in range(n):
            if fluid or v not in srcs:
                first = 0 if (fluid and v in srcs) else int(earliest[c][v])
                for k in range(first, K + 1):
                    h_index[(c, v, k)] = nf + len(h_index)
    finish_col = nf + len(h_index)
    ncols = finish_col + 1

    f_at = {}
    for j in range(nf):
        f_at[(int(f_chunk[j]), int(f_link[j]), int(f_epoch[j]))] = j
    out_of = {}
    into = {}
    for c in reps:
        for li in offered[c]:
            l = topo.links[li]
            out_of.setdefault((c, l.src), []).append(li)
            into.setdefault((c, l.dst), []).append(li)

    rb = RowBuilder()
    if not fluid:
        # h[c,v,k] - h[c,v,k-1] - sum_in f[c,e,k-delay] <= 0
        r, col, val, nrows = [], [], [], 0
        for (c, v, k), hc in h_index.items():
            r.append(nrows), col.append(hc), val.append(1.0)
            prev = h_index.get((c, v, k - 1))
            if prev is not None:
                r.append(nrows), col.append(prev), val.append(-1.0)
            for li in into.get((c, v), ()):
                j = f_at.get((c, li, k - int(delay[li])))
                if j is not None:
                    r.append(nrows), col.append(j), val.append(-1.0)
            nrows += 1
        rb.add(r, col, val, np.full(nrows, -np.inf), 0.0)
        # f[c,(u,v),k] <= h[c,u,k] for non-source u
        r, col, val, nrows = [], [], [], 0
        for j in range(nf):
            c, li, k = int(f_chunk[j]), int(f_link[j]), int(f_epoch[j])
            u = topo.links[li].src
            if u in coll.chunks[c].sources:
                continue
            hc = h_index.get((c, u, k))
            r.append(nrows), col.append(j), val.append(1.0)
            if hc is not None:
                r.append(nrows), col.append(hc), val.append(-1.0)
            nrows += 1
        rb.add(r, col, val, np.full(nrows, -np.inf), 0.0)
    else:
        # b[c,v,k+1] - b[c,v,k] + sum_out f[c,e,k] - sum_in f[c,e,k+1-delay] = 0 ; b[c,v,k] - sum_out f[c,e,k] >= 0
        r, col, val, lo, hi = [], [], [], [], []
        for (c, v, k), hc in h_index.items():
            outs = [f_at.get((c, li, k)) for li in out_of.get((c, v), ())]
            outs = [j for j in outs if j is not None]
            row = len(lo)
            r.append(row), col.append(hc), val.append(1.0)
            for j in outs:
                r.append(row), col.append(j), val.append(-1.0)
            lo.append(0.0), hi.append(np.inf)
            nxt = h_index.get((c, v, k + 1))
            if nxt is None:
                continue
            row = len(lo)
            r += [row, row]
            col += [nxt, hc]
            val += [1.0, -1.0]
            for j in outs:
                r.append(row), col.append(j), val.append(1.0)
            for li in into.get((c, v), ()):
                j = f_at.get((c, li, k + 1 - int(delay[li])))
                if j is not None:
                    r.append(row), col.append(j), val.append(-1.0)
            lo.append(0.0), hi.append(0.0)
        # the first buffer of a non-source rank holds exactly what arrives in that epoch
        for c in reps:
            srcs = coll.chunks[c].sources
            for v in range(n):
                if v in srcs or (c, v, int(earliest[c][v])) not in h_index:
                    continue
                k0 = int(earliest[c][v])
                row = len(lo)
                r.append(row), col.append(h_index[(c, v, k0)]), val.append(1.0)
                for li in into.get((c, v), ()):
                    j = f_at.get((c, li, k0 - int(delay[li])))
                    if j is not None:
                        r.append(row), col.append(j), val.append(-1.0)
                lo.append(0.0), hi.append(0.0)
        rb.add(r, col, val, lo, hi)

    # capacity: one row per (resource orbit representative, epoch), images counted
    per_link, res_bw = resource_keys(topo)
    res_rep = problem.symmetry.resource_orbit_reps(topo, per_link)
    images = problem.symmetry.link_images(problem.topology)
    row_of: dict = {}
    r, col, val = [], [], []
    for j in range(nf):
        li, k = int(f_link[j]), int(f_epoch[j])
        for img in images[:, li]:
            for key, occ in grid.resource_occupy[img]:
                if res_rep[key] != key:
                    continue
                if fluid:
                    busy = problem.chunk_bytes / (res_bw[key] * BYTES_PER_US_PER_GBPS)
                    row = row_of.setdefault((key, k), len(row_of))
                    r.append(row), col.append(j), val.append(busy / grid.epoch_us)
                else:
                    for kk in range(k, min(K, k + occ)):
                        row = row_of.setdefault((key, kk), len(row_of))
                        r.append(row), col.append(j), val.append(1.0)
    rb.add(r, col, val, np.full(len(row_of), -np.inf), 1.0)

    # finish epoch: F + sum_k h[c,d,k] >= K + 1 (binary model); demands via bounds
    demand = []
    r, col, val, nrows = [], [], [], 0
    for c in reps:
        chunk = coll.chunks[c]
        for d in chunk.dest_ranks - chunk.sources:
            demand.append(h_index[(c, d, K)])
            if fluid:
                continue
            r.append(nrows), col.append(finish_col), val.append(1.0)
            for k in range(K + 1):
                hc = h_index.get((c, d, k))
                if hc is not None:
                    r.append(nrows), col.append(hc), val.append(1.0)
            nrows += 1
    if nrows:
        rb.add(r, col, val, np.full(nrows, float(K + 1)), np.inf)

    rows, cols, vals, row_lo, row_hi = rb.arrays()
    cost = np.zeros(ncols)
    dest_h = [hc for (c, v, k), hc in h_index.items() if v in coll.chunks[c].dest_ranks
              and v not in coll.chunks[c].sources]
    cost[dest_h] = -HOLD_REWARD if not fluid else -1.0
    cost[finish_col] = 0.0 if fluid else 1.0
    if not fluid:
        cost[:nf] = HOLD_REWARD * 1e-3  # a send that serves nobody is never free
    col_lower = np.zeros(ncols)
    col_upper = np.ones(ncols)
    col_upper[finish_col] = K + 1
    demand = np.array(demand, dtype=np.int64)
    col_lower[demand] = 1.0
    if fluid:
        for c in reps:
            for s in coll.chunks[c].sources:
                hc = h_index.get((c, s, 0))
                col_lower[hc] = col_upper[hc] = 1.0
    integer = np.zeros(ncols, dtype=bool)
    if not fluid:
        integer[:finish_col] = True
    names = tuple(f"f_c{c}_{topo.links[l].src}to{topo.links[l].dst}_k{k}" for c, l, k in zip(f_chunk, f_link, f_epoch)) \
        + tuple(f"{'b' if fluid else 'h'}_c{c}_r{v}_k{k}" for (c, v, k) in h_index) + ("F",)
    model = Model(cost, col_lower, col_upper, integer, rows, cols, vals, row_lo, row_hi, names)
    x0 = None
    if start_epochs is not None and not fluid:
        x0 = _start_vector(problem, grid, start_epochs, f_at, h_index, finish_col, ncols)
    return TimexpEncoding(model, problem, grid, fluid, f_chunk, f_link, f_epoch, h_index, demand, finish_col, x0)


def _start_vector(problem, grid, start_epochs, f_at, h_index, finish_col, ncols) -> np.ndarray | None:
    topo = problem.topology
    x0 = np.zeros(ncols)
    arrive = {}
    for (c, li), k in start_epochs.items():
        j = f_at.get((c, li, k))
        if j is None:
            return None  # the start uses a column the model does not offer
        x0[j] = 1.0
        arrive[(c, topo.links[li].dst)] = k + int(grid.delay[li])
    worst = 0
    for (c, v, k), hc in h_index.items():
        a = arrive.get((c, v))
        if a is not None and k >= a:
            x0[hc] = 1.0
    for (c, v), a in arrive.items():
        if v in problem.collective.chunks[c].dest_ranks:
            worst = max(worst, a)
    x0[finish_col] = worst
    return x0


def decode_copies(enc: TimexpEncoding, result: SolveResult) -> tuple[Routes, dict]:
    """Routes (first arrival per rank, images by symmetry, dead relays pruned) and a booking position per
    (chunk, link) from the start epochs of the binary model."""
    problem = enc.problem
    topo = problem.topology
    coll = problem.collective
    x = result.x
    images = problem.symmetry.link_images(topo)
    chunk_maps = problem.symmetry.chunk_maps.tolist()
    chosen = np.flatnonzero(x[: len(enc.f_chunk)] > 0.5)
    sends = sorted((int(enc.f_epoch[j]), int(enc.f_chunk[j]), int(enc.f_link[j])) for j in chosen)
    rep_links: dict[int, list[tuple[int, int]]] = {c: [] for c in problem.reps}
    for k, c, li in sends:
        rep_links[c].append((k, li))
    out: list[tuple[int, ...]] = [() for _ in coll.chunks]
    position: dict = {}
    for c, items in rep_links.items():
        have = {s: -1 for s in coll.chunks[c].sources}
        route = []
        for k, li in items:
            l = topo.links[li]
            if l.src in have and have[l.src] <= k and l.dst not in have:
                have[l.dst] = k + int(enc.grid.delay[li])
                route.append((k, li))
        for g in range(problem.symmetry.order):
            cmap = chunk_maps[g]
            links = []
            for k, li in route:
                img = int(images[g, li])
                links.append(img)
                position[(cmap[c], img)] = (k, li)
            out[cmap[c]] = tuple(links)
    from synth.formulations.routes import prune_routes

    routes = prune_routes(problem, Routes(tuple(out)))
    return routes, position


def decode_flow(enc: TimexpEncoding, result: SolveResult, pieces: int, fallback_routes: Routes) -> tuple[list, dict]:
    """Decompose the flow LP per chunk into paths over time and cut every chunk into ``pieces`` pieces, each
    following one path (largest-remainder rounding of the path amounts; flow the decomposition cannot trace
    follows the chunk's ``fallback`` route). Returns the route of every piece (indexed ``chunk * pieces + p``,
    images by symmetry) and a booking position per (piece, link)."""
    problem = enc.problem
    topo = problem.topology
    coll = problem.collective
    x = result.x
    images = problem.symmetry.link_images(topo)
    chunk_maps = problem.symmetry.chunk_maps.tolist()
    nf = len(enc.f_chunk)
    flows: dict = {}
    for j in np.flatnonzero(x[:nf] > 1e-7):
        flows.setdefault(int(enc.f_chunk[j]), []).append((int(enc.f_epoch[j]), int(enc.f_link[j]), float(x[j])))
    K = enc.grid.num_epochs
    fallback = fallback_routes.links
    piece_routes: list[tuple[int, ...]] = [() for _ in range(len(coll.chunks) * pieces)]
    position: dict = {}
    for c in problem.reps:
        chunk = coll.chunks[c]
        dests = chunk.dest_ranks - chunk.sources
        if not dests:
            continue
        paths = _decompose(topo, enc, x, c, flows.get(c, []), next(iter(chunk.sources)), next(iter(dests)), K)
        found = sum(a for a, _ in paths)
        if found < 1 - 1e-6:  # numerical leftovers: the rest follows the fallback route, after everything else
            paths.append((1 - found, [(K + i, li) for i, li in enumerate(fallback[c])]))
        counts = _apportion([a for a, _ in paths], pieces)
        assigned = []
        for (amount, path), cnt in zip(paths, counts):
            assigned += [path] * cnt
        for g in range(problem.symmetry.order):
            cmap = chunk_maps[g]
            for p, path in enumerate(assigned):
                links = []
                for k, li in path:
                    img = int(images[g, li])
                    links.append(img)
                    position[(cmap[c] * pieces + p, img)] = (k, li)
                piece_routes[cmap[c] * pieces + p] = tuple(links)
    return piece_routes, position


def _decompose(topo, enc, x, c, flows, src, dst, K) -> list[tuple[float, list]]:
    """Greedy path decomposition of one chunk's flow over time (link arcs, and waiting in a buffer). A walk
    may revisit a rank later in time (LP solutions can hold cycles); the loop is cut out of the route."""
    out_arcs: dict = {}
    for k, li, amount in flows:
        out_arcs.setdefault((topo.links[li].src, k), []).append([li, amount])
    remaining = 1.0
    paths = []
    for _ in range(64):
        if remaining <= 1e-6:
            break
        v, k, path, bottleneck = src, 0, [], remaining
        while v != dst and k <= K:
            arcs = [a for a in out_arcs.get((v, k), []) if a[1] > 1e-7]
            if arcs:
                arc = max(arcs, key=lambda a: a[1])
                bottleneck = min(bottleneck, arc[1])
                path.append((k, arc[0], arc))
                v = topo.links[arc[0]].dst
                k = k + int(enc.grid.delay[arc[0]])
            else:
                k += 1
        if v != dst:
            break
        for _, _, arc in path:
            arc[1] -= bottleneck
        remaining -= bottleneck
        paths.append((bottleneck, _cut_loops(topo, src, [(kk, li) for kk, li, _ in path])))
    return paths


def _cut_loops(topo, src, path):
    """Drop the part of a path between two visits of the same rank (times stay increasing)."""
    out = []
    at = {src: 0}
    for k, li in path:
        v = topo.links[li].dst
        if v in at:
            out = out[: at[v]]
            at = {r: i for r, i in at.items() if i <= len(out)}
        else:
            out.append((k, li))
            at[v] = len(out)
    return out


def _apportion(amounts, pieces: int) -> list[int]:
    """Largest-remainder rounding of fractions (summing to 1) to ``pieces`` whole pieces."""
    raw = [a * pieces for a in amounts]
    counts = [int(math.floor(v)) for v in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in order[: pieces - sum(counts)]:
        counts[i] += 1
    return counts


def solve_rolling(enc: TimexpEncoding, options: SolverOptions, window: int) -> SolveResult:
    """Rolling horizon over epochs of the binary model: solve ``window`` epochs at a time (earlier epochs
    fixed, later ones closed, demands relaxed), then the last window with demands. Returns the last result
    (status ``feasible`` at best: the windows are not jointly optimal)."""
    model = enc.model
    K = enc.grid.num_epochs
    x = None
    total = 0.0
    per_window = options.time_limit_s / max(1, math.ceil(K / window))
    last = None
    for a in range(0, K, window):
        b = min(K, a + window)
        lower = model.col_lower.copy()
        upper = model.col_upper.copy()
        if x is not None:
            early = np.flatnonzero(enc.f_epoch < a)
            lower[early] = upper[early] = np.round(x[early])
        late = np.flatnonzero(enc.f_epoch >= b)
        upper[late] = 0.0
        final = b == K
        if not final:
            lower[enc.demand_cols] = 0.0
        cost = model.cost.copy()
        if not final:
            cost[enc.finish_col] = 0.0
        sub = replace(model, col_lower=lower, col_upper=upper, cost=cost)
        start = None
        if x is not None and not final:
            start = np.clip(x, lower, upper)
        res = solve_model(sub, replace(options, time_limit_s=per_window), initial=start)
        total += res.seconds
        if res.x is None:
            return SolveResult(res.status, None, None, None, total, res.highs_status)
        x = res.x
        last = res
    status = FEASIBLE if last.status in (OPTIMAL, FEASIBLE) else last.status
    return SolveResult(status, x, last.objective, None, total, last.highs_status)


def model_size(problem: AlphaBetaProblem, grid: EpochGrid) -> int:
    """A quick estimate of the number of send columns (to decide on a rolling horizon)."""
    hops = _hop_matrix(problem)
    active = set(problem.active_chunks())
    return sum(len(offered_links(problem, c, hops)) for c in problem.reps if c in active) * grid.num_epochs
