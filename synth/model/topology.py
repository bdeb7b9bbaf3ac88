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
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import networkx as nx

from synth.errors import InputError
from synth.fileio import document_name
from synth.model.symmetry import is_automorphism

MAX_RANKS = 4096
FORMAT = "synth-topology/1"


@dataclass(frozen=True)
class Link:
    """A directed connection ``src -> dst``.

    ``switch``/``egress_port``/``ingress_port`` are set for logical links through a switch: the transfer then
    also uses those ports' bandwidth.
    """

    src: int
    dst: int
    alpha_us: float
    bw_GBps: float
    lanes: int = 1
    switch: str | None = None
    egress_port: int | None = None
    ingress_port: int | None = None

    @property
    def capacity_GBps(self) -> float:
        """Total bandwidth of the link over all lanes, GB/s."""
        return self.bw_GBps * self.lanes


@dataclass(frozen=True)
class SwitchPort:
    """One port of a switch, used by ``ranks`` (one GPU on an NVSwitch; a node's GPUs on a NIC)."""

    ranks: tuple[int, ...]
    egress_GBps: float
    ingress_GBps: float


@dataclass(frozen=True)
class Switch:
    """A switch: every rank on one port can reach every rank on another port in one hop."""

    name: str
    alpha_us: float
    ports: tuple[SwitchPort, ...]


@dataclass(frozen=True)
class Nic:
    """A node's network interface: which local ranks use it, its bandwidth (GB/s) and latency (us)."""

    ranks: tuple[int, ...]
    bw_GBps: float
    alpha_us: float


@dataclass(frozen=True)
class Topology:
    """A machine (one or more nodes) as the synthesizer sees it."""

    name: str
    num_ranks: int
    gpus_per_node: int
    links: tuple[Link, ...]
    switches: tuple[Switch, ...] = ()
    nics: tuple[Nic, ...] = ()
    symmetries: tuple[tuple[int, ...], ...] = ()
    description: str = ""
    source: str = "<memory>"
    link_index: dict = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        index = {}
        for i, link in enumerate(self.links):
            index.setdefault((link.src, link.dst), i)
        object.__setattr__(self, "link_index", index)

    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, src: int, dst: int) -> Link | None:
        """The link from ``src`` to ``dst`` or None."""
        i = self.link_index.get((src, dst))
        return None if i is None else self.links[i]

    def graph(self) -> nx.DiGraph:
        """Directed graph of ranks with ``alpha_us`` and ``capacity_GBps`` edge attributes."""
        g = nx.DiGraph()
        g.add_nodes_from(range(self.num_ranks))
        for i, link in enumerate(self.links):
            g.add_edge(link.src, link.dst, alpha_us=link.alpha_us, capacity_GBps=link.capacity_GBps, index=i)
        return g

    def port_capacity(self) -> dict[tuple[str, int, str], float]:
        """Bandwidth (GB/s) of every switch port direction, keyed by (switch, port, 'egress'|'ingress')."""
        caps = {}
        for sw in self.switches:
            for p, port in enumerate(sw.ports):
                caps[(sw.name, p, "egress")] = port.egress_GBps
                caps[(sw.name, p, "ingress")] = port.ingress_GBps
        return caps

    def hop_distances(self) -> list[list[int]]:
        """All-pairs hop distance (``num_ranks`` means unreachable)."""
        n = self.num_ranks
        dist = [[n] * n for _ in range(n)]
        for src, lengths in nx.all_pairs_shortest_path_length(self.graph()):
            for dst, d in lengths.items():
                dist[src][dst] = d
        return dist

    def to_dict(self) -> dict:
        """The JSON form (links through switches are implied by the switches and not listed)."""
        out = {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "ranks": self.num_ranks,
            "gpus_per_node": self.gpus_per_node,
            "links": [
                {"src": l.src, "dst": l.dst, "alpha_us": l.alpha_us, "bw_GBps": l.bw_GBps, "lanes": l.lanes}
                for l in self.links if l.switch is None
            ],
            "switches": [
                {"name": s.name, "alpha_us": s.alpha_us,
                 "ports": [{"ranks": list(p.ranks), "egress_GBps": p.egress_GBps, "ingress_GBps": p.ingress_GBps}
                           for p in s.ports]}
                for s in self.switches
            ],
            "nics": [{"ranks": list(n.ranks), "bw_GBps": n.bw_GBps, "alpha_us": n.alpha_us} for n in self.nics],
        }
        if self.symmetries:
            out["symmetries"] = [list(s) for s in self.symmetries]
        return out


