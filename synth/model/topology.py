"""Topology model: ranks, nodes, directed links, switches and NICs.

Units: ``alpha_us`` is microseconds, ``bw_GBps`` is GB/s (1e9 bytes per second) *per lane*; a link with
``lanes`` parallel lanes carries ``lanes * bw_GBps``. A switch (NVSwitch, or the network switch joining nodes)
is modelled by ports: every port has egress and ingress bandwidth and serves one or more ranks (a NIC shared by
the ranks of a node is one port). Every pair of ranks on different ports of a switch gets a logical link through
the switch; transfers on such links also share the two ports' bandwidth.

Built-in topologies are JSON files under ``topologies/`` and go through the same loader as user files
(the format is documented by ``synth/schemas/topology.schema.json`` and the README).
"""

from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

from synth.errors import InputError
from synth.fileio import document_name, parse_json, read_json
from synth.model.taccl import is_taccl_topology, taccl_topology_to_dict
from synth.text_enum import TextEnum

MAX_RANKS = 4096
FORMAT = "synth-topology/1"
# NCCL's path types between two GPUs, best first (NCCL's kvDictLinkType spelling).
PATH_TYPES = ("NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")


# Sources x links up to which Topology.distances searches in Python (a composed cluster's are left to scipy)
PYTHON_SEARCH_MAX_WORK = 200_000


class Direction(TextEnum):
    """Which way a transfer crosses a switch port: ``egress`` from the port's ranks into the switch, ``ingress``
    from the switch out to them (a NIC's send and receive sides)."""

    EGRESS = "egress"
    INGRESS = "ingress"


class Fabric(TextEnum):
    """How ``--nodes`` copies of a machine are joined through their NICs (DESIGN section 9).

    ``switch``: one network switch, a port per NIC. ``rail``: rail-optimized, NIC k of every node on leaf
    switch k, the leaves joined by a spine (oversubscribed or not); a machine with one NIC has one rail, so the
    two are the same there.
    """

    SWITCH = "switch"
    RAIL = "rail"


class PortUse(NamedTuple):
    """One switch port direction a link's transfers occupy: the shared resource of DESIGN section 3.

    The one key every cost model, bound and formulation uses for a port (``Topology.port_capacity`` gives its
    bandwidth), so a port is charged the same way everywhere. A named tuple: it is a dict key in hot loops.
    """

    switch: str
    port: int
    direction: Direction


@dataclass(frozen=True)
class Link:
    """A directed connection ``src -> dst``.

    ``ports`` are the switch port directions a logical link through switches occupies, in path order: the
    sender's egress and the receiver's ingress port on one switch, plus the uplinks' ports when the path climbs
    to a spine; empty for a direct link. A transfer also uses each port's bandwidth. ``path_type`` is NCCL's
    name for what the link is made of (``NVL`` NVLink/xGMI, ``PIX``/``PXB``/``PHB``/``SYS`` PCIe paths, see
    :data:`PATH_TYPES`) when known, e.g. from an NCCL topology dump; empty means unknown (built-ins describe
    NVLink and NVSwitch).
    """

    src: int
    dst: int
    alpha_us: float
    bw_GBps: float
    lanes: int = 1
    ports: tuple[PortUse, ...] = ()
    path_type: str = ""

    @property
    def capacity_GBps(self) -> float:
        """Total bandwidth of the link over all lanes, GB/s."""
        return self.bw_GBps * self.lanes

    @property
    def switch(self) -> str | None:
        """The switch the link enters (its first port's), None for a direct link."""
        return self.ports[0].switch if self.ports else None

    @property
    def sender_port(self) -> PortUse | None:
        """The sender's egress port (its first), None for a direct link: an MSCCL program issues a rank's sends
        through one port in the schedule's order (``backends.msccl.lowering``), and the list scheduler books them
        so (:mod:`synth.schedule.list_scheduler`); sends of other ranks on a shared port (a NIC) go as they come."""
        return self.ports[0] if self.ports else None


@dataclass(frozen=True)
class SwitchPort:
    """One port of a switch, used by ``ranks`` (one GPU on an NVSwitch; a node's GPUs on a NIC).

    A spine's port leads down to a leaf switch (``switch``, the leaf's name; empty for a port that attaches
    ranks) and serves every rank below that leaf; its bandwidth is the leaf's uplink.
    """

    ranks: tuple[int, ...]
    egress_GBps: float
    ingress_GBps: float
    switch: str = ""


