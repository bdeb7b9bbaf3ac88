"""Clusters of identical nodes joined through their NICs (``--nodes K --fabric switch|rail``, DESIGN section 9).

Two fabrics (:class:`synth.model.topology.Fabric`):

- ``switch``: one network switch with a port per NIC of every node; any two ranks on different ports are one
  logical link apart, and a transfer charges the sender's NIC port (egress) and the receiver's (ingress).
- ``rail`` (rail-optimized, DGX SuperPOD-style): NIC k of every node sits on leaf switch ``rail{k}``; the leaves
  hang from one ``spine`` whose port above leaf k carries ``nodes x NIC bandwidth / oversubscription`` each way.
  Ranks on one rail meet in their leaf (two NIC ports, as on the single switch); a transfer between rails charges
  the sender's NIC port, its leaf's uplink, the receiver's leaf's downlink and the receiver's NIC port, and pays
  :data:`SPINE_ALPHA_US` on top of the leaf's latency. A machine with one NIC has one rail: the two fabrics agree.

The links are made on demand (:class:`ComposedLinks`): 128 nodes of 8 GPUs have a million ordered rank pairs, and
holding each as a Python object cost 100 s and half a gigabyte before anything used them. The symmetries are known
by construction (node rotation and the node's NIC-preserving group, both of which keep rails on rails), so they
are not searched for or re-verified link by link.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Iterator

import numpy as np

from synth.model.topology import Fabric, Link, LinkArrays, PortUse, Switch, SwitchPort, Topology, switch_path

# Latency a leaf-spine-leaf path adds to a leaf's: two more switch traversals (an InfiniBand NDR switch takes
# about 0.2 us) and the longer cables.
SPINE_ALPHA_US = 0.5
_ITER_BLOCK = 1 << 15
MEMO_LIMIT = 1 << 18       # (src, dst) lookups remembered per topology (about 40 MB at most)


def compose(node: Topology, nodes: int, fabric: Fabric, oversubscription: float) -> Topology:
    """``nodes`` copies of ``node`` joined by ``fabric``; checked by :func:`synth.model.topology.compose_nodes`."""
    g = node.num_ranks
    rails = fabric == Fabric.RAIL and len(node.nics) > 1
    switches = []
    for k in range(nodes):
        off = k * g
        switches += [Switch(f"{s.name}@node{k}", s.alpha_us,
                            tuple(SwitchPort(tuple(r + off for r in p.ranks), p.egress_GBps, p.ingress_GBps,
                                             f"{p.switch}@node{k}" if p.switch else "") for p in s.ports))
                     for s in node.switches]
    alpha = max(nic.alpha_us for nic in node.nics)
    if rails:
        leaves = [Switch(f"rail{j}", alpha, tuple(SwitchPort(tuple(k * g + r for r in nic.ranks), nic.bw_GBps,
                                                             nic.bw_GBps) for k in range(nodes)))
                  for j, nic in enumerate(node.nics)]
        uplinks = tuple(SwitchPort(tuple(sorted(r for p in leaf.ports for r in p.ranks)),
                                   nodes * nic.bw_GBps / oversubscription, nodes * nic.bw_GBps / oversubscription,
                                   leaf.name) for leaf, nic in zip(leaves, node.nics))
        switches += leaves + [Switch("spine", SPINE_ALPHA_US, uplinks)]
        blocking = f"{oversubscription:g}:1 oversubscribed" if oversubscription > 1 else "non-blocking"
        name, how = f"{node.name}x{nodes}-rail", (f"rail-optimized: NIC k of every node on leaf switch rail<k>, "
                                                  f"the {len(leaves)} leaves joined by a {blocking} spine")
    else:
        switches.append(Switch("network", alpha, tuple(SwitchPort(tuple(k * g + r for r in nic.ranks), nic.bw_GBps,
                                                                   nic.bw_GBps)
                                                        for k in range(nodes) for nic in node.nics)))
        name, how = f"{node.name}x{nodes}", "joined by a network switch through their NICs"
        if fabric == Fabric.RAIL:
            how += " (one NIC per node: its rail fabric is that one switch)"
    n = g * nodes
    rotations = [np.roll(np.arange(n), -k * g) for k in range(1, nodes)]
    within = [(np.asarray(perm)[np.arange(n) % g] + np.arange(n) // g * g) for perm in _nic_preserving(node)]
    symmetries = tuple(tuple(p.tolist()) for p in rotations + within)
    return Topology(name=name, num_ranks=n, gpus_per_node=g, links=ComposedLinks(node, nodes, tuple(switches), rails),
                    switches=tuple(switches), nics=node.nics, symmetries=symmetries,
                    description=f"{nodes} x {node.name} {how}", sms_per_gpu=node.sms_per_gpu,
                    source=f"{node.source} (--nodes {nodes}{' --fabric rail' if fabric == Fabric.RAIL else ''})")


def _nic_preserving(topo: Topology) -> list[tuple[int, ...]]:
    """The node's declared symmetries that map every NIC's ranks onto a NIC's ranks with the same bandwidth and
    latency: applied in every node at once, they stay symmetries of the composed machine (and map rail k onto
    the rail of the NIC that NIC k goes to)."""
    nics = {(frozenset(nic.ranks), nic.bw_GBps, nic.alpha_us) for nic in topo.nics}
    return [perm for perm in topo.symmetries
            if {(frozenset(perm[r] for r in ranks), bw, alpha) for ranks, bw, alpha in nics} == nics]


class ComposedLinks(Sequence):
    """The links of ``nodes`` copies of ``node`` joined by the composed ``switches``, sorted by ``(src, dst)`` and
    made on demand.

    Only two arrays are held: every link's ``src * ranks + dst`` (sorted) and which of the node's links it copies
    (-1: a link through the fabric). ``link_index`` looks links up by binary search; recently made links are
    cached, so reading one link often costs one dictionary lookup.
    """

    def __init__(self, node: Topology, nodes: int, switches: tuple[Switch, ...], rails: bool):
        self.node, self.nodes, self.switches, self.rails = node, nodes, switches, rails
        g = node.num_ranks
        self.num_ranks = n = g * nodes
        self._nic_of = {r: j for j, nic in enumerate(node.nics) for r in nic.ranks}
        self._names = [{s.name: f"{s.name}@node{k}" for s in node.switches} for k in range(nodes)]
        self._fabric_tables({s.name: s for s in switches})

        local = {(l.src, l.dst): i for i, l in enumerate(node.links)}
        nic_ranks = sorted(self._nic_of)
        for a in nic_ranks:             # ranks of one node on different NICs meet through the fabric
            for b in nic_ranks:
                if self._nic_of[a] != self._nic_of[b]:
                    local.setdefault((a, b), -1)
        pairs = sorted(local)
        lsrc = np.array([a for a, _ in pairs], dtype=np.int64)
        ldst = np.array([b for _, b in pairs], dtype=np.int64)
        lkind = np.array([local[p] for p in pairs], dtype=np.int32)
        base = np.arange(nodes, dtype=np.int64)[:, None] * g
        keys = [((base + lsrc) * n + base + ldst).ravel()]
        kinds = [np.tile(lkind, nodes)]
        on_nic = (base + np.array(nic_ranks, dtype=np.int64)).ravel()        # (node, rank) flattened
        node_of = np.repeat(np.arange(nodes), len(nic_ranks))
        src, dst = np.meshgrid(on_nic, on_nic, indexing="ij")
        apart = node_of[:, None] != node_of[None, :]
        keys.append(src[apart] * n + dst[apart])
        kinds.append(np.full(int(apart.sum()), -1, dtype=np.int32))
        keys_all = np.concatenate(keys)
        order = np.argsort(keys_all, kind="stable")
        self._keys = keys_all[order]
        self._kinds = np.concatenate(kinds)[order]
        self.link_index = _LinkIndex(self)
        self._cached = functools.lru_cache(maxsize=1 << 16)(self._make)

    # --- Sequence
    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._cached(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"link {i} of {len(self)}")
        return self._cached(int(i))

    def __iter__(self) -> Iterator[Link]:
        for start in range(0, len(self), _ITER_BLOCK):
            keys = self._keys[start:start + _ITER_BLOCK].tolist()
            kinds = self._kinds[start:start + _ITER_BLOCK].tolist()
            for key, kind in zip(keys, kinds):
                yield self._build(key, kind)

    def __eq__(self, other) -> bool:
        return isinstance(other, ComposedLinks) and (self.node, self.nodes, self.switches) == \
            (other.node, other.nodes, other.switches)

    def __hash__(self) -> int:
        return hash((self.node, self.nodes, self.switches))

    def __reduce__(self):
        return ComposedLinks, (self.node, self.nodes, self.switches, self.rails)

    def __repr__(self) -> str:
        return f"ComposedLinks({self.node.name} x {self.nodes}, {len(self)} links)"

    def reversed(self, switches: tuple[Switch, ...]) -> ComposedLinks:
        """The links of :func:`synth.model.topology.reverse_topology` (``switches`` reversed): the node's links
        reversed, and the fabric's, since a path through it reversed is the path the other way."""
        from synth.model.topology import reverse_topology

        return ComposedLinks(reverse_topology(self.node), self.nodes, switches, self.rails)

    # --- the rest of the Topology API
    def direct_links(self) -> Iterator[Link]:
        """The node's direct links, node by node (in link order)."""
        g = self.node.num_ranks
        for k in range(self.nodes):
            for l in self.node.links:
                if not l.ports:
                    yield Link(l.src + k * g, l.dst + k * g, l.alpha_us, l.bw_GBps, l.lanes, (), l.path_type)

    def endpoints(self) -> tuple[np.ndarray, np.ndarray]:
        return self._keys // self.num_ranks, self._keys % self.num_ranks

    def arrays(self) -> LinkArrays:
        """Ends, latency and capacity of every link, computed on whole arrays (no Link is made)."""
        src, dst = self.endpoints()
        g = self.node.num_ranks
        template = self.node.link_arrays()
        nic_of = np.full(g, -1, dtype=np.int64)
        for r, k in self._nic_of.items():
            nic_of[r] = k
        table = np.array(self._alpha_bw, dtype=float).reshape(len(self.node.nics), len(self.node.nics), 2)
        copied = self._kinds >= 0
        kind = np.where(copied, self._kinds, 0)
        ka, kb = nic_of[src % g], nic_of[dst % g]
        alpha = np.where(copied, template.alpha_us[kind] if len(template.src) else 0.0, table[ka, kb, 0])
        capacity = np.where(copied, template.capacity_GBps[kind] if len(template.src) else 0.0, table[ka, kb, 1])
        return LinkArrays(src, dst, alpha, capacity)

    def indices(self, src, dst) -> np.ndarray:
        """Positions of the links ``src -> dst`` (arrays of any shape), -1 where there is none."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        n = self.num_ranks
        key = src * n + dst
        pos = np.minimum(np.searchsorted(self._keys, key), len(self._keys) - 1)
        ok = (self._keys[pos] == key) & (src >= 0) & (src < n) & (dst >= 0) & (dst < n)
        return np.where(ok, pos, -1)

    def find(self, src: int, dst: int) -> int:
        """Position of the link ``src -> dst``, -1 when there is none."""
        n = self.num_ranks
        if not (0 <= src < n and 0 <= dst < n):
            return -1
        key = src * n + dst
        pos = int(np.searchsorted(self._keys, key))
        return pos if pos < len(self._keys) and int(self._keys[pos]) == key else -1

    # --- making links
    def _make(self, i: int) -> Link:
        return self._build(int(self._keys[i]), int(self._kinds[i]))

    def _build(self, key: int, kind: int) -> Link:
        a, b = divmod(key, self.num_ranks)
        g = self.node.num_ranks
        if kind >= 0:
            t = self.node.links[kind]
            k = a // g
            names = self._names[k]
            return Link(a, b, t.alpha_us, t.bw_GBps, t.lanes,
                        tuple(PortUse(names[u.switch], u.port, u.direction) for u in t.ports), t.path_type)
        ka, kb = self._nic_of[a % g], self._nic_of[b % g]
        alpha, bw = self._alpha_bw[ka][kb]
        return Link(a, b, alpha, bw, 1, self._fabric_ports(ka, kb, a // g, b // g))

    def _hops(self, by_name: dict[str, Switch], ka: int, kb: int, na: int, nb: int):
        """The switch path (for :func:`switch_path`) from NIC ``ka`` of node ``na`` to NIC ``kb`` of node ``nb``."""
        if not self.rails:
            per_node = len(self.node.nics)
            net = by_name["network"]
            return ((net, na * per_node + ka),), ((net, nb * per_node + kb),)
        leaf_a, leaf_b = by_name[f"rail{ka}"], by_name[f"rail{kb}"]
        if ka == kb:
            return ((leaf_a, na),), ((leaf_b, nb),)
        spine = by_name["spine"]
        return ((leaf_a, na), (spine, ka)), ((spine, kb), (leaf_b, nb))

    def _fabric_tables(self, by_name: dict[str, Switch]) -> None:
        """Latency and bandwidth of the fabric path between every two NICs (the same between any two nodes: all
        nodes' ports are alike), and the ports of every NIC, so a link through the fabric is a few lookups."""
        nics = range(len(self.node.nics))
        other = 1 if self.nodes > 1 else 0
        self._alpha_bw = [[switch_path(*self._hops(by_name, ka, kb, 0, other))[:2] for kb in nics] for ka in nics]
        self._paths = {(ka, kb, na, nb): switch_path(*self._hops(by_name, ka, kb, na, nb))[2]
                       for ka in nics for kb in nics for na, nb in ((0, other), (other, 0))}

    def _fabric_ports(self, ka: int, kb: int, na: int, nb: int) -> tuple[PortUse, ...]:
        """The ports of the fabric path, from the tables: node 0's path to node 1 with the node numbers put in."""
        return self._paths.get((ka, kb, na, nb)) or self._relocated(ka, kb, na, nb)

    def _relocated(self, ka: int, kb: int, na: int, nb: int) -> tuple[PortUse, ...]:
        template = self._paths[(ka, kb, 0, 1)]
        step = 1 if self.rails else len(self.node.nics)       # a node's NIC ports are this far apart
        first, last = template[0], template[-1]
        return (PortUse(first.switch, first.port + na * step, first.direction),) + template[1:-1] + \
            (PortUse(last.switch, last.port + (nb - 1) * step, last.direction),)


class _LinkIndex(Mapping):
    """``(src, dst) -> link position`` of a :class:`ComposedLinks`, by binary search."""

    def __init__(self, links: ComposedLinks):
        self._links = links
        self._found: dict = {}     # pairs looked up so far: schedulers ask for the same few links millions of times

    def __getitem__(self, pair) -> int:
        try:
            pos = self._found.get(pair)
        except TypeError:            # an unhashable pair (a list): looked up, not remembered
            pos = None
        if pos is not None:
            return pos
        try:
            src, dst = pair
            pos = self._links.find(int(src), int(dst))
        except (TypeError, ValueError):
            raise KeyError(pair) from None
        if pos < 0:
            raise KeyError(pair)
        if len(self._found) < MEMO_LIMIT and isinstance(pair, tuple):
            self._found[pair] = pos
        return pos

    def __contains__(self, pair) -> bool:
        try:
            src, dst = pair
            return self._links.find(int(src), int(dst)) >= 0
        except (TypeError, ValueError):
            return False

    def __iter__(self):
        src, dst = self._links.endpoints()
        return zip(src.tolist(), dst.tolist())

    def __len__(self) -> int:
        return len(self._links)

    def __reduce__(self):
        return _LinkIndex, (self._links,)
