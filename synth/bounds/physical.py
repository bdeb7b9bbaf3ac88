"""Lower bounds on collective time ("the physical limit", DESIGN section 5).

Two bounds, both in microseconds:

- **bandwidth**: the time the links and switch ports need to carry what must cross every cut, computed from a
  flow network of the topology (below) with fluid (arbitrarily divisible) data; and **drain**, that time plus
  the least alpha (:func:`drain_alpha_us`): the last byte through the busiest link or port still has to arrive;
- **latency**: the alpha-weighted diameter, the largest over the rank pairs that must communicate of the
  shortest alpha path; ``hops`` is the same in hops;
- **direct** (a latency bound that counts bytes, :func:`direct_bound_us`): before any relayed path could bring
  a source's data, it must come in direct messages, and those queue on the links and switch ports they share;
- **crossing** (several nodes, :mod:`synth.bounds.crossing`): what must leave a node through its NIC ports,
  counting how many sources a byte can sum and how many destinations it can reach in the time left.

``limit_us`` is the largest of them. Sizes follow nccl-tests (DESIGN section 4): Allgather ``size_bytes`` is
the output buffer, ReduceScatter the input buffer, Allreduce/Broadcast/Reduce the buffer, Alltoall the per-rank
send buffer, Gather the root's output buffer and Scatter the root's input buffer. Bandwidths are GB/s = 1e3
bytes per microsecond, so a "1 GB" figure depends on whether 1e9 or 2**30 bytes is meant (the TE-CCL limits in
DESIGN section 9 use 1e9).

Flow network: one node per rank and one capacity per directed link (``lanes * bw_GBps``). A switch is modelled
by its ports: the ranks on a port feed an egress node whose throughput is the port's egress bandwidth, and an
ingress node of the same kind feeds them; egress nodes reach the ingress nodes of the other ports. Pairs that
have both a direct link and a path through a switch keep both paths here (the topology keeps only the direct
link), which can only lower the bound, so it stays valid.

Per collective:

- Allgather: for every sink rank, a super-source feeding each rank its shard (M/N) must push M into the sink
  when links carry ``T * bandwidth``; the smallest such T is found exactly by a parametric (Newton) search over
  min cuts instead of bisection. This equals the cut bound ``(M/N) * max_S |S| / bw(S -> not S)`` and is
  attained by spanning-tree packing. Where GPUs share a NIC, the ranks behind it together must also receive
  their shards through their own links and that one port (:func:`shared_ingress_units`).
- ReduceScatter: Allgather on the reversed network. Allreduce: ReduceScatter + Allgather.
- Broadcast (Reduce): ``M / min_t maxflow(root -> t)`` (on the reversed network).
- Scatter (Gather): the parametric search from the root (to the root, on the reversed network).
- Alltoall: the maximum concurrent flow LP (one commodity per source rank), solved with HiGHS; where that LP
  would take minutes (hundreds of ranks), min cuts around ranks, shared ports and nodes (a weaker bound, valid
  still; it is tight on rail-optimized clusters, where the NICs bind).

>>> from synth.model.topology import load_topology
>>> b = lower_bound("allgather", load_topology("ring-4"), 4_000_000)
>>> round(b.bandwidth_us, 3), b.latency_us, b.hops, b.binding
(60.0, 1.4, 2, 'bandwidth')
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import MappingProxyType

import networkx as nx
import numpy as np

from synth.bounds.crossing import crossing_bound_us
from synth.model.collectives import data_pairs, make_collective, normalize_name, pair_bytes
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS, load_bound_us
from synth.errors import InputError
from synth.solver.highs import solve_lp
from synth.model.symmetry import rank_orbit_reps
from synth.schedule.transforms import CONCATENATION_PARTS, REVERSAL_DUAL
from synth.model.topology import Topology

_SOURCE = "super-source"
_REL_TOL = 1e-9
_MAX_NEWTON = 100
# lower_bound's work is about (links) x (ranks it searches from): a max-flow search per sink rank, and a
# shortest-path search per source rank. At about 10 us per unit, this cap keeps a bound under ~10 s
# (fully-connected-64, ring-512); fully-connected-1024 (10**9 units) used to run past 5 minutes at 1.7 GB.
MAX_BOUND_WORK = 1 << 20


@dataclass(frozen=True)
class Bound:
    """Lower bounds for one collective at one size on one topology.

    Attributes
    ----------
    bandwidth_us : float
        Bandwidth bound in microseconds (fluid data; links and switch ports at full rate).
    latency_us : float
        Alpha-weighted diameter over the rank pairs the collective connects, microseconds.
    limit_us : float
        ``max(drain_us, direct_us, crossing_us)`` (``drain_us >= bandwidth_us``, ``direct_us >= latency_us``).
    binding : str
        ``"bandwidth"`` or ``"latency"`` (the alpha diameter, or the direct bound above it): the larger of the
        two. The crossing bound counts both (at large sizes it is the bandwidth bound plus a crossing's latency),
        and the drain bound adds an alpha to the bandwidth bound, so neither changes which binds (what is offered
        where latency binds, :mod:`synth.synthesis.gathered`, stays as it was measured); :attr:`limit_source`
        says which bound gives ``limit_us``.
    hops : int
        Hop diameter over the same pairs (a lower bound on the number of steps).
    direct_us : float
        The direct bound (:func:`direct_bound_us`), at least ``latency_us``.
    crossing_us : float
        The crossing bound (:mod:`synth.bounds.crossing`), at least ``bandwidth_us`` and ``direct_us``: their
        larger where it adds nothing (one node, or a collective it does not count).
    chunk_path_us : float
        For schedules that move whole chunks (``chunks_per_rank`` per rank), the slowest store-and-forward
        path of one chunk (alpha plus chunk bytes / bandwidth per hop); informative, not part of ``limit_us``.
    drain_us : float
        The bandwidth bound plus :func:`drain_alpha_us` (``bandwidth_us`` where that does not apply).
    """

    collective: str
    topology: str
    size_bytes: int
    bandwidth_us: float
    latency_us: float
    limit_us: float
    binding: str
    hops: int
    chunk_path_us: float
    method: str
    direct_us: float = 0.0
    crossing_us: float = 0.0
    drain_us: float = 0.0

    @property
    def search_limit_us(self) -> float:
        """The limit without the drain bound's alpha: what the searches' early exits compare with ("a plan within
        2% of the limit skips the slower searches", :data:`synth.synthesis.select.TREES_AT_LIMIT`). They were
        measured against it, and with the drain's alpha they would skip searches whose smaller programs tie:
        ring-4 Allgather 1 MB, whose tree packing ends at the drained limit, would no longer get its 2-step
        plan."""
        return max(self.bandwidth_us, self.direct_us, self.crossing_us)

    @property
    def limit_source(self) -> str:
        """Which bound gives ``limit_us``: ``"crossing"`` where it tops the others, else ``"bandwidth"`` where the
        drain bound (or the bandwidth bound) reaches the direct bound, else ``"latency"``."""
        drain_us = max(self.drain_us, self.bandwidth_us)
        if self.crossing_us > max(drain_us, self.direct_us):
            return "crossing"
        return "bandwidth" if drain_us >= self.direct_us else "latency"

    @property
    def algbw_GBps(self) -> float:
        """nccl-tests' algorithm bandwidth at the limit, GB/s."""
        return self.size_bytes / (self.limit_us * BYTES_PER_US_PER_GBPS) if self.limit_us > 0 else math.inf

    def to_dict(self) -> dict:
        out = asdict(self)
        out["algbw_GBps"] = self.algbw_GBps
        return out


def lower_bound(collective_name: str, topology: Topology, size_bytes: float, chunks_per_rank: int = 1,
                root: int | None = None) -> Bound:
    """Bandwidth and latency lower bounds of a collective at ``size_bytes`` (nccl-tests' size) in microseconds.

    Parameters
    ----------
    collective_name : str
        Any name :func:`synth.model.collectives.normalize_name` accepts.
    topology : Topology
    size_bytes : float
        nccl-tests' size in bytes (DESIGN section 4).
    chunks_per_rank : int
        Only used for ``chunk_path_us``.
    root : int, optional
        Root of Broadcast, Reduce, Gather, Scatter (default 0).

    Raises
    ------
    InputError
        Unknown collective, bad root or size, or a topology where some rank cannot reach another.
    """
    name = normalize_name(collective_name)
    if size_bytes <= 0:
        raise InputError("--size", "", f"size must be positive, got {size_bytes!r}")
    coll = make_collective(name, topology.num_ranks, chunks_per_rank, root)
    sources, reverse = _path_searches(name, topology, coll.root)
    _check_work(name, topology, len(sources))
    bw_us, method = bandwidth_bound_us(name, topology, size_bytes, coll.root)
    latency_us, hops = _diameters(topology, sources, reverse)
    links = topology.link_arrays()
    chunk_us = _farthest(topology, sources, reverse, links.alpha_us + coll.chunk_bytes(size_bytes) /
                         (links.capacity_GBps * BYTES_PER_US_PER_GBPS))
    alpha_paths = topology.distances(range(topology.num_ranks), links.alpha_us) \
        if topology.num_ranks <= DIRECT_MAX_RANKS else None
    direct_us = direct_bound_us(name, topology, size_bytes, coll.root, latency_us, alpha_paths)
    crossing_us = crossing_bound_us(name, topology, size_bytes, coll.root, max(bw_us, direct_us), alpha_paths)
    drain_us = bw_us + drain_alpha_us(topology) if bw_us > 0 else bw_us
    binding = "bandwidth" if bw_us >= direct_us else "latency"
    return Bound(name, topology.name, int(size_bytes), bw_us, latency_us, max(crossing_us, drain_us), binding, hops,
                 chunk_us, method, direct_us, crossing_us, drain_us)


def drain_alpha_us(topology: Topology) -> float:
    """What the drain bound adds to the bandwidth bound (us): the least alpha of any link, or 0 where it is not
    sound or would take long to prove.

    Why: in any schedule some link or switch port is busy for at least the bandwidth bound (the transfers'
    loads are a routing, and none beats the fluid optimum), its transfers take its bandwidth one after another
    from time 0, and the last of them arrives an alpha after its bytes have gone through (:class:`~synth.schedule.
    costmodel.LinkClock`: arrival = start + alpha + bytes / link bandwidth). Through a port slower than the link
    the port is held longer than the link's time, and the bytes arrive less than an alpha after the port is
    free, so such a topology gets 0; so does a composed cluster, whose links are not listed one by one (its
    crossing bound counts a crossing's latency). dgx-h100 Allgather 1 MB: 2.04 us by bandwidth, 2.64 us drained,
    which our plan takes.

    >>> from synth.model.topology import load_topology
    >>> drain_alpha_us(load_topology("dgx-h100")), drain_alpha_us(load_topology("ring-4"))
    (0.6, 0.7)
    """
    if not isinstance(topology.links, tuple) or not topology.links:
        return 0.0
    ports = topology.port_capacity()
    if any(ports[p] < link.capacity_GBps * (1 - 1e-12) for link in topology.links for p in link.ports):
        return 0.0
    return min(link.alpha_us for link in topology.links)


def _check_work(name: str, topology: Topology, path_searches: int) -> None:
    """Refuse, before any work, a bound that would take minutes (see :data:`MAX_BOUND_WORK`): a search from or
    to every rank (broadcast's min cut per rank, Alltoall's commodity per rank), or, for the others, from one
    rank per orbit of the symmetry (max-flow sinks, shortest paths: a composed cluster has one or a few)."""
    searches = topology.num_ranks if name in ("broadcast", "reduce") else path_searches
    work = len(topology.links) * searches
    if work > MAX_BOUND_WORK:
        raise InputError(topology.name, "", f"{name} bounds on {topology.num_ranks} ranks and {len(topology.links)} "
                         f"links need {work} units of flow and path search, more than the "
                         f"{MAX_BOUND_WORK} this command does in about 10 s; use fewer ranks or a topology with "
                         "fewer links")


def bandwidth_bound_us(collective_name: str, topology: Topology, size_bytes: float,
                       root: int | None = None) -> tuple[float, str]:
    """The bandwidth bound alone, microseconds, and a short description of how it was computed.

    A concatenation (Allreduce) needs the sum of its parts' times; a reduction collective (and Gather) the
    time of its dual (:data:`synth.schedule.transforms.REVERSAL_DUAL`; Gather: Scatter) on the reversed network.
    """
    name = normalize_name(collective_name)
    n = topology.num_ranks
    root = 0 if root is None else root
    net = flow_network(topology)
    parts = CONCATENATION_PARTS.get(name)
    if parts:
        units = sum(_flow_units(p, net, n, topology.symmetries, root)[0] for p in parts)
        labels = " + ".join(_PART_LABELS.get(p, p) for p in parts)
        return _shards_time(units, size_bytes / n), f"max-flow ({labels})"
    if name == "alltoall" and len(topology.links) * n > MAX_BOUND_WORK:
        return _shards_time(alltoall_cut_units(net, topology), size_bytes / n), ALLTOALL_CUTS
    units, per_shard, method = _flow_units(name, net, n, topology.symmetries, root)
    return _shards_time(units, size_bytes / n if per_shard else size_bytes), method


# How the Alltoall bound is found where the concurrent-flow LP (a commodity per rank) would take minutes.
ALLTOALL_CUTS = "min cuts around ranks, shared ports and nodes (the concurrent-flow LP is too large here)"


# Collectives whose flow bound is their dual's on the reversed network: the reductions, and Gather (Scatter's).
_REVERSED_FLOW = MappingProxyType({**REVERSAL_DUAL, "gather": "scatter"})
_PART_LABELS = MappingProxyType({"reducescatter": "reduce-scatter"})


def _flow_units(name: str, net: nx.DiGraph, n: int, symmetries, root: int) -> tuple[float, bool, str]:
    """``(units, per_shard, method)``: the time in units of (data unit / GB/s), where a data unit is a shard
    (size / n) when ``per_shard`` else the whole buffer."""
    dual = _REVERSED_FLOW.get(name)
    if dual is not None:
        units, per_shard, _ = _flow_units(dual, net.reverse(copy=True), n, symmetries, root)
        return units, per_shard, "max-flow (reversed)"
    if name == "allgather":
        return allgather_units(net, n, symmetries), True, "max-flow"
    if name == "broadcast":
        return broadcast_units(net, n, root), False, "max-flow"
    if name == "scatter":
        return scatter_units(net, n, root), True, "max-flow"
    return alltoall_units(net, n), True, "concurrent-flow LP"


def _shards_time(units: float, unit_bytes: float) -> float:
    """Time in us when ``units`` is a time per (unit of data / GB/s) and a unit holds ``unit_bytes``."""
    return units * unit_bytes / BYTES_PER_US_PER_GBPS


# ----------------------------------------------------------------------------------------------- flow network

def flow_network(topology: Topology) -> nx.DiGraph:
    """The topology as a flow network: edges with ``slope`` (GB/s) are capacitated, edges without are unlimited.

    Nodes are the ranks (ints) and, per switch port, ``("egress"|"egress-out"|"ingress"|"ingress-out", switch,
    port)``. A switch whose ports each serve one rank gets one ``("hub", switch)`` node between its egress and
    ingress nodes (a path back to the same port would be a cycle, which no flow needs); a switch with shared
    ports (a NIC) links every egress node to every other port's ingress node, so ranks on one port cannot
    reach each other through it. A spine's port is fed by its leaf's egress nodes and feeds the leaf's ingress
    nodes (the uplink is shared by the whole leaf), and the spine is a hub between its ports.
    """
    g = nx.DiGraph()
    g.add_nodes_from(range(topology.num_ranks))
    for link in topology.direct_links():
        _add_capacity(g, link.src, link.dst, link.capacity_GBps)
    by_name = {sw.name: sw for sw in topology.switches}
    for sw in topology.switches:
        shared = not sw.is_spine and any(len(p.ranks) > 1 for p in sw.ports)
        for p, port in enumerate(sw.ports):
            eg, eg_out = ("egress", sw.name, p), ("egress-out", sw.name, p)
            ing, ing_out = ("ingress", sw.name, p), ("ingress-out", sw.name, p)
            _add_capacity(g, eg, eg_out, port.egress_GBps)
            _add_capacity(g, ing, ing_out, port.ingress_GBps)
            if port.switch:
                for q in range(len(by_name[port.switch].ports)):
                    g.add_edge(("egress-out", port.switch, q), eg)
                    g.add_edge(ing_out, ("ingress", port.switch, q))
            else:
                for r in port.ranks:
                    g.add_edge(r, eg)
                    g.add_edge(ing_out, r)
            if not shared:
                g.add_edge(eg_out, ("hub", sw.name))
                g.add_edge(("hub", sw.name), ing)
        if shared:
            for p in range(len(sw.ports)):
                for q in range(len(sw.ports)):
                    if p != q:
                        g.add_edge(("egress-out", sw.name, p), ("ingress", sw.name, q))
    return g


def _add_capacity(g: nx.DiGraph, u, v, slope_GBps: float) -> None:
    if g.has_edge(u, v) and "slope" in g[u][v]:
        g[u][v]["slope"] += slope_GBps
    else:
        g.add_edge(u, v, slope=slope_GBps)


def _parametric_time(net: nx.DiGraph, supplies: dict, sink, demand: float) -> float:
    """Smallest T such that the super-source can push ``demand`` into ``sink`` when capacitated edges carry
    ``T * slope`` and the super-source edge into node v carries ``supplies[v]``.

    Max flow is a concave piecewise-linear function of T (a minimum over cuts of ``A + T * B``), so Newton's
    method from T = 0 climbs through the cut lines and stops exactly at the answer. Returns ``inf`` when no T
    suffices (the sink cannot be reached).
    """
    g = net.copy()
    for v, amount in supplies.items():
        g.add_edge(_SOURCE, v, const=amount)
    t = 0.0
    for _ in range(_MAX_NEWTON):
        for _, _, d in g.edges(data=True):
            if "slope" in d:
                d["capacity"] = t * d["slope"]
            elif "const" in d:
                d["capacity"] = d["const"]
        value, (side, _) = nx.minimum_cut(g, _SOURCE, sink)
        if value >= demand * (1 - _REL_TOL):
            return t
        const, slope = _cut_line(g, side)
        if slope <= 0:
            return math.inf
        t_next = (demand - const) / slope
        if t_next <= t * (1 + _REL_TOL):
            return t_next
        t = t_next
    return t


def _cut_line(g: nx.DiGraph, side: set) -> tuple[float, float]:
    """``(A, B)`` of a cut whose capacity is ``A + T * B``."""
    const = slope = 0.0
    for u in side:
        for v, d in g[u].items():
            if v not in side:
                const += d.get("const", 0.0)
                slope += d.get("slope", 0.0)
    return const, slope


def allgather_units(net: nx.DiGraph, n: int, symmetries=()) -> float:
    """Allgather time in units of (shard / GB/s): every rank receives all ``n`` shards.

    The larger of the max-flow bound into one sink at a time and the receive bound of the ranks that share an
    ingress port (:func:`shared_ingress_units`), which the one-sink cuts cannot see.
    """
    supplies = {r: 1.0 for r in range(n)}
    sinks = rank_orbit_reps(n, symmetries)
    one_sink = max(_parametric_time(net, supplies, t, float(n)) for t in sinks)
    return max(one_sink, shared_ingress_units(net, n, float(n - 1)))


def shared_ingress_units(net: nx.DiGraph, n: int, need_per_rank: float) -> float:
    """Time, in units of (data unit / GB/s), for every rank to receive ``need_per_rank`` units, judged per group
    of ranks that share a switch port (a NIC shared by GPUs).

    Every byte a rank receives enters through one of its capacitated in-edges: a direct link, or a port node
    (an uncapacitated edge from a node whose own in-edges are capacitated: a port's ingress; its egress on the
    reversed network). A group of ranks therefore needs at least (group size x need) / (the capacity of its
    direct in-links plus each of its ports counted once). For one sink alone that is a cut the max flow already
    sees; for two GPUs behind one NIC it is not (each may take the NIC's whole bandwidth in the one-sink flow,
    but they share it). Groups: the ranks behind each shared port, and each rank alone.

    >>> g = nx.DiGraph()
    >>> for r in (0, 1):   # two ranks behind one 10 GB/s port, each with a 20 GB/s link of its own
    ...     _ = g.add_edge(("ingress-out", "nic", 0), r); _add_capacity(g, ("peer", r), r, 20.0)
    >>> _add_capacity(g, ("ingress", "nic", 0), ("ingress-out", "nic", 0), 10.0)
    >>> shared_ingress_units(g, 2, 1.0)      # 2 units over 20 + 20 + 10 GB/s
    0.04
    """
    def port_capacity(port) -> float:
        return sum(d.get("slope", math.inf) for _, _, d in net.in_edges(port, data=True))

    groups = [{r} for r in range(n)]
    for node in net.nodes:
        if not isinstance(node, int):
            fed = {v for v in net.successors(node) if isinstance(v, int) and "slope" not in net[node][v]}
            if len(fed) > 1:
                groups.append(fed)
    worst = 0.0
    for group in groups:
        direct, ports = 0.0, set()
        for r in group:
            for u, _, data in net.in_edges(r, data=True):
                if "slope" in data:
                    direct += data["slope"]
                else:
                    ports.add(u)
        capacity = direct + sum(port_capacity(p) for p in ports)
        if 0 < capacity < math.inf:
            worst = max(worst, len(group) * need_per_rank / capacity)
    return worst


def scatter_units(net: nx.DiGraph, n: int, root: int) -> float:
    """Scatter time in units of (shard / GB/s): the root sends one shard to every other rank.

    Every shard starts at the root, so this is a single-commodity flow from the root to a super-sink fed by
    one shard's worth from each other rank.
    """
    g = net.copy()
    sink = "super-sink"
    for r in range(n):
        if r != root:
            g.add_edge(r, sink, const=1.0)
    return _parametric_time(g, {root: float(n)}, sink, float(n - 1))


def broadcast_units(net: nx.DiGraph, n: int, root: int) -> float:
    """Broadcast time in units of (buffer / GB/s): ``1 / min_t maxflow(root, t)``."""
    g = net.copy()
    for _, _, d in g.edges(data=True):
        if "slope" in d:
            d["capacity"] = d["slope"]
    worst = min(nx.maximum_flow_value(g, root, t) for t in range(n) if t != root)
    return math.inf if worst <= 0 else 1.0 / worst


def alltoall_units(net: nx.DiGraph, n: int) -> float:
    """Alltoall time in units of (per-pair block / GB/s) from the maximum concurrent flow LP.

    One commodity per source rank s (exact for this demand): ``f[s, e] >= 0``, conservation at every node
    with ``n - 1`` units leaving s and one unit arriving at every other rank, and
    ``sum_s f[s, e] <= T * slope_e`` on every capacitated edge; minimise T.
    """
    nodes = list(net.nodes)
    node_index = {v: i for i, v in enumerate(nodes)}
    edges = list(net.edges(data=True))
    num_nodes, num_edges = len(nodes), len(edges)
    capacitated = [k for k, (_, _, d) in enumerate(edges) if "slope" in d]
    t_col = n * num_edges
    rows, cols, vals = [], [], []
    tails = np.array([node_index[u] for u, _, _ in edges])
    heads = np.array([node_index[v] for _, v, _ in edges])
    edge_ids = np.arange(num_edges)
    for s in range(n):
        base_row, base_col = s * num_nodes, s * num_edges
        rows += [base_row + tails, base_row + heads]
        cols += [base_col + edge_ids, base_col + edge_ids]
        vals += [np.ones(num_edges), -np.ones(num_edges)]
    cap_row0 = n * num_nodes
    for j, k in enumerate(capacitated):
        rows.append(np.full(n, cap_row0 + j))
        cols.append(np.arange(n) * num_edges + k)
        vals.append(np.ones(n))
    cap_rows = cap_row0 + np.arange(len(capacitated))
    rows.append(cap_rows)
    cols.append(np.full(len(capacitated), t_col))
    vals.append(-np.array([edges[k][2]["slope"] for k in capacitated]))
    supply = np.zeros(n * num_nodes)
    for s in range(n):
        for d in range(n):
            supply[s * num_nodes + node_index[d]] = (n - 1) if d == s else -1.0
    row_lower = np.concatenate([supply, np.full(len(capacitated), -np.inf)])
    row_upper = np.concatenate([supply, np.zeros(len(capacitated))])
    cost = np.zeros(t_col + 1)
    cost[t_col] = 1.0
    return solve_lp(cost, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), row_lower, row_upper,
                    "the alltoall bound LP")


def alltoall_cut_units(net: nx.DiGraph, topology: Topology) -> float:
    """A lower bound on Alltoall time in units of (per-pair block / GB/s) from cuts, for clusters where the
    concurrent-flow LP is too large (256 ranks: 256 commodities over the whole network).

    A group S of ranks sends ``|S| (n - |S|)`` blocks to the other ranks and receives as many, and every block
    crosses each cut between S and the rest at least once: time >= blocks / min cut, both ways. Groups: one rank
    per orbit of the symmetry, the ranks behind each shared port, and every node (those holding such a rank: a
    symmetry maps every other group onto one of them, cut and all). On 32 x DGX-H100 the node cut
    (8 NICs) binds: a GPU's 248 of 256 blocks through its own NIC.

    >>> from synth.model.topology import load_topology
    >>> t = load_topology("dgx-h100", nodes=2)
    >>> alltoall_cut_units(flow_network(t), t) == alltoall_units(flow_network(t), t.num_ranks)
    True
    """
    n = topology.num_ranks
    reps = set(rank_orbit_reps(n, topology.symmetries))   # a group's cut is its image's under a symmetry
    groups = [{r} for r in sorted(reps)]
    if topology.num_nodes > 1:
        groups += [set(range(k * topology.gpus_per_node, (k + 1) * topology.gpus_per_node))
                   for k in sorted({topology.node_of(r) for r in reps})]
    for node in net.nodes:
        if not isinstance(node, int):
            fed = {v for v in net.successors(node) if isinstance(v, int) and "slope" not in net[node][v]}
            if 1 < len(fed) < n and fed & reps:
                groups.append(fed)
    g = net.copy()
    for _, _, d in g.edges(data=True):
        if "slope" in d:
            d["capacity"] = d["slope"]
    worst = 0.0
    for group in groups:
        blocks = len(group) * (n - len(group))
        for graph in (g, g.reverse(copy=False)):
            cut = _group_cut(graph, group, n)
            worst = max(worst, math.inf if cut <= 0 else blocks / cut)
    return worst


def _group_cut(g: nx.DiGraph, group: set, n: int) -> float:
    """The min cut (GB/s) from the ranks in ``group`` to every other rank (capacities set on ``g``)."""
    source, sink = ("group-source",), ("group-sink",)
    h = g.copy()
    h.add_edges_from((source, r) for r in group)
    h.add_edges_from((r, sink) for r in range(n) if r not in group)
    return nx.maximum_flow_value(h, source, sink)


# ----------------------------------------------------------------------------------------------- latency

DIRECT_MAX_RANKS = 128     # the direct bound compares every pair's relayed paths: N^2 entries per link source
DIRECT_MAX_STEPS = 64      # relayed-path thresholds it steps through (heterogeneous profiles have many)


def direct_bound_us(collective_name: str, topology: Topology, size_bytes: float, root: int | None,
                    latency_us: float, alpha_paths: np.ndarray | None = None) -> float:
    """A latency bound that counts bytes, microseconds: at least ``latency_us`` (the alpha diameter), and at
    least the time the messages that must go direct need on the links and switch ports they share.

    A destination needs every element of each source's data it depends on (a shard, or the whole buffer for
    Broadcast, Reduce and Allreduce: an element carries one index's sum, so nothing shrinks it). Before ``T``
    reaches the fastest relayed path from the source (alpha of a first link to another rank plus that rank's
    shortest alpha path on), that data can only come over the direct link, so for a candidate ``T`` every such
    pair's bytes are booked on their links and ports (:func:`~synth.schedule.costmodel.load_bound_us`, the cost
    model's own serialisation). The bound is the least ``T`` that books in time: a dgx2 Allreduce of 1 KB sends
    every rank's buffer straight to the other 15 through one NVSwitch port (0.473 us) or relays it (two alphas,
    0.7 us), never the 0.35 us of one alpha. Topologies over :data:`DIRECT_MAX_RANKS` ranks get ``latency_us``.
    ``alpha_paths``: every pair's shortest alpha path, where the caller has it.

    >>> from synth.model.topology import load_topology
    >>> round(direct_bound_us("allreduce", load_topology("dgx2"), 1024, None, 0.35), 3)
    0.473
    """
    n = topology.num_ranks
    if n > DIRECT_MAX_RANKS:
        return latency_us
    name = normalize_name(collective_name)
    pairs, nbytes = data_pairs(name, n, root), pair_bytes(name, size_bytes, n)
    links = topology.link_arrays()
    distance = topology.distances(range(n), links.alpha_us) if alpha_paths is None else alpha_paths
    relayed = np.full((n, n), np.inf)          # fastest path of at least two hops
    for link in topology.links:
        via = link.alpha_us + distance[link.dst]
        via[link.dst] = np.inf
        np.minimum(relayed[link.src], via, out=relayed[link.src])
    direct = [(s, d, float(relayed[s, d])) for s, d in pairs if (s, d) in topology.link_index]
    bound = latency_us
    for _ in range(DIRECT_MAX_STEPS):     # each step is a valid bound: stopping early only weakens it
        forced = [(s, d, r) for s, d, r in direct if r > bound]
        if not forced:
            return bound
        booked = load_bound_us([(s, d) for s, d, _ in forced], topology, nbytes)
        sooner = min(r for _, _, r in forced)     # from here on the pairs this far are relayed in time
        if booked < sooner:
            return max(bound, booked)
        bound = sooner
    return bound


def _path_searches(name: str, topology: Topology, root: int | None) -> tuple[tuple[int, ...], bool]:
    """The ranks whose shortest-path searches cover every pair of ranks whose data must meet, and whether they
    run on the reversed graph: from the root, to the root (the reversed graph from it), or between all pairs,
    where one rank per orbit of the symmetry suffices (an automorphism keeps every path's alpha and bandwidth,
    so every rank of an orbit is as far from the rest)."""
    if name in ("broadcast", "scatter"):
        return (root,), False
    if name in ("reduce", "gather"):
        return (root,), True
    return rank_orbit_reps(topology.num_ranks, topology.symmetries), False


def _farthest(topology: Topology, sources, reverse: bool, weights) -> float:
    """Max over the pairs the ``sources`` stand for of the shortest path under per-link ``weights``."""
    return float(topology.distances(sources, weights, reverse).max())


def _diameters(topology: Topology, sources, reverse: bool) -> tuple[float, int]:
    """Max over the pairs the ``sources`` stand for of the shortest alpha path (us) and of the hop distance."""
    hops = topology.distances(sources, reverse=reverse)
    if np.isinf(hops).any():
        row, col = (int(x[0]) for x in np.nonzero(np.isinf(hops)))
        s = list(sources)[row]
        src, dst = (col, s) if reverse else (s, col)
        raise InputError(topology.source, "links", f"rank {dst} cannot be reached from rank {src}; add links")
    return _farthest(topology, sources, reverse, topology.link_arrays().alpha_us), int(hops.max())