# ----------------------------------------------------------------------------------------------- loading

def _num(raw: dict, key: str, source: str, where: str, default=None, positive=True, integer=False):
    if key not in raw:
        if default is None:
            raise InputError(source, f"{where}.{key}", "missing; add it")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise InputError(source, f"{where}.{key}", f"must be {kind}, got {value!r}")
    if positive and value <= 0:
        raise InputError(source, f"{where}.{key}", f"must be positive, got {value!r}")
    if not positive and value < 0:
        raise InputError(source, f"{where}.{key}", f"must not be negative, got {value!r}")
    return value


def _rank(value, n: int, source: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise InputError(source, where, f"unknown rank {value!r}; ranks are 0..{n - 1}")
    return value


def _switch_links(switch: Switch) -> list[Link]:
    links = []
    for (pi, p), (qi, q) in itertools.permutations(enumerate(switch.ports), 2):
        bw = min(p.egress_GBps, q.ingress_GBps)
        for a in p.ranks:
            for b in q.ranks:
                if a != b:
                    links.append(Link(a, b, switch.alpha_us, bw, 1, switch.name, pi, qi))
    return links


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
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InputError(source, "defaults", "must be an object with alpha_us and/or bw_GBps")

    links: dict[tuple[int, int], Link] = {}
    raw_links = raw.get("links", [])
    if not isinstance(raw_links, list):
        raise InputError(source, "links", "must be a list of {src, dst, alpha_us, bw_GBps, lanes}")
    for i, rl in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(rl, dict):
            raise InputError(source, where, "must be an object with src and dst")
        src = _rank(rl.get("src"), n, source, f"{where}.src")
        dst = _rank(rl.get("dst"), n, source, f"{where}.dst")
        if src == dst:
            raise InputError(source, where, f"link from rank {src} to itself; remove it")
        alpha = _num(rl, "alpha_us", source, where, default=defaults.get("alpha_us"), positive=False)
        bw = _num(rl, "bw_GBps", source, where, default=defaults.get("bw_GBps"))
        lanes = _num(rl, "lanes", source, where, default=1, integer=True)
        pairs = [(src, dst), (dst, src)] if rl.get("bidirectional", False) else [(src, dst)]
        for a, b in pairs:
            if (a, b) in links:
                raise InputError(source, where, f"link {a}->{b} is listed twice; use lanes for parallel links")
            links[(a, b)] = Link(a, b, float(alpha), float(bw), int(lanes))

    switches = []
    for si, rs in enumerate(raw.get("switches", [])):
        where = f"switches[{si}]"
        if not isinstance(rs, dict) or not isinstance(rs.get("ports"), list):
            raise InputError(source, where, "must be an object with a list of ports")
        sname = rs.get("name", f"switch{si}")
        alpha = _num(rs, "alpha_us", source, where, default=defaults.get("alpha_us"), positive=False)
        ports, seen = [], set()
        for pi, rp in enumerate(rs["ports"]):
            pwhere = f"{where}.ports[{pi}]"
            if not isinstance(rp, dict) or not isinstance(rp.get("ranks"), list) or not rp["ranks"]:
                raise InputError(source, pwhere, "must be an object with a non-empty list of ranks")
            ranks = tuple(_rank(r, n, source, f"{pwhere}.ranks") for r in rp["ranks"])
            if seen & set(ranks):
                raise InputError(source, pwhere, f"rank(s) {sorted(seen & set(ranks))} are on two ports")
            seen |= set(ranks)
            bw = rp.get("bw_GBps")
            egress = _num(rp, "egress_GBps", source, pwhere, default=bw)
            ingress = _num(rp, "ingress_GBps", source, pwhere, default=bw)
            ports.append(SwitchPort(ranks, float(egress), float(ingress)))
        switches.append(Switch(sname, float(alpha), tuple(ports)))
    names = [s.name for s in switches]
    if len(set(names)) != len(names):
        raise InputError(source, "switches", "switch names must be unique")
    for sw in switches:
        for link in _switch_links(sw):
            links.setdefault((link.src, link.dst), link)

    nics = []
    for ni, rn in enumerate(raw.get("nics", [])):
        where = f"nics[{ni}]"
        if not isinstance(rn, dict) or not isinstance(rn.get("ranks"), list):
            raise InputError(source, where, "must be an object with ranks, bw_GBps and alpha_us")
        ranks = tuple(_rank(r, gpn, source, f"{where}.ranks") for r in rn["ranks"])
        nics.append(Nic(ranks, float(_num(rn, "bw_GBps", source, where)),
                        float(_num(rn, "alpha_us", source, where, default=1.0, positive=False))))

    symmetries = []
    for k, perm in enumerate(raw.get("symmetries", [])):
        if not isinstance(perm, list) or sorted(perm) != list(range(n)):
            raise InputError(source, f"symmetries[{k}]", f"must be a permutation of 0..{n - 1}")
        symmetries.append(tuple(perm))

    topo = Topology(name=name, num_ranks=n, gpus_per_node=gpn, links=tuple(links[k] for k in sorted(links)),
                    switches=tuple(switches), nics=tuple(nics), symmetries=tuple(symmetries),
                    description=str(raw.get("description", "")), source=source)
    for k, perm in enumerate(topo.symmetries):
        if not is_automorphism(topo, perm):
            raise InputError(source, f"symmetries[{k}]", "is not an automorphism of the links; remove it")
    return topo


def load_topology_file(path: str | Path) -> Topology:
    """Load a topology JSON file (our format; TACCL's format is recognised and converted)."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(source, "", f"cannot read file ({exc.strerror})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    if isinstance(raw, dict) and "links" in raw and isinstance(raw.get("links"), list) and raw["links"] \
            and isinstance(raw["links"][0], list):
        raw = taccl_to_dict(raw, source)
    return topology_from_dict(raw, source)


def taccl_to_dict(raw: dict, source: str) -> dict:
    """Convert TACCL's topology format: ``links`` (lane-count matrix), ``alpha``/``betas`` (us, us/MB) matrices.

    TACCL stores beta in microseconds per megabyte (1e6 bytes), so ``bw_GBps = 1e3 / beta``.
    """
    matrix = raw["links"]
    n = len(matrix)
    alpha = raw.get("alpha", raw.get("alphas"))
    betas = raw.get("betas", raw.get("beta"))
    out_links = []
    for i in range(n):
        if not isinstance(matrix[i], list) or len(matrix[i]) != n:
            raise InputError(source, f"links[{i}]", f"must be a row of {n} lane counts")
        for j in range(n):
            lanes = matrix[i][j]
            if i != j and lanes:
                a = alpha[i][j] if isinstance(alpha, list) else (alpha if alpha is not None else 0.0)
                b = betas[i][j] if isinstance(betas, list) else betas
                if not b or b <= 0:
                    raise InputError(source, f"betas[{i}][{j}]", "must be a positive us/MB value")
                out_links.append({"src": i, "dst": j, "alpha_us": float(a), "bw_GBps": 1e3 / float(b),
                                  "lanes": int(lanes)})
    gpn = raw.get("gpus_per_node", n)
    return {"format": FORMAT, "name": raw.get("name", Path(source).stem), "ranks": n, "gpus_per_node": gpn,
            "links": out_links}


# ----------------------------------------------------------------------------------------------- built-ins

def builtin_dir():
    return resources.files("synth.topologies")


def builtin_names() -> list[str]:
    """Names of the shipped topology files plus the parametric families."""
    names = sorted(p.name[:-5] for p in builtin_dir().iterdir() if p.name.endswith(".json"))
    return names


_FAMILY = re.compile(r"^(ring|fully-connected)-(\d+)$")


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


def load_topology(name_or_path: str, nodes: int = 1) -> Topology:
    """Load a built-in topology by name or a JSON file by path, optionally composed to ``nodes`` nodes.

    >>> load_topology("ring-4").num_ranks
    4
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        topo = load_topology_file(path)
    else:
        candidate = builtin_dir() / f"{name_or_path}.json"
        if candidate.is_file():
            topo = topology_from_dict(json.loads(candidate.read_text()), f"topologies/{name_or_path}.json")
        else:
            m = _FAMILY.match(name_or_path)
            if m and 2 <= int(m.group(2)) <= 1024:
                topo = topology_from_dict(_family_dict(m.group(1), int(m.group(2))), name_or_path)
            else:
                known = ", ".join(builtin_names() + ["ring-N", "fully-connected-N"])
                raise InputError("--topology", "", f"unknown topology {name_or_path!r}; use a JSON file path "
                                 f"or one of: {known}")
    if nodes != 1:
        topo = compose_nodes(topo, nodes)
    return topo


def compose_nodes(topo: Topology, nodes: int) -> Topology:
    """``nodes`` copies of a single-node topology joined through their NICs by one network switch."""
    if nodes < 1:
        raise InputError("--nodes", "", "must be at least 1")
    if nodes == 1:
        return topo
    if topo.num_nodes != 1:
        raise InputError(topo.source, "nodes", "--nodes composes single-node topologies; this one already has "
                         f"{topo.num_nodes} nodes")
    if not topo.nics:
        raise InputError(topo.source, "nics", "has no NICs, so nodes cannot be joined; add a nics entry")
    n = topo.num_ranks
    raw = topo.to_dict()
    links, switches, ports = [], [], []
    for k in range(nodes):
        off = k * n
        links += [dict(l, src=l["src"] + off, dst=l["dst"] + off) for l in raw["links"]]
        for s in raw["switches"]:
            switches.append(dict(s, name=f"{s['name']}@node{k}",
                                 ports=[dict(p, ranks=[r + off for r in p["ranks"]]) for p in s["ports"]]))
        for nic in topo.nics:
            ports.append({"ranks": [r + off for r in nic.ranks], "egress_GBps": nic.bw_GBps,
                          "ingress_GBps": nic.bw_GBps})
    alpha = max(nic.alpha_us for nic in topo.nics)
    switches.append({"name": "network", "alpha_us": alpha, "ports": ports})
    sym = [[(r + k * n) % (n * nodes) for r in range(n * nodes)] for k in range(1, nodes)]
    out = {"format": FORMAT, "name": f"{topo.name}x{nodes}", "ranks": n * nodes, "gpus_per_node": n,
           "description": f"{nodes} x {topo.name} joined by a network switch through their NICs",
           "links": links, "switches": switches, "nics": raw["nics"], "symmetries": sym}
    return topology_from_dict(out, f"{topo.source} (--nodes {nodes})")


def check_connected(topo: Topology) -> None:
    """Raise InputError unless every rank can reach every other rank."""
    g = topo.graph()
    if topo.num_ranks > 1 and not nx.is_strongly_connected(g):
        comps = sorted((sorted(c) for c in nx.strongly_connected_components(g)), key=len)
        raise InputError(topo.source, "links", f"the topology is disconnected: ranks {comps[0]} cannot reach "
                         "or be reached from the others; add links")



def reverse_topology(topo: Topology) -> Topology:
    """The same machine with every link (and switch port direction) reversed.

    Reductions are solved as the time reversal of a broadcast-type schedule on this graph, so they run on the
    original links.
    """
    links = tuple(sorted((Link(l.dst, l.src, l.alpha_us, l.bw_GBps, l.lanes, l.switch, l.ingress_port, l.egress_port)
                          for l in topo.links), key=lambda l: (l.src, l.dst)))
    switches = tuple(Switch(s.name, s.alpha_us, tuple(SwitchPort(p.ranks, p.ingress_GBps, p.egress_GBps)
                                                      for p in s.ports)) for s in topo.switches)
    return Topology(f"{topo.name}-reversed", topo.num_ranks, topo.gpus_per_node, links, switches, topo.nics,
                    topo.symmetries, topo.description, topo.source)
