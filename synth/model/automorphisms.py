"""Symmetry of any topology (imported, user-written or built-in): automorphisms of its link graph.

The declared ``symmetries`` of a topology file are a person's claim; imported NCCL dumps and user files usually
declare none, and the solvers then see no symmetry at all (an imported DGX-H100 had order 1 against the
built-in's 8, and solved 20x slower). :func:`rank_automorphisms` finds the rank permutations that preserve the
whole machine, as a few generators of the group, with a bounded search.

The graph searched has a vertex per rank and one per *structural* element, so that an automorphism must
respect it: a vertex per node (ranks stay in node-sized blocks), per switch and per switch port (a port's
egress/ingress bandwidth and its switch's latency are its colour; the ranks on a port are its neighbours), and
per NIC of every node (bandwidth and latency). Direct links are directed edges labelled with lanes, bandwidth,
latency and path type; links through a switch are not listed, since the switch's ports imply them.

The search is the stabiliser-chain idea of nauty/BLISS, in pure Python: for rank ``b = n-1, ..., 0``, with
ranks ``0..b-1`` fixed, every rank ``v`` that colour refinement (1-WL on the labelled digraph) cannot tell
apart from ``b`` and that the generators found so far do not already reach is tried: an
individualisation-refinement search looks for one automorphism fixing ``0..b-1`` and mapping ``b`` to ``v``,
and each one found is a generator (a strong generating set, so a few generators: 7 for the 8! of an
NVSwitch). The group order is the product of the orbit sizes. The search is exact, and bounded by a number of
refinements and a time limit (a hard graph can make it exponential); when it stops early the answer says so
and keeps what was found: still automorphisms, maybe not all of them.

DESIGN section 6 suggests igraph's BLISS for large fabrics; this module needs no new dependency and handles
the machines we ship and import (one to a few nodes) in well under a second; larger fabrics may hit the
limit, and the note says to declare their symmetries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

DEFAULT_MAX_REFINEMENTS = 20_000
DEFAULT_TIME_LIMIT_S = 5.0


@dataclass(frozen=True)
class RankAutomorphisms:
    """Generators of a group of rank permutations preserving the topology.

    ``generators[k][r]`` is the image of rank ``r``. ``order`` is the size of the group they generate when
    ``complete``; otherwise the search stopped early (``note`` says why and what to do) and the group found is
    a subgroup of the full one, of at least ``order`` elements.
    """

    generators: tuple[tuple[int, ...], ...]
    order: int
    complete: bool
    note: str


class _Budget(Exception):
    pass


@dataclass(frozen=True)
class _Graph:
    """The structure graph as integer arrays: base colours and labelled adjacency (label ids)."""

    colours: tuple[int, ...]
    out_adj: tuple[tuple[tuple[int, int], ...], ...]
    in_adj: tuple[tuple[tuple[int, int], ...], ...]
    edges: frozenset          # (u, w, label)


def _structure_graph(topo) -> _Graph:
    """The coloured digraph of the module docstring; vertices 0..n-1 are the ranks."""
    n, gpn = topo.num_ranks, topo.gpus_per_node
    colour: list = [("rank",)] * n
    edges: list[tuple[int, int, tuple]] = []

    def add(c) -> int:
        colour.append(c)
        return len(colour) - 1

    for k in range(topo.num_nodes):
        node_v = add(("node",))
        edges += [(r, node_v, ("in-node",)) for r in range(k * gpn, (k + 1) * gpn)]
        for nic in topo.nics:
            nic_v = add(("nic", nic.bw_GBps, nic.alpha_us))
            edges += [(k * gpn + local, nic_v, ("uses-nic",)) for local in nic.ranks]
    for sw in topo.switches:
        sw_v = add(("switch", sw.alpha_us))
        for port in sw.ports:
            port_v = add(("port", port.egress_GBps, port.ingress_GBps))
            edges.append((port_v, sw_v, ("port-of",)))
            edges += [(r, port_v, ("on-port",)) for r in port.ranks]
    for link in topo.links:
        if link.switch is None:
            edges.append((link.src, link.dst, ("link", link.lanes, link.bw_GBps, link.alpha_us,
                                               link.path_type)))
    colour_id = {c: i for i, c in enumerate(sorted(set(colour), key=repr))}
    label_id = {lab: i for i, lab in enumerate(sorted({lab for _, _, lab in edges}, key=repr))}
    out_adj: list[list] = [[] for _ in colour]
    in_adj: list[list] = [[] for _ in colour]
    for u, w, lab in edges:
        out_adj[u].append((label_id[lab], w))
        in_adj[w].append((label_id[lab], u))
    return _Graph(tuple(colour_id[c] for c in colour), tuple(map(tuple, out_adj)), tuple(map(tuple, in_adj)),
                  frozenset((u, w, label_id[lab]) for u, w, lab in edges))


class _Search:
    """Individualisation-refinement search for automorphisms, with a budget of refinements."""

    def __init__(self, graph: _Graph, max_refinements: int, deadline: float):
        self.g = graph
        self.max_refinements = max_refinements
        self.deadline = deadline
        self.refinements = 0
        self.fixed_base = max(graph.colours) + 1

    def refine(self, individualised: list[int], start: list[int] | None = None) -> list[int]:
        """Colour refinement (1-WL on the labelled digraph) of ``start`` (default: the base colours) with
        ``individualised`` vertices given new colours of their own, in order. Names are canonical, so two runs
        from equally named colourings compare."""
        self.refinements += 1
        if self.refinements > self.max_refinements or (self.refinements % 64 == 0
                                                       and time.monotonic() > self.deadline):
            raise _Budget
        current = list(self.g.colours if start is None else start)
        base = self.fixed_base if start is None else max(start) + 1
        for k, v in enumerate(individualised):
            current[v] = base + k
        classes = len(set(current))
        out_adj, in_adj = self.g.out_adj, self.g.in_adj
        while True:
            signature = [(current[v], tuple(sorted((lab, current[w]) for lab, w in out_adj[v])),
                          tuple(sorted((lab, current[u]) for lab, u in in_adj[v]))) for v in range(len(current))]
            names = {sig: i for i, sig in enumerate(sorted(set(signature)))}
            current = [names[sig] for sig in signature]
            if len(names) == classes:
                return current
            classes = len(names)

    def find(self, pairs: list[tuple[int, int]], c1: list[int] | None = None,
             c2: list[int] | None = None) -> dict[int, int] | None:
        """An automorphism mapping every ``x`` to ``y`` of ``pairs``, or None when there is none. ``c1``/``c2``
        are the refined colourings of all but the last pair, when the caller has them."""
        if c1 is None:
            c1 = self.refine([x for x, _ in pairs])
            c2 = self.refine([y for _, y in pairs])
        else:
            c1 = self.refine([pairs[-1][0]], c1)
            c2 = self.refine([pairs[-1][1]], c2)
        if sorted(c1) != sorted(c2):
            return None
        cells1: dict[int, list[int]] = {}
        cells2: dict[int, list[int]] = {}
        for v, c in enumerate(c1):
            cells1.setdefault(c, []).append(v)
        for v, c in enumerate(c2):
            cells2.setdefault(c, []).append(v)
        open_cells = [c for c, cell in cells1.items() if len(cell) > 1]
        if not open_cells:
            mapping = {v: cells2[c][0] for v, c in enumerate(c1)}
            ok = all((mapping[u], mapping[w], lab) in self.g.edges for u, w, lab in self.g.edges)
            return mapping if ok else None
        c = min(open_cells, key=lambda c: (len(cells1[c]), c))
        x = cells1[c][0]
        for y in sorted(cells2[c], key=lambda y: y != x):   # fixing x first finds the simplest mapping
            found = self.find(pairs + [(x, y)], c1, c2)
            if found is not None:
                return found
        return None


def rank_automorphisms(topo, max_refinements: int = DEFAULT_MAX_REFINEMENTS,
                       time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> RankAutomorphisms:
    """Generators of the rank permutations that preserve ``topo`` (links, switches and their ports, NICs,
    nodes), found by a bounded search (module docstring).

    >>> from synth.model.topology import load_topology
    >>> result = rank_automorphisms(load_topology("ring-4"))
    >>> result.order, result.complete
    (8, True)
    """
    n = topo.num_ranks
    search = _Search(_structure_graph(topo), max_refinements, time.monotonic() + time_limit_s)
    identity = tuple(range(n))
    generators: list[tuple[int, ...]] = []
    order = 1
    stopped = None
    try:
        # Deepest level first: generators found for the stabiliser of ranks 0..b'-1 (b' > b) also fix 0..b-1,
        # so together with level b's they generate b's orbit (a strong generating set, as in Schreier-Sims).
        for b in reversed(range(n)):
            fixed = [(r, r) for r in range(b)]
            left = search.refine(list(range(b)))
            orbit = {b}
            for v in range(n):
                if v in orbit or left[v] != left[b]:
                    continue
                mapping = search.find(fixed + [(b, v)])
                if mapping is None:
                    continue
                perm = tuple(mapping[r] for r in range(n))
                if perm != identity:
                    generators.append(perm)
                todo = list(orbit)
                while todo:
                    x = todo.pop()
                    for p in generators:
                        if p[x] not in orbit:
                            orbit.add(p[x])
                            todo.append(p[x])
            order *= len(orbit)
    except _Budget:
        stopped = (f"symmetry search stopped after {search.refinements} refinements (limit {max_refinements}, "
                   f"{time_limit_s:g} s)")
    if stopped:
        note = (f"{stopped}; the {len(generators)} generator(s) found are automorphisms but may not generate "
                "every symmetry: declare the rest as symmetries in the topology file")
        return RankAutomorphisms(tuple(generators), order, False, note)
    return RankAutomorphisms(tuple(generators), order, True,
                             f"{len(generators)} generator(s), group order {order}")