@dataclass(frozen=True)
class Switch:
    """A switch: every rank on one port can reach every rank on another port in one hop.

    A spine (its ports lead to leaf switches) joins the ranks below different leaves: a transfer climbs through
    the sender's leaf port and the spine port above it, and comes down the receiver's; ``alpha_us`` of a spine
    is the latency those extra hops add to the leaf's.
    """

    name: str
    alpha_us: float
    ports: tuple[SwitchPort, ...]

    @property
    def is_spine(self) -> bool:
        """True when the ports lead to leaf switches rather than to ranks."""
        return bool(self.ports) and bool(self.ports[0].switch)


@dataclass(frozen=True)
class Nic:
    """A node's network interface: which local ranks use it, its bandwidth (GB/s) and latency (us).

    ``net_devs`` are NCCL's network device numbers (``<net dev>`` of a topology dump) of its ports and
    ``path_type`` NCCL's path type from its GPUs to it (PIX, PXB, PHB, SYS), when the topology was imported
    from a dump; NCCL graph files name NICs by the former and carry the latter as ``typeinter``.
    """

    ranks: tuple[int, ...]
    bw_GBps: float
    alpha_us: float
    net_devs: tuple[int, ...] = ()
    path_type: str = ""


@dataclass(frozen=True)
class LinkArrays:
    """A topology's links as parallel numpy arrays: ``src``, ``dst`` (int64 ranks), ``alpha_us`` and
    ``capacity_GBps`` (all lanes), in link order."""

    src: object
    dst: object
    alpha_us: object
    capacity_GBps: object


