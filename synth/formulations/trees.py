"""Tree packing (Blink / ForestColl-style, DESIGN section 6): throughput-optimal out-trees, and their integer form.

A broadcast-type demand is a set of :class:`Commodity` objects: a root whose chunks every sink must receive
(Allgather: one per rank, sinks all others; Broadcast: one; Scatter: one per destination, a single sink, so its
"trees" are paths). Reductions are the reversal of these on the reversed topology (done by the driver).

The graph is the topology's logical links (rank to rank, through a switch when the link has one); a link uses
the resources of :func:`synth.formulations.routes.resource_keys` (itself, and a switch link its egress and
ingress ports), so switches and NICs are capacities, never tree vertices. For one commodity with root r, a
capacity vector ``x`` on the links admits a packing of r-arborescences of total weight ``C`` exactly when
every sink can receive a flow of ``C`` from r within ``x`` (Edmonds' branching theorem; Menger for one sink).
So the packing problem is a compact program (:func:`encode_packing`):

- ``x[k, l] >= 0``: chunks of commodity k crossing link l (integers in the MILP, reals in the LP);
- per sink t of k, a flow ``f[k, t, l] <= x[k, l]`` carrying ``C`` from the root to t (for a single sink
  ``x`` is the flow);
- on every resource ``sum of x over the links using it <= T * bandwidth``; minimise ``T``.

``T`` is in chunk / (GB/s): the time of the busiest resource is ``T * chunk_bytes / 1e3`` microseconds. The LP
(``integer=False``) gives the optimal fractional rate, which equals the cut bound of
:mod:`synth.bounds.physical` (tests check every built-in topology); the MILP with ``C`` a power of two is what
the MSCCL runtimes can select (``nchunksperloop`` must divide power-of-two element counts). Symmetry: when the
demand is closed under a freely acting rank-permutation group, only one commodity per orbit is solved and every
resource counts the images of its links.

:func:`decompose` turns one commodity's integer capacities into ``C`` arborescences (with multiplicities)
by Lovasz's constructive proof of Edmonds' theorem: grow a tree edge by edge, keeping every sink's
connectivity in what is left at least ``C - 1``, then take as many copies of it as the connectivity allows.

>>> from synth.model.topology import load_topology
>>> topo = load_topology("ring-4")
>>> p = solve_packing(topo, broadcast_commodities("allgather", 4, None), 1, integer=False)
>>> round(p.units, 6)   # each rank receives 3 shards over 2 links of 25 GB/s: 3 / 50
0.06
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from synth.errors import InfeasibleError, NoSolutionError, SolverError
from synth.formulations.routes import resource_keys
from synth.model.collectives import make_collective, normalize_name
from synth.model.symmetry import free_symmetry_group
from synth.model.topology import Topology, reverse_topology
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.schedule.transforms import REVERSAL_DUAL
from synth.solver.highs import FEASIBLE, INFEASIBLE, OPTIMAL, Model, SolverOptions, solve_model

# The broadcast-type collective whose packing, reversed on the reversed topology, gives each in-tree collective
# (the combining ones as in synth.schedule.transforms.REVERSAL_DUAL, and Gather from Scatter).
REVERSAL_OF = MappingProxyType(dict(REVERSAL_DUAL, gather="scatter"))
# The MILP starts from the cheapest-resource trees instead when the fewest-hop start loads the busiest resource
# this many times more: a start that far off (ndv2 x2 Allgather: 8x, every chunk crossing the shared NIC once per
# remote rank) is not repaired within the packing MILP's seconds. Below it, the fewest-hop start is kept: on dgx1
# (2x) it leads to trees that schedule 5% faster.
HOPELESS_START = 4.0


@dataclass(frozen=True)
class Commodity:
    """Chunks that start at ``root`` and must reach every rank in ``sinks``."""

    root: int
    sinks: tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    """An out-tree of one commodity: link indices (parents before children) and how many chunks use it."""

    links: tuple[int, ...]
    chunks: int


@dataclass(frozen=True)
class Packing:
    """A solved packing.

    Attributes
    ----------
    commodities : the orbit representatives that were solved (all commodities without symmetry).
    images : per representative, the rank permutations mapping it onto the commodities it stands for.
    chunks : chunks per commodity (``C``).
    units : busiest resource's load in chunk / (GB/s); multiply by chunk bytes / 1e3 for microseconds.
    counts : ``counts[k, l]`` chunks of representative k on link l.
    status, gap, seconds : the solver's account (``gap`` None for an LP or when unknown).
    relay_stars : its trees are relay stars (:func:`_relay_stars`), whose pipeline the runtime's FIFOs pace.
    """

    commodities: tuple[Commodity, ...]
    images: tuple[tuple[tuple[int, ...], ...], ...]
    chunks: int
    units: float
    counts: np.ndarray
    status: str
    gap: float | None
    seconds: float
    relay_stars: bool = False


def broadcast_commodities(collective_name: str, num_ranks: int, root: int | None) -> tuple[Commodity, ...]:
    """The broadcast-type demand of ``allgather``, ``broadcast`` or ``scatter`` (reductions are their reversal)."""
    ranks = range(num_ranks)
    if collective_name == "allgather":
        return tuple(Commodity(r, tuple(d for d in ranks if d != r)) for r in ranks)
    root = 0 if root is None else root
    if collective_name == "broadcast":
        return (Commodity(root, tuple(d for d in ranks if d != root)),)
    if collective_name == "scatter":
        return tuple(Commodity(root, (d,)) for d in ranks if d != root)
    raise ValueError(f"{collective_name} is not a broadcast-type collective")


def packing_rate_us(topology: Topology, collective_name: str, size_bytes: float, root: int | None = None,
                    options: SolverOptions = SolverOptions()) -> float:
    """The optimal fractional tree-packing time (microseconds) of any of the seven tree collectives at
    ``size_bytes`` (nccl-tests' size), from the packing LP: reductions on the reversed topology, Allreduce as
    ReduceScatter + Allgather. It equals the max-flow bound of :mod:`synth.bounds.physical`.

    >>> from synth.model.topology import load_topology
    >>> round(packing_rate_us(load_topology("ring-4"), "allreduce", 4_000_000), 6)
    120.0
    """
    name = normalize_name(collective_name)
    if name == "allreduce":
        return sum(packing_rate_us(topology, part, size_bytes, root, options)
                   for part in ("reducescatter", "allgather"))
    kind = REVERSAL_OF.get(name, name)
    on = reverse_topology(topology) if name in REVERSAL_OF else topology
    group = free_symmetry_group(on) if kind == "allgather" else ()
    packing = solve_packing(on, broadcast_commodities(kind, on.num_ranks, root), 1, integer=False, group=group,
                            options=options)
    return packing.units * make_collective(kind, on.num_ranks, 1, root).chunk_bytes(size_bytes) \
        / BYTES_PER_US_PER_GBPS


def _image(perm, commodity: Commodity) -> Commodity:
    return Commodity(perm[commodity.root], tuple(sorted(perm[s] for s in commodity.sinks)))


def orbit_representatives(commodities, group, num_ranks: int):
    """Representatives and, per representative, the rank permutations giving its orbit. Without a group, or
    when the demand is not closed under it or it does not act freely on the demand, every commodity is its own
    representative (with the identity)."""
    identity = tuple(range(num_ranks))
    alone = tuple(commodities), tuple((identity,) for _ in commodities)
    demand = {Commodity(c.root, tuple(sorted(c.sinks))) for c in commodities}
    if len(group) <= 1 or any({_image(g, c) for c in demand} != demand for g in group):
        return alone
    reps, images, seen = [], [], set()
    for c in sorted(demand, key=lambda c: (c.root, c.sinks)):
        if c in seen:
            continue
        orbit = [_image(g, c) for g in group]
        if len(set(orbit)) != len(group):
            return alone
        seen.update(orbit)
        reps.append(c)
        images.append(tuple(tuple(g) for g in group))
    return tuple(reps), tuple(images)


def _link_image(topology: Topology, perm, li: int) -> int:
    link = topology.links[li]
    return topology.link_index[(perm[link.src], perm[link.dst])]


def encode_packing(topology: Topology, commodities, images, chunks: int, integer: bool) -> Model:
    """The packing program (module docstring) as a :class:`Model`; columns: ``x`` per (representative, link),
    then the flows, then ``T`` last."""
    n, num_links = topology.num_ranks, len(topology.links)
    per_link, res_bw = resource_keys(topology)
    res_index = {k: i for i, k in enumerate(res_bw)}
    src = np.array([l.src for l in topology.links])
    dst = np.array([l.dst for l in topology.links])
    link_ids = np.arange(num_links)
    rows, cols, vals, lo, hi = [], [], [], [], []
    row = 0
    col = len(commodities) * num_links

    def conservation(flow_cols, root, sink):
        nonlocal row
        rows.extend([row + src, row + dst])
        cols.extend([flow_cols, flow_cols])
        vals.extend([np.ones(num_links), -np.ones(num_links)])
        supply = np.zeros(n)
        supply[root], supply[sink] = chunks, -chunks
        lo.append(supply)
        hi.append(supply)
        row += n

    for k, c in enumerate(commodities):
        x_cols = k * num_links + link_ids
        if len(c.sinks) == 1:
            conservation(x_cols, c.root, c.sinks[0])
            continue
        for t in c.sinks:
            f_cols = col + link_ids
            col += num_links
            conservation(f_cols, c.root, t)
            rows.extend([row + link_ids, row + link_ids])      # f - x <= 0
            cols.extend([f_cols, x_cols])
            vals.extend([np.ones(num_links), -np.ones(num_links)])
            lo.append(np.full(num_links, -np.inf))
            hi.append(np.zeros(num_links))
            row += num_links
    t_col = col
    # capacity: sum over representatives, their images and the links' resources
    cap_rows, cap_cols = [], []
    for k, perms in enumerate(images):
        for perm in perms:
            for li in range(num_links):
                image = _link_image(topology, perm, li)
                for key in per_link[image]:
                    cap_rows.append(res_index[key])
                    cap_cols.append(k * num_links + li)
    pairs, counts = np.unique(np.array([cap_rows, cap_cols]), axis=1, return_counts=True)
    rows.extend([row + pairs[0], row + np.arange(len(res_bw))])
    cols.extend([pairs[1], np.full(len(res_bw), t_col)])
    vals.extend([counts.astype(float), -np.array(list(res_bw.values()))])
    lo.append(np.full(len(res_bw), -np.inf))
    hi.append(np.zeros(len(res_bw)))
    num_cols = t_col + 1
    cost = np.zeros(num_cols)
    cost[t_col] = 1.0
    integer_cols = np.zeros(num_cols, dtype=bool)
    if integer:
        integer_cols[:len(commodities) * num_links] = True
    upper = np.full(num_cols, np.inf)
    upper[:t_col] = chunks     # no link needs a chunk twice
    return Model(cost, np.zeros(num_cols), upper, integer_cols, np.concatenate(rows).astype(np.int64),
                 np.concatenate(cols).astype(np.int64), np.concatenate(vals).astype(float),
                 np.concatenate(lo), np.concatenate(hi))


def start_solution(topology: Topology, commodities, chunks: int, trees=None) -> np.ndarray:
    """A feasible point of :func:`encode_packing`'s columns (same order): every chunk of a commodity on one
    tree, ``trees[k]`` (link indices) when given, else a fewest-hop tree (direct links first), so the MILP
    always has an incumbent."""
    num_links = len(topology.links)
    x_part, f_part = [], []
    for k, c in enumerate(commodities):
        if trees is not None and trees[k] is not None:
            parent = {c.root: None}
            parent.update({topology.links[li].dst: li for li in trees[k]})
        else:
            parent = _fewest_hops(topology, c.root)
        x = np.zeros(num_links)
        paths = {}
        for t in c.sinks:
            path, v = np.zeros(num_links), t
            while parent[v] is not None:
                path[parent[v]] = chunks
                v = topology.links[parent[v]].src
            paths[t] = path
            x = np.maximum(x, path)
        x_part.append(x)
        if len(c.sinks) > 1:
            f_part += [paths[t] for t in c.sinks]
    return np.concatenate(x_part + f_part + [np.zeros(1)])


def _fewest_hops(topology: Topology, root: int) -> dict:
    """Breadth-first tree from ``root``: rank -> the link that reaches it (None at the root)."""
    n = topology.num_ranks
    parent = {root: None}
    frontier = [root]
    while frontier:
        nxt = []
        for u in frontier:
            for v in range(n):
                li = topology.link_index.get((u, v))
                if li is not None and v not in parent:
                    parent[v] = li
                    nxt.append(v)
        frontier = nxt
    return parent


def _cheapest_tree(topology: Topology, root: int) -> tuple[int, ...]:
    """A minimum spanning arborescence from ``root`` (link indices) where a link costs the inverse bandwidth of
    every resource it uses: a shared NIC is crossed once and the data fans out behind it, where fewest-hop trees
    cross it once per remote rank (ndv2 x2 Allgather: 8 times the limit, and a 2 s MILP may not repair that)."""
    import networkx as nx

    per_link, bandwidth = resource_keys(topology)
    graph = nx.DiGraph()
    for li, link in enumerate(topology.links):
        if link.dst != root:
            graph.add_edge(link.src, link.dst, weight=sum(1.0 / bandwidth[key] for key in per_link[li]), link=li)
    tree = nx.minimum_spanning_arborescence(graph, attr="weight")
    return tuple(graph[u][v]["link"] for u, v in nx.bfs_edges(tree, root))


def solve_packing(topology: Topology, commodities, chunks: int, integer: bool = True, group=(),
                  options: SolverOptions = SolverOptions(), floor_units: float | None = None,
                  fewest_links: bool = False, start_trees=None) -> Packing:
    """Solve the packing LP (``integer=False``) or MILP (warm-started from fewest-hop trees) for ``chunks``
    chunks per commodity. ``floor_units`` (the LP optimum times ``chunks``) lets the MILP be skipped when the
    start is already within ``options.mip_gap`` of it; the gap is then measured against it.
    ``fewest_links`` then solves a second MILP: the same load, on as few links as possible (a Broadcast over a
    switch becomes a chain, which every port serves once per chunk, instead of relay stars whose ports the
    scheduler cannot keep busy together). ``start_trees[k]``: a tree (link indices) for representative k to
    start from instead of the fewest-hop tree, when it loads the busiest resource less.

    Raises
    ------
    InfeasibleError
        A sink cannot be reached from its root.
    NoSolutionError
        The MILP found no packing within the time limit.
    """
    reps, images = orbit_representatives(commodities, list(group), topology.num_ranks)
    model = encode_packing(topology, reps, images, chunks, integer)
    initial = None
    if integer:
        initial = start_solution(topology, reps, chunks)
        initial[-1] = _start_units(model, initial)
        if start_trees is not None and len(start_trees) == len(reps):
            given = start_solution(topology, reps, chunks, start_trees)
            given[-1] = _start_units(model, given)
            initial = min(initial, given, key=lambda point: point[-1])
        cheapest = start_solution(topology, reps, chunks, tuple(_cheapest_tree(topology, c.root) for c in reps))
        cheapest[-1] = _start_units(model, cheapest)
        if initial[-1] > HOPELESS_START * cheapest[-1]:
            initial = cheapest
        if floor_units is not None and initial[-1] <= floor_units * (1 + options.mip_gap) + 1e-12:
            counts = np.rint(initial[:len(reps) * len(topology.links)]).astype(np.int64)
            return Packing(reps, images, chunks, float(initial[-1]), counts.reshape(len(reps), -1), OPTIMAL,
                           initial[-1] / floor_units - 1, 0.0)
    result = solve_model(model, options, initial)
    if result.status == INFEASIBLE:
        raise InfeasibleError(f"some rank of {topology.name} cannot be reached from a root; add links")
    if result.status not in (OPTIMAL, FEASIBLE):
        raise NoSolutionError(f"no tree packing found within {options.time_limit_s:g} s; raise --time-limit")
    num_links = len(topology.links)
    if fewest_links and integer:
        fewest, start = _fewest_links(model, result.x, len(reps) * num_links, chunks)
        second = solve_model(fewest, options, start)
        if second.status in (OPTIMAL, FEASIBLE):
            result = replace(second, x=second.x[:model.num_cols], gap=result.gap, status=result.status,
                             seconds=result.seconds + second.seconds)
    counts = result.x[:len(reps) * num_links].reshape(len(reps), num_links)
    if integer:
        counts = np.rint(counts).astype(np.int64)
    units = float(result.x[-1])
    gap = result.gap
    if floor_units is not None and integer:
        gap = min(gap if gap is not None else np.inf, units / floor_units - 1)
    return Packing(reps, images, chunks, units, counts, result.status, gap, result.seconds)


# Spanning arborescences are listed (for :func:`shallow_packing`) only where the product of the ranks' in-degrees,
# the parent choices to try, is at most this: dgx1 has 4^7 = 16,384 (0.05 s); a switch's all-pairs links have
# 7^7 on eight ranks, where the relay stars (:func:`_relay_stars`) are listed instead.
MAX_PARENT_CHOICES = 50_000
# Relay stars are listed on at most this many ranks (n - 1 trees of n - 1 links each)
MAX_RELAY_STAR_RANKS = 64


def shallow_packing(topology: Topology, commodity: Commodity, chunks: int, floor_units: float,
                    options: SolverOptions = SolverOptions(), relay_stars: bool = True
                    ) -> tuple[Packing, tuple[Tree, ...]] | None:
    """The packing of one spanning commodity (a Broadcast's) into the shallowest trees that still attain the
    optimal rate ``floor_units``: every spanning arborescence of the root is listed, and for the smallest depth
    ``D`` whose trees' packing LP reaches ``floor_units``, a MILP over the trees the LP uses gives each its
    integer number of chunks. Where the arborescences are too many to list (:data:`MAX_PARENT_CHOICES`), the relay
    stars are listed instead (``relay_stars``, :func:`_relay_stars`). None where neither can be listed, the sinks
    are not every other rank, or the integer packing found is not optimal.

    Why: a chunk's store-and-forward trip costs one chunk time per level, so the deepest tree sets how long the
    pipeline fills and drains; and which of the many optimal link loads the packing MILP returns, then decomposed
    greedily, is up to the solver. On dgx1 HiGHS 1.15 gave four trees of depth 3 and two Hamiltonian chains (7),
    HiGHS 1.16 twelve trees (Broadcast 1 GB simulated at 98.3% and 97.8% of the limit). Depth 3 cannot reach the
    rate (the LP needs 20% more time), depth 4 does: six trees, 98.6%.

    >>> from synth.model.topology import load_topology
    >>> topo = load_topology("ring-4")
    >>> packing, trees = shallow_packing(topo, Commodity(0, (1, 2, 3)), 4, 4 / 50)
    >>> sum(t.chunks for t in trees), round(packing.units, 6)   # both ways round the ring: 2 of 4 chunks per link
    (4, 0.08)
    """
    found = shallow_packings(topology, commodity, chunks, floor_units, options, relay_stars)
    return found[0] if found else None


def shallow_packings(topology: Topology, commodity: Commodity, chunks: int, floor_units: float,
                     options: SolverOptions = SolverOptions(), relay_stars: bool = True, unit_us: float = 0.0,
                     hop_us: float = 0.0) -> list[tuple[Packing, tuple[Tree, ...]]]:
    """:func:`shallow_packing`'s packing first (empty where it is None), then packings into shallower trees, below
    the rate, whose estimated time ``units * unit_us + depth * hop_us`` is less than its own: ``unit_us`` is what a
    unit of load costs (a chunk's bytes over 1 GB/s, microseconds), ``hop_us`` what a level of a tree adds to the
    pipeline (a hop's alpha and a chunk's time).

    Why: at small sizes a level costs more than the rate wins. dgx1 Broadcast 64 KB in 64 chunks: depth 4 (the
    rate) ran at 3.33 us, depth 3 (20% more load) at 2.71 us, as planned. At 1 GB the load outweighs the levels,
    and nothing shallower is packed.

    >>> from synth.model.topology import load_topology
    >>> dgx1, sinks = load_topology("dgx1"), Commodity(0, tuple(range(1, 8)))
    >>> floor = 64 / 150      # 64 chunks through the root's six 25 GB/s links (units)
    >>> [round(p.units, 3) for p, _ in shallow_packings(dgx1, sinks, 64, floor)]
    [0.44]
    >>> [round(p.units, 3) for p, _ in shallow_packings(dgx1, sinks, 64, floor, unit_us=1.024, hop_us=0.74)]
    [0.44, 0.52, 1.28]
    """
    if set(commodity.sinks) | {commodity.root} != set(range(topology.num_ranks)):
        return []
    listed = _arborescences(topology, commodity.root)
    stars = listed is None and relay_stars
    if stars:
        listed = _relay_stars(topology, commodity.root)
    if listed is None:
        return []
    solved = []      # (depth, trees, loads, capacity, LP) up to the first depth that reaches the rate
    for depth in sorted({d for _, d in listed}):
        trees = [links for links, d in listed if d <= depth]
        load, capacity = tree_loads(topology, trees)
        lp = solve_model(_tree_model(load, capacity, chunks, integer=False), options)
        if lp.x is None:
            continue
        solved.append((depth, trees, load, capacity, lp))
        if lp.x[-1] <= floor_units * (1 + 1e-7):
            break
    else:
        return []
    rate_depth = solved[-1][0]
    own_us = solved[-1][4].x[-1] * unit_us + rate_depth * hop_us
    found = []
    for depth, trees, load, capacity, lp in reversed(solved):
        if depth != rate_depth and lp.x[-1] * unit_us + depth * hop_us >= own_us:
            continue
        used = np.flatnonzero(lp.x[:-1] > 1e-9)
        milp = solve_model(_tree_model(load[:, used], capacity, chunks, integer=True), options)
        if milp.x is None or milp.status != OPTIMAL:
            if depth == rate_depth:
                return []
            continue
        counts = np.rint(milp.x[:-1]).astype(np.int64)
        chosen = tuple(Tree(trees[used[j]], int(c)) for j, c in enumerate(counts) if c > 0)
        link_counts = np.zeros((1, len(topology.links)), dtype=np.int64)
        for tree in chosen:
            link_counts[0, list(tree.links)] += tree.chunks
        units = float(np.max(load[:, used] @ counts / capacity))
        found.append((Packing((commodity,), ((tuple(range(topology.num_ranks)),),), chunks, units, link_counts,
                              OPTIMAL, units / floor_units - 1, lp.seconds + milp.seconds, stars), chosen))
    return found


def tree_loads(topology: Topology, trees) -> tuple[np.ndarray, np.ndarray]:
    """Per resource of :func:`~synth.formulations.routes.resource_keys` (rows) and tree (columns, link indices),
    how many times one chunk down the tree crosses it; and each resource's bandwidth (GB/s)."""
    per_link, bandwidth = resource_keys(topology)
    resource_index = {key: i for i, key in enumerate(bandwidth)}
    load = np.zeros((len(bandwidth), len(trees)))
    for j, links in enumerate(trees):
        for li in links:
            for key in per_link[li]:
                load[resource_index[key], j] += 1
    return load, np.array(list(bandwidth.values()), dtype=float)


def _tree_model(load: np.ndarray, capacity: np.ndarray, chunks: int, integer: bool) -> Model:
    """Chunks per listed tree (columns) and ``T`` last: every resource's ``load @ n <= capacity * T``, the trees
    carry ``chunks`` in all; minimise ``T``."""
    resources, trees = load.shape
    rows, cols = np.nonzero(load)
    rows = np.concatenate([rows, np.arange(resources), np.full(trees, resources)])
    cols = np.concatenate([cols, np.full(resources, trees), np.arange(trees)])
    vals = np.concatenate([load[np.nonzero(load)], -capacity, np.ones(trees)])
    cost = np.zeros(trees + 1)
    cost[-1] = 1.0
    kinds = np.zeros(trees + 1, dtype=bool)
    kinds[:-1] = integer
    return Model(cost, np.zeros(trees + 1), np.full(trees + 1, np.inf), kinds, rows.astype(np.int64),
                 cols.astype(np.int64), vals, np.concatenate([np.full(resources, -np.inf), [chunks]]),
                 np.concatenate([np.zeros(resources), [chunks]]))


def _arborescences(topology: Topology, root: int) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """Every spanning arborescence of ``root`` as (link indices, parents before children; depth), or None when
    there are more than :data:`MAX_PARENT_CHOICES` parent choices to try. Kept per link set and root: a request
    packs several chunk counts (0.09 s a listing on dgx1)."""
    return _listed_arborescences(topology.links, topology.num_ranks, root)


@functools.lru_cache(maxsize=8)
def _listed_arborescences(links, num_ranks: int, root: int) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    into: list[list[int]] = [[] for _ in range(num_ranks)]
    for li, link in enumerate(links):
        if link.dst != root and link.src != link.dst:
            into[link.dst].append(li)
    others = [v for v in range(num_ranks) if v != root]
    choices = 1
    for v in others:
        choices *= len(into[v])
        if choices > MAX_PARENT_CHOICES:
            return None
    out = []
    for parents in itertools.product(*(into[v] for v in others)):
        parent_of = {v: links[li].src for v, li in zip(others, parents)}
        depth = {root: 0}
        for v in others:
            path = []
            u = v
            while u not in depth and len(path) <= len(others):
                path.append(u)
                u = parent_of[u]
            if u not in depth:
                break       # a cycle: not an arborescence
            for w in reversed(path):
                depth[w] = depth[u] + 1
                u = w
        else:
            order = sorted(zip(others, parents), key=lambda pair: depth[pair[0]])
            out.append((tuple(li for _, li in order), max(depth.values())))
    return tuple(out)


def _relay_stars(topology: Topology, root: int) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """Where every rank has a link to every other (a switch's all-pairs links), the shallow trees that reach the
    rate: the star (depth 1), and per relay ``j`` the root's link to ``j`` then ``j``'s links to all the other
    ranks (depth 2), in the form of :func:`_arborescences`. None on more than :data:`MAX_RELAY_STAR_RANKS` ranks,
    or where the root lacks a link to some rank.

    Why: on a switch the packing's optimal trees are Hamiltonian chains (:func:`shallow_packing` cannot list
    the arborescences), whose pipeline fills over n - 1 hops, each an alpha: dgx-a100 Broadcast 1 MB ran at
    8.48 us against a 3.50 us bound. With a relay per tree, each chunk goes root -> relay -> everyone: the root
    sends every chunk once, and a rank takes every chunk once (its own tree's from the root, the others' from
    their relays), so with equal ports the relay stars attain the rate in two hops, once the chunks are many
    enough that a relay's n - 2 copies of its share fit its port (eight GPUs, 1024 chunks: 6 x 147 of 1024).

    >>> from synth.model.topology import load_topology
    >>> stars = _relay_stars(load_topology("dgx-a100"), 0)
    >>> len(stars), [depth for _, depth in stars[:3]], [len(links) for links, _ in stars[:2]]
    (8, [1, 2, 2], [7, 7])
    """
    n = topology.num_ranks
    if n > MAX_RELAY_STAR_RANKS:
        return None
    index = topology.link_index
    others = [v for v in range(n) if v != root]
    from_root = [index.get((root, v)) for v in others]
    if None in from_root:
        return None
    stars = [(tuple(from_root), 1)]
    for j, first in zip(others, from_root):
        fanned = [index.get((j, v)) for v in others if v != j]
        if None not in fanned:
            stars.append(((first, *fanned), 2))
    return tuple(stars)


def _fewest_links(model: Model, x: np.ndarray, num_x: int, chunks: int) -> tuple[Model, np.ndarray]:
    """The packing model with ``T`` fixed at its value in ``x`` and a binary per link column that must be 1 for
    the link to carry chunks; minimise their sum. Returns the model and ``x`` extended as its start."""
    t_col = model.num_cols - 1
    y_cols = model.num_cols + np.arange(num_x)
    rows = np.concatenate([model.rows, model.num_rows + np.arange(num_x), model.num_rows + np.arange(num_x)])
    cols = np.concatenate([model.cols, np.arange(num_x), y_cols])
    vals = np.concatenate([model.vals, np.ones(num_x), np.full(num_x, -float(chunks))])
    upper = np.concatenate([model.col_upper, np.ones(num_x)])
    upper[t_col] = x[t_col] * (1 + 1e-9)
    cost = np.concatenate([np.zeros(model.num_cols), np.ones(num_x)])
    start = np.concatenate([x, (np.rint(x[:num_x]) > 0).astype(float)])
    return Model(cost, np.zeros(len(cost)), upper, np.concatenate([model.integer, np.ones(num_x, dtype=bool)]),
                 rows, cols, vals, np.concatenate([model.row_lower, np.full(num_x, -np.inf)]),
                 np.concatenate([model.row_upper, np.zeros(num_x)])), start


def _start_units(model: Model, point: np.ndarray) -> float:
    """The smallest ``T`` that makes ``point`` (with ``T = 0``) feasible in the capacity rows."""
    t_col = model.num_cols - 1
    at_t = model.cols == t_col
    slopes = np.zeros(model.num_rows)
    np.add.at(slopes, model.rows[at_t], -model.vals[at_t])
    load = np.zeros(model.num_rows)
    np.add.at(load, model.rows[~at_t], model.vals[~at_t] * point[model.cols[~at_t]])
    cap_rows = slopes > 0
    return float(np.max(load[cap_rows] / slopes[cap_rows])) * (1 + 1e-9)


# ----------------------------------------------------------------------------------------------- decomposition

PYTHON_FLOW_MAX_RANKS = 64     # largest topology whose connectivity checks run in Python (see _Connectivity)


class _Connectivity:
    """Max-flow checks from one root on integer link capacities: augmenting paths in Python on small graphs (up to
    :data:`PYTHON_FLOW_MAX_RANKS` ranks; they stop once ``need`` units flow, and scipy's setup per call cost 45
    times as much on dgx1, most of a tree decomposition), scipy's C implementation on larger ones."""

    def __init__(self, topology: Topology, root: int, sinks):
        self.n = topology.num_ranks
        self.src = np.array([l.src for l in topology.links], dtype=np.int32)
        self.dst = np.array([l.dst for l in topology.links], dtype=np.int32)
        self.root = root
        self.sinks = tuple(sinks)
        self.pairs = [(l.src, l.dst) for l in topology.links]
        adjacent: list[set[int]] = [set() for _ in range(self.n)]
        for u, v in self.pairs:       # both ways: the residual graph of augmenting paths has the reverse arcs
            adjacent[u].add(v)
            adjacent[v].add(u)
        self.neighbours = [sorted(a) for a in adjacent]

    def _graph(self, capacity: np.ndarray):
        from scipy.sparse import csr_matrix     # (above PYTHON_FLOW_MAX_RANKS only: a single node never needs scipy)

        keep = capacity > 0
        return csr_matrix((capacity[keep].astype(np.int32), (self.src[keep], self.dst[keep])),
                          shape=(self.n, self.n))

    def at_least(self, capacity: np.ndarray, need: int) -> bool:
        """True if every sink can receive ``need`` units from the root within ``capacity``."""
        if need <= 0:
            return True
        if self.n > PYTHON_FLOW_MAX_RANKS:
            from scipy.sparse.csgraph import maximum_flow

            graph = self._graph(capacity)
            return all(maximum_flow(graph, self.root, t).flow_value >= need for t in self.sinks)
        base: list[dict[int, int]] = [dict.fromkeys(self.neighbours[u], 0) for u in range(self.n)]
        for (u, v), units in zip(self.pairs, capacity.tolist()):
            if units > 0:
                base[u][v] += units
        return all(self._flow_reaches(base, t, need) for t in self.sinks)

    def _flow_reaches(self, base: list[dict[int, int]], sink: int, need: int) -> bool:
        """Whether ``need`` units flow from the root to ``sink`` (shortest augmenting paths, stopped at ``need``)."""
        residual = [dict(row) for row in base]
        root, flow = self.root, 0
        while flow < need:
            parent = {root: root}
            queue = [root]
            for u in queue:
                for v, units in residual[u].items():
                    if units > 0 and v not in parent:
                        parent[v] = u
                        queue.append(v)
                if sink in parent:
                    break
            if sink not in parent:
                return False
            push, v = need - flow, sink
            while v != root:
                u = parent[v]
                push = min(push, residual[u][v])
                v = u
            v = sink
            while v != root:
                u = parent[v]
                residual[u][v] -= push
                residual[v][u] += push
                v = u
            flow += push
        return True


def decompose(topology: Topology, commodity: Commodity, capacity: np.ndarray, chunks: int) -> tuple[Tree, ...]:
    """Split integer link capacities in which every sink gets ``chunks`` units of flow into trees of the
    commodity carrying ``chunks`` chunks in all (arborescences spanning the sinks; paths for one sink).

    Raises
    ------
    SolverError
        The capacities do not admit the packing (a bug in the caller: the MILP guarantees it).
    """
    cap = np.asarray(capacity, dtype=np.int64).copy()
    check = _Connectivity(topology, commodity.root, commodity.sinks)
    if not check.at_least(cap, chunks):
        raise SolverError("tree decomposition: the capacities do not carry every chunk to every sink")
    out_links = [[] for _ in range(topology.num_ranks)]
    for li, link in enumerate(topology.links):
        out_links[link.src].append(li)
    needed = set(commodity.sinks) | {commodity.root}
    trees = []
    left = chunks
    while left > 0:
        links = _grow(topology, commodity, cap, left, check, out_links, needed)
        mask = np.zeros(len(cap), dtype=np.int64)
        mask[list(links)] = 1
        copies = _most_copies(cap, mask, left, check)
        cap -= copies * mask
        left -= copies
        trees.append(Tree(links, copies))
    return tuple(trees)


def _grow(topology, commodity, cap, left, check, out_links, needed) -> tuple[int, ...]:
    """One tree whose removal keeps every sink ``left - 1`` connected (Lovasz); for a single sink, a path.

    Links are tried breadth first (from the shallowest rank reached, then the most capacity left): a chunk's
    store-and-forward trip is one chunk time per level, so shallow trees fill and drain the pipeline sooner
    (dgx1 Broadcast: depth 3 instead of Hamiltonian chains of 7)."""
    depth = {commodity.root: 0}
    links: list[int] = []
    work = cap.copy()
    if len(commodity.sinks) == 1:
        return _path(topology, commodity, cap, out_links)
    while not needed <= depth.keys():
        candidates = sorted((li for u in depth for li in out_links[u]
                             if work[li] > 0 and topology.links[li].dst not in depth),
                            key=lambda li: (depth[topology.links[li].src], -work[li]))
        for li in candidates:
            work[li] -= 1
            if check.at_least(work, left - 1):
                links.append(li)
                depth[topology.links[li].dst] = depth[topology.links[li].src] + 1
                break
            work[li] += 1
        else:
            raise SolverError("tree decomposition: no edge keeps the remaining packing feasible")
    return tuple(links)


def _path(topology, commodity, cap, out_links) -> tuple[int, ...]:
    """A root-to-sink path on links with capacity left (a flow decomposition step; flows have no useful cycles
    here because the MILP never gains from one)."""
    sink = commodity.sinks[0]
    parent = {commodity.root: None}
    frontier = [commodity.root]
    while frontier and sink not in parent:
        nxt = []
        for u in frontier:
            for li in out_links[u]:
                v = topology.links[li].dst
                if cap[li] > 0 and v not in parent:
                    parent[v] = li
                    nxt.append(v)
        frontier = nxt
    if sink not in parent:
        raise SolverError("tree decomposition: a sink cannot be reached on the capacities left")
    path, v = [], sink
    while parent[v] is not None:
        path.append(parent[v])
        v = topology.links[parent[v]].src
    return tuple(reversed(path))


def _most_copies(cap, mask, left, check) -> int:
    """The largest m <= left with ``cap - m * mask`` keeping every sink ``left - m`` connected (monotone in m)."""
    hi = min(left, int(cap[mask > 0].min()))
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if check.at_least(cap - mid * mask, left - mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