@dataclass(frozen=True)
class Topology:
    """A machine (one or more nodes) as the synthesizer sees it.

    ``sms_per_gpu`` is the GPU's number of streaming multiprocessors: every threadblock of an MSCCL program must
    be resident at once, so a GPU runs at most that many (V100 80, A100 108, H100 SXM 132); None when unknown.

    ``links`` are sorted by ``(src, dst)``: a tuple, or for a composed cluster a table that makes each link on
    demand (:class:`synth.model.fabric.ComposedLinks`; 128 nodes of 8 GPUs have a million links through the
    fabric). ``link_index`` maps ``(src, dst)`` to the link's position either way.
    """

    name: str
    num_ranks: int
    gpus_per_node: int
    links: Sequence[Link]
    switches: tuple[Switch, ...] = ()
    nics: tuple[Nic, ...] = ()
    symmetries: tuple[tuple[int, ...], ...] = ()
    description: str = ""
    source: str = "<memory>"
    sms_per_gpu: int | None = None
    link_index: dict = field(default=None, compare=False, repr=False)
    _arrays: LinkArrays | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if isinstance(self.links, tuple):
            index = {}
            for i, link in enumerate(self.links):
                index.setdefault((link.src, link.dst), i)
        else:
            index = self.links.link_index
        object.__setattr__(self, "link_index", index)

    def direct_links(self) -> Iterator[Link]:
        """The links that use no switch (NVLink, PCIe), without making the links through switches."""
        if isinstance(self.links, tuple):
            return (l for l in self.links if not l.ports)
        return self.links.direct_links()

    def link_endpoints(self):
        """``(src, dst)``: int64 numpy arrays of every link's ends, in link order."""
        arrays = self.link_arrays()
        return arrays.src, arrays.dst

    def link_arrays(self) -> LinkArrays:
        """Every link's ends, latency and capacity as numpy arrays (in link order), without making the links of
        a composed cluster one by one."""
        import numpy as np

        if self._arrays is not None:
            return self._arrays
        if not isinstance(self.links, tuple):
            arrays = self.links.arrays()
        else:
            count = len(self.links)
            arrays = LinkArrays(np.fromiter((l.src for l in self.links), np.int64, count),
                                np.fromiter((l.dst for l in self.links), np.int64, count),
                                np.fromiter((l.alpha_us for l in self.links), float, count),
                                np.fromiter((l.capacity_GBps for l in self.links), float, count))
        for a in (arrays.src, arrays.dst, arrays.alpha_us, arrays.capacity_GBps):
            a.setflags(write=False)
        object.__setattr__(self, "_arrays", arrays)
        return arrays

    def link_indices(self, src, dst):
        """Positions of the links ``src[k] -> dst[k]`` (numpy arrays of ranks, any shape); -1 where none."""
        import numpy as np

        if not isinstance(self.links, tuple):
            return self.links.indices(src, dst)
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        index = self.link_index
        flat = [index.get(pair, -1) for pair in zip(src.ravel().tolist(), dst.ravel().tolist())]
        return np.array(flat, dtype=np.int64).reshape(src.shape)

    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, src: int, dst: int) -> Link | None:
        """The link from ``src`` to ``dst`` or None."""
        i = self.link_index.get((src, dst))
        return None if i is None else self.links[i]

    def graph(self):
        """Directed graph (networkx DiGraph) of ranks with ``alpha_us`` and ``capacity_GBps`` edge attributes."""
        import networkx as nx  # lazily: the CLI imports this module for its limits before any work

        g = nx.DiGraph()
        g.add_nodes_from(range(self.num_ranks))
        for i, link in enumerate(self.links):
            g.add_edge(link.src, link.dst, alpha_us=link.alpha_us, capacity_GBps=link.capacity_GBps, index=i)
        return g

    def port_capacity(self) -> dict[PortUse, float]:
        """Bandwidth (GB/s) of every switch port direction a link may use."""
        caps = {}
        for sw in self.switches:
            for p, port in enumerate(sw.ports):
                caps[PortUse(sw.name, p, Direction.EGRESS)] = port.egress_GBps
                caps[PortUse(sw.name, p, Direction.INGRESS)] = port.ingress_GBps
        return caps

    def sparse_graph(self, weights=None, reverse: bool = False):
        """The rank graph as a scipy CSR matrix for ``scipy.sparse.csgraph``: entry ``[src, dst]`` is ``weights``
        of the link (an array in link order; default 1) from ``src`` to ``dst`` (``[dst, src]`` when
        ``reverse``). Zero weights stay edges. Made from :meth:`link_arrays`, so a composed cluster's million
        links never become objects."""
        import numpy as np
        from scipy.sparse import csr_matrix

        links = self.link_arrays()
        _, first = np.unique(links.src * self.num_ranks + links.dst, return_index=True)  # the first of duplicates
        data = np.ones(len(first)) if weights is None else np.asarray(weights, dtype=float)[first]
        src, dst = (links.dst[first], links.src[first]) if reverse else (links.src[first], links.dst[first])
        return csr_matrix((data, (src, dst)), shape=(self.num_ranks, self.num_ranks))

    def hop_distances(self) -> list[list[int]]:
        """All-pairs hop distance (``num_ranks`` means unreachable)."""
        import numpy as np

        dist = self.distances(range(self.num_ranks))
        return np.where(np.isinf(dist), self.num_ranks, dist).astype(int).tolist()

    def distances(self, sources, weights=None, reverse: bool = False):
        """Shortest paths from ``sources`` (rows, a numpy array ``len(sources) x num_ranks``; inf: unreachable)
        under per-link ``weights`` (an array in link order; None: hops), on the reversed graph when ``reverse``.
        Small searches (:data:`PYTHON_SEARCH_MAX_WORK`) run in Python: importing scipy costs a single-node solve
        0.35 s, more than they take; larger ones run in scipy on :meth:`sparse_graph`."""
        import heapq

        import numpy as np

        sources = list(sources)
        links = self.link_arrays()
        if len(sources) * len(links.src) > PYTHON_SEARCH_MAX_WORK:
            from scipy.sparse.csgraph import dijkstra

            return dijkstra(self.sparse_graph(weights, reverse), directed=True, indices=sources,
                            unweighted=weights is None).reshape(-1, self.num_ranks)
        n = self.num_ranks
        cost = [1.0] * len(links.src) if weights is None else np.asarray(weights, dtype=float).tolist()
        heads, tails = (links.dst, links.src) if reverse else (links.src, links.dst)
        out: list[dict[int, float]] = [{} for _ in range(n)]
        for a, b, w in zip(heads.tolist(), tails.tolist(), cost):
            out[a].setdefault(b, w)            # the first of duplicate links, as sparse_graph keeps
        dist = np.full((len(sources), n), np.inf)
        for row, source in enumerate(sources):
            best = [math.inf] * n
            best[source] = 0.0
            queue = [(0.0, source)]
            while queue:
                d, u = heapq.heappop(queue)
                if d > best[u]:
                    continue
                for v, w in out[u].items():
                    if d + w < best[v]:
                        best[v] = d + w
                        heapq.heappush(queue, (d + w, v))
            dist[row] = best
        return dist

    def to_dict(self) -> dict:
        """The JSON form (links through switches are implied by the switches and not listed)."""
        out = {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "ranks": self.num_ranks,
            "gpus_per_node": self.gpus_per_node,
            **({"sms_per_gpu": self.sms_per_gpu} if self.sms_per_gpu else {}),
            "links": [
                dict({"src": l.src, "dst": l.dst, "alpha_us": l.alpha_us, "bw_GBps": l.bw_GBps, "lanes": l.lanes},
                     **({"path_type": l.path_type} if l.path_type else {}))
                for l in self.direct_links()
            ],
            "switches": [
                {"name": s.name, "alpha_us": s.alpha_us,
                 "ports": [dict({"switch": p.switch} if p.switch else {"ranks": list(p.ranks)},
                                egress_GBps=p.egress_GBps, ingress_GBps=p.ingress_GBps) for p in s.ports]}
                for s in self.switches
            ],
            "nics": [dict({"ranks": list(n.ranks), "bw_GBps": n.bw_GBps, "alpha_us": n.alpha_us},
                          **({"net_devs": list(n.net_devs)} if n.net_devs else {}),
                          **({"path_type": n.path_type} if n.path_type else {})) for n in self.nics],
        }
        if self.symmetries:
            out["symmetries"] = [list(s) for s in self.symmetries]
        return out


# ----------------------------------------------------------------------------------------------- loading

# Physically meaningful ranges: anything outside is a typo or an attack, and breaks the solver's numerics.
BW_RANGE_GBPS = (1e-3, 1e5)          # 1 MB/s .. 100 TB/s per lane or port
ALPHA_RANGE_US = (0.0, 1e6)          # up to a second of latency
MAX_LANES = 64
MAX_SMS_PER_GPU = 1024               # streaming multiprocessors (H100 SXM has 132)


def _num(raw: dict, key: str, source: str, where: str, default=None, positive=True, integer=False,
         bounds: tuple[float, float] | None = None):
    """A numeric field (``default`` when absent; None: required), finite, of the right type and in ``bounds``."""
    if key not in raw:
        if default is None:
            raise InputError(source, f"{where}.{key}", "missing; add it")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise InputError(source, f"{where}.{key}", f"must be {kind}, got {value!r}")
    if not math.isfinite(value):
        raise InputError(source, f"{where}.{key}", f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise InputError(source, f"{where}.{key}", f"must be positive, got {value!r}")
    if not positive and value < 0:
        raise InputError(source, f"{where}.{key}", f"must not be negative, got {value!r}")
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise InputError(source, f"{where}.{key}", f"{value!r} is outside the range {bounds[0]:g}..{bounds[1]:g}")
    return value


def _bw(raw: dict, key: str, source: str, where: str, default=None) -> float:
    """A bandwidth field in GB/s."""
    return float(_num(raw, key, source, where, default, bounds=BW_RANGE_GBPS))


def _alpha(raw: dict, key: str, source: str, where: str, default=None) -> float:
    """A latency field in us."""
    return float(_num(raw, key, source, where, default, positive=False, bounds=ALPHA_RANGE_US))


def _list(raw: dict, key: str, source: str, what: str) -> list:
    """An optional list field (empty when absent)."""
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise InputError(source, key, f"must be a list of {what}")
    return value


def _flag(raw: dict, key: str, source: str, where: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise InputError(source, f"{where}.{key}", f"must be true or false, got {value!r}")
    return value


def _rank(value, n: int, source: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise InputError(source, where, f"unknown rank {value!r}; ranks are 0..{n - 1}")
    return value


def switch_path(up: Sequence[tuple[Switch, int]], down: Sequence[tuple[Switch, int]]) \
        -> tuple[float, float, tuple[PortUse, ...]]:
    """``(alpha_us, bw_GBps, ports)`` of a path through switches: it enters switch ``up[k][0]`` at port ``up[k][1]``
    (egress) while climbing and leaves ``down[k][0]`` at port ``down[k][1]`` (ingress) coming down; one switch
    is ``up = ((s, p),), down = ((s, q),)``, a spine adds itself to both. The slowest port sets the bandwidth;
    the latency is the leaf's plus every spine's (its extra hops)."""
    ports = tuple(PortUse(s.name, p, Direction.EGRESS) for s, p in up) + \
        tuple(PortUse(s.name, p, Direction.INGRESS) for s, p in down)
    bw = min([s.ports[p].egress_GBps for s, p in up] + [s.ports[p].ingress_GBps for s, p in down])
    alpha = max(up[0][0].alpha_us, down[-1][0].alpha_us) + sum(s.alpha_us for s, _ in up[1:])
    return alpha, bw, ports


def _switch_links(switch: Switch, by_name: dict[str, Switch]) -> Iterator[Link]:
    """Every logical link through ``switch``: between ranks on two of its ports, or for a spine between ranks
    below two of its leaves."""
    for (pi, p), (qi, q) in itertools.permutations(enumerate(switch.ports), 2):
        if not switch.is_spine:
            hops = [((((switch, pi),), ((switch, qi),)), p.ranks, q.ranks)]
        else:
            leaf_a, leaf_b = by_name[p.switch], by_name[q.switch]
            hops = [((((leaf_a, ai), (switch, pi)), ((switch, qi), (leaf_b, bi))), pa.ranks, qb.ranks)
                    for ai, pa in enumerate(leaf_a.ports) for bi, qb in enumerate(leaf_b.ports)]
        for (up, down), senders, receivers in hops:
            alpha, bw, ports = switch_path(up, down)
            for a in senders:
                for b in receivers:
                    if a != b:
                        yield Link(a, b, alpha, bw, 1, ports)


def _leaf_ranks(name, spine: str, switches: list[Switch], spines: dict[str, str], source: str, where: str) \
        -> tuple[tuple[int, ...], str]:
    """The ranks below leaf switch ``name`` (declared before the spine, under no other spine) and its name."""
    leaf = next((s for s in switches if s.name == name), None) if isinstance(name, str) else None
    if leaf is None or leaf.is_spine:
        known = ", ".join(s.name for s in switches if not s.is_spine) or "none"
        raise InputError(source, f"{where}.switch", f"{name!r} is not a leaf switch declared before this spine "
                         f"(leaves: {known})")
    if name in spines:
        raise InputError(source, f"{where}.switch", f"leaf {name!r} is already below spine {spines[name]!r}")
    spines[name] = spine
    return tuple(sorted({r for p in leaf.ports for r in p.ranks})), name


def topology_from_dict(raw: dict, source: str = "<memory>") -> Topology:
    """Validate a topology in the JSON format and build it.

    Every problem raises :class:`InputError` naming ``source``, the field and the fix.
    """
    name = document_name(raw, source, FORMAT, "topology")
    gpn = _num(raw, "gpus_per_node", source, "topology", default=raw.get("ranks"), integer=True)
    n = _num(raw, "ranks", source, "topology", default=gpn, integer=True)
    if n > MAX_RANKS:
        raise InputError(source, "ranks", f"{n} ranks is more than the supported {MAX_RANKS}")
    if n % gpn:
        raise InputError(source, "gpus_per_node", f"{n} ranks do not split into nodes of {gpn}")
    sms = _num(raw, "sms_per_gpu", source, "topology", integer=True, bounds=(1, MAX_SMS_PER_GPU)) \
        if "sms_per_gpu" in raw else None
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InputError(source, "defaults", "must be an object with alpha_us and/or bw_GBps")
    default_alpha = _alpha(defaults, "alpha_us", source, "defaults") if "alpha_us" in defaults else None
    default_bw = _bw(defaults, "bw_GBps", source, "defaults") if "bw_GBps" in defaults else None

    links: dict[tuple[int, int], Link] = {}
    for i, rl in enumerate(_list(raw, "links", source, "{src, dst, alpha_us, bw_GBps, lanes}")):
        where = f"links[{i}]"
        if not isinstance(rl, dict):
            raise InputError(source, where, "must be an object with src and dst")
        src = _rank(rl.get("src"), n, source, f"{where}.src")
        dst = _rank(rl.get("dst"), n, source, f"{where}.dst")
        if src == dst:
            raise InputError(source, where, f"link from rank {src} to itself; remove it")
        alpha = _alpha(rl, "alpha_us", source, where, default=default_alpha)
        bw = _bw(rl, "bw_GBps", source, where, default=default_bw)
        lanes = _num(rl, "lanes", source, where, default=1, integer=True, bounds=(1, MAX_LANES))
        path_type = rl.get("path_type", "")
        if path_type and (not isinstance(path_type, str) or path_type not in PATH_TYPES):
            raise InputError(source, f"{where}.path_type", f"unknown path type {path_type!r}; NCCL's are "
                             f"{', '.join(PATH_TYPES)}")
        pairs = [(src, dst), (dst, src)] if _flag(rl, "bidirectional", source, where) else [(src, dst)]
        for a, b in pairs:
            if (a, b) in links:
                raise InputError(source, where, f"link {a}->{b} is listed twice; use lanes for parallel links")
            links[(a, b)] = Link(a, b, float(alpha), float(bw), int(lanes), path_type=path_type)

    switches: list[Switch] = []
    spines: dict[str, str] = {}           # leaf name -> the spine above it
    for si, rs in enumerate(_list(raw, "switches", source, "{name, alpha_us, ports}")):
        where = f"switches[{si}]"
        if not isinstance(rs, dict) or not isinstance(rs.get("ports"), list):
            raise InputError(source, where, "must be an object with a list of ports")
        sname = rs.get("name", f"switch{si}")
        if not isinstance(sname, str) or not sname:
            raise InputError(source, f"{where}.name", f"must be a non-empty string, got {sname!r}")
        alpha = _alpha(rs, "alpha_us", source, where, default=default_alpha)
        ports, seen = [], set()
        for pi, rp in enumerate(rs["ports"]):
            pwhere = f"{where}.ports[{pi}]"
            leaf_port = isinstance(rp, dict) and "switch" in rp
            if ports and leaf_port != bool(ports[0].switch):
                raise InputError(source, pwhere, "mixes ranks and leaf switches: a spine's ports all name a leaf "
                                 "switch ({\"switch\": name}), other switches' ports all list ranks")
            if leaf_port:
                ranks, child = _leaf_ranks(rp["switch"], sname, switches, spines, source, pwhere)
            elif not isinstance(rp, dict) or not isinstance(rp.get("ranks"), list) or not rp["ranks"]:
                raise InputError(source, pwhere, "must be an object with a non-empty list of ranks")
            else:
                ranks, child = tuple(_rank(r, n, source, f"{pwhere}.ranks") for r in rp["ranks"]), ""
            if seen & set(ranks):
                raise InputError(source, pwhere, f"rank(s) {sorted(seen & set(ranks))} are on two ports")
            seen |= set(ranks)
            bw = _bw(rp, "bw_GBps", source, pwhere) if "bw_GBps" in rp else None
            egress = _bw(rp, "egress_GBps", source, pwhere, default=bw)
            ingress = _bw(rp, "ingress_GBps", source, pwhere, default=bw)
            ports.append(SwitchPort(ranks, egress, ingress, child))
        switches.append(Switch(sname, float(alpha), tuple(ports)))
    names = [s.name for s in switches]
    if len(set(names)) != len(names):
        raise InputError(source, "switches", "switch names must be unique")
    by_name = {s.name: s for s in switches}
    for sw in switches:
        for link in _switch_links(sw, by_name):
            links.setdefault((link.src, link.dst), link)

    nics = []
    for ni, rn in enumerate(_list(raw, "nics", source, "{ranks, bw_GBps, alpha_us}")):
        where = f"nics[{ni}]"
        if not isinstance(rn, dict) or not isinstance(rn.get("ranks"), list):
            raise InputError(source, where, "must be an object with ranks, bw_GBps and alpha_us")
        ranks = tuple(_rank(r, gpn, source, f"{where}.ranks") for r in rn["ranks"])
        devs = rn.get("net_devs", [])
        if not isinstance(devs, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                 for d in devs):
            raise InputError(source, f"{where}.net_devs", "must be a list of NCCL net device numbers (>= 0)")
        path_type = rn.get("path_type", "")
        if path_type and (not isinstance(path_type, str) or path_type not in PATH_TYPES):
            raise InputError(source, f"{where}.path_type", f"unknown path type {path_type!r}; NCCL's are "
                             f"{', '.join(PATH_TYPES)}")
        nics.append(Nic(ranks, _bw(rn, "bw_GBps", source, where), _alpha(rn, "alpha_us", source, where, default=1.0),
                        tuple(devs), path_type))

    symmetries = []
    for k, perm in enumerate(_list(raw, "symmetries", source, "rank permutations")):
        if not isinstance(perm, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in perm) \
                or sorted(perm) != list(range(n)):
            raise InputError(source, f"symmetries[{k}]", f"must be a permutation of 0..{n - 1}")
        symmetries.append(tuple(perm))

    topo = Topology(name=name, num_ranks=n, gpus_per_node=gpn, links=tuple(links[k] for k in sorted(links)),
                    switches=tuple(switches), nics=tuple(nics), symmetries=tuple(symmetries),
                    description=str(raw.get("description", "")), source=source, sms_per_gpu=sms)
    from synth.model.symmetry import is_automorphism  # lazily: symmetry needs numpy, the CLI's limits do not

    for k, perm in enumerate(topo.symmetries):
        if not is_automorphism(topo, perm):
            raise InputError(source, f"symmetries[{k}]", "is not an automorphism of the links; remove it")
    return topo


def load_topology_file(path: str | Path) -> Topology:
    """Load a topology JSON file (our format; TACCL's profiles are recognised and converted, see synth.model.taccl)."""
    source = str(path)
    raw = read_json(path, "topology")
    if is_taccl_topology(raw):
        raw = taccl_topology_to_dict(raw, source)
    return topology_from_dict(raw, source)


# ----------------------------------------------------------------------------------------------- built-ins

def builtin_dir():
    return resources.files("synth.topologies")


def builtin_names() -> list[str]:
    """Names of the shipped topology files plus the parametric families."""
    names = sorted(p.name[:-5] for p in builtin_dir().iterdir() if p.name.endswith(".json"))
    return names


_FAMILY = re.compile(r"^(ring|fully-connected)-(\d+)$")
# Largest N of each family: fully-connected-N has N(N-1) links, and 256 (65,280 links) already takes seconds.
FAMILY_MAX_RANKS = {"ring": 1024, "fully-connected": 256}


def _family_dict(kind: str, n: int) -> dict:
    if kind == "ring":
        links = [{"src": r, "dst": (r + 1) % n, "bidirectional": True} for r in range(n)] if n > 2 else \
            [{"src": 0, "dst": 1, "bidirectional": True}]
        desc = f"{n} GPUs in a bidirectional ring"
    else:
        links = [{"src": a, "dst": b} for a in range(n) for b in range(n) if a != b]
        desc = f"{n} GPUs, every pair directly linked"
    return {"format": FORMAT, "name": f"{kind}-{n}", "description": desc, "ranks": n, "gpus_per_node": n,
            "defaults": {"alpha_us": 0.7, "bw_GBps": 25.0}, "links": links,
            "symmetries": [[(r + k) % n for r in range(n)] for k in range(1, n)] if kind == "ring" else []}


def load_topology(name_or_path: str, nodes: int = 1, fabric: Fabric | str = Fabric.SWITCH,
                  oversubscription: float = 1.0) -> Topology:
    """Load a built-in topology by name or a JSON file by path, optionally composed to ``nodes`` nodes joined by
    ``fabric`` (:func:`compose_nodes`).

    >>> load_topology("ring-4").num_ranks
    4
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or os.path.exists(path):     # os.path: False, not OSError, for an overlong name
        topo = load_topology_file(path)
    else:
        # Names are case-insensitive: msccl-tools and TACCL spell them DGX1, DGX2, NDv2.
        key = name_or_path.lower()
        candidate = builtin_dir() / f"{key}.json"
        if key in builtin_names():        # not candidate.is_file(): that raises for an overlong name
            topo = topology_from_dict(parse_json(candidate.read_bytes(), f"topologies/{key}.json"),
                                      f"topologies/{key}.json")
        else:
            m = _FAMILY.match(key)
            if m:
                kind, size = m.group(1), int(m.group(2))
                if not 2 <= size <= FAMILY_MAX_RANKS[kind]:
                    raise InputError("--topology", "", f"{kind}-N takes N in 2..{FAMILY_MAX_RANKS[kind]} (a "
                                     f"fully-connected machine has N x (N-1) links); got {size}")
                topo = topology_from_dict(_family_dict(kind, size), name_or_path)
            else:
                known = ", ".join(builtin_names() + ["ring-N", "fully-connected-N"])
                raise InputError("--topology", "", f"unknown topology {name_or_path!r}; use a JSON file path "
                                 f"or one of: {known}")
    if nodes != 1 or fabric != Fabric.SWITCH or oversubscription != 1.0:
        topo = compose_nodes(topo, nodes, fabric, oversubscription)
    return topo


# The largest cluster composed with --nodes: 1024 GPUs have a million logical links through the fabric.
MAX_COMPOSED_RANKS = 1024
MAX_OVERSUBSCRIPTION = 64.0


def compose_nodes(topo: Topology, nodes: int, fabric: Fabric | str = Fabric.SWITCH,
                  oversubscription: float = 1.0) -> Topology:
    """``nodes`` copies of a single-node topology joined through their NICs by a ``fabric`` (see
    :class:`Fabric`; ``oversubscription`` is the rail fabric's leaf-to-spine ratio, 1 = non-blocking).

    Its symmetries are known by construction: rotating the nodes, and the node's own symmetries (those that
    respect its NICs) applied in every node at once; together they generate a freely acting group of order
    ``nodes x |node group|``. Both keep every rail on a rail, so they hold for either fabric.

    >>> from synth.model.symmetry import free_symmetry_group
    >>> len(free_symmetry_group(compose_nodes(load_topology("dgx-h100"), 2)))
    16
    >>> compose_nodes(load_topology("dgx-h100"), 4, "rail").name
    'dgx-h100x4-rail'
    """
    from synth.model.fabric import compose  # lazily: numpy, and a module of its own

    try:
        fabric = Fabric(fabric)
    except ValueError:
        raise InputError("--fabric", "", f"unknown fabric {fabric!r}; use one of "
                         f"{', '.join(f.value for f in Fabric)}") from None
    if nodes < 1:
        raise InputError("--nodes", "", "must be at least 1")
    if not (math.isfinite(oversubscription) and 1.0 <= oversubscription <= MAX_OVERSUBSCRIPTION):
        raise InputError("--oversubscription", "", f"must be in 1..{MAX_OVERSUBSCRIPTION:g} (1 = non-blocking), "
                         f"got {oversubscription!r}")
    if nodes == 1:
        return topo
    if topo.num_nodes != 1:
        raise InputError(topo.source, "nodes", "--nodes composes single-node topologies; this one already has "
                         f"{topo.num_nodes} nodes")
    if not topo.nics:
        raise InputError(topo.source, "nics", "has no NICs, so nodes cannot be joined; add a nics entry")
    if fabric == Fabric.SWITCH and oversubscription != 1.0:
        raise InputError("--oversubscription", "", "applies to the spine of --fabric rail; the single network "
                         "switch is non-blocking")
    if nodes * topo.num_ranks > MAX_COMPOSED_RANKS:
        raise InputError("--nodes", "", f"{nodes} x {topo.num_ranks} GPUs is more than the {MAX_COMPOSED_RANKS} "
                         f"ranks a composed cluster may have; use --nodes 1..{MAX_COMPOSED_RANKS // topo.num_ranks}")
    return compose(topo, nodes, fabric, float(oversubscription))


def check_connected(topo: Topology) -> None:
    """Raise InputError unless every rank can reach every other rank."""
    import numpy as np

    if topo.num_ranks <= 1 or not (np.isinf(topo.distances([0])).any() or
                                   np.isinf(topo.distances([0], reverse=True)).any()):
        return
    from scipy.sparse.csgraph import connected_components

    count, labels = connected_components(topo.sparse_graph(), directed=True, connection="strong")
    if count > 1:
        comps = sorted(([r for r in range(topo.num_ranks) if labels[r] == c] for c in range(count)),
                       key=lambda ranks: (len(ranks), ranks))
        raise InputError(topo.source, "links", f"the topology is disconnected: ranks {comps[0]} cannot reach "
                         "or be reached from the others; add links")



def reversed_port(use: PortUse) -> PortUse:
    """The same port crossed the other way (a link reversed in time)."""
    other = Direction.INGRESS if use.direction == Direction.EGRESS else Direction.EGRESS
    return PortUse(use.switch, use.port, other)


def reverse_topology(topo: Topology) -> Topology:
    """The same machine with every link (and switch port direction) reversed.

    Reductions are solved as the time reversal of a broadcast-type schedule on this graph, so they run on the
    original links.
    """
    switches = tuple(Switch(s.name, s.alpha_us, tuple(SwitchPort(p.ranks, p.ingress_GBps, p.egress_GBps, p.switch)
                                                      for p in s.ports)) for s in topo.switches)
    if isinstance(topo.links, tuple):
        links = tuple(sorted((Link(l.dst, l.src, l.alpha_us, l.bw_GBps, l.lanes,
                                   tuple(reversed_port(u) for u in reversed(l.ports)), l.path_type)
                              for l in topo.links), key=lambda l: (l.src, l.dst)))
    else:
        links = topo.links.reversed(switches)
    return Topology(f"{topo.name}-reversed", topo.num_ranks, topo.gpus_per_node, links, switches, topo.nics,
                    topo.symmetries, topo.description, topo.source, topo.sms_per_gpu)
