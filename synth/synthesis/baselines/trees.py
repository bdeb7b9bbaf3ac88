"""Double binary tree baselines (NCCL's tree algorithm): two complementary trees over nodes, with
intra-node chains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from synth.errors import SynthError
from synth.model.topology import Topology
from synth.synthesis.baselines.plans import Edge, Routes, not_applicable
from synth.synthesis.baselines.rings import find_ring, node_cycles


@dataclass(frozen=True)
class Tree:
    """A rooted tree as parent -> child edges in breadth-first order."""

    root: int
    edges: tuple[Edge, ...]

    def interior(self) -> set[int]:
        return {u for u, _ in self.edges}


class TreeRoutes(Routes):
    """Two trees, chunk ``index`` uses tree ``index % 2`` (NCCL's double binary tree)."""

    ways = 2

    def __init__(self, trees: list[Tree]):
        self.trees = trees

    def _tree(self, root, index) -> Tree:
        tree = self.trees[index % 2]
        if tree.root != root:
            raise SynthError(f"internal error: tree rooted at {tree.root}, not {root}")
        return tree

    def spread(self, origin, index):
        return list(self._tree(origin, index).edges)

    def collect(self, root, index):
        return [(v, u) for u, v in reversed(self._tree(root, index).edges)]

    def hub(self, owner, index):
        return self.trees[index % 2].root

    def describe(self):
        return {"trees": [{"root": t.root, "edges": [list(e) for e in t.edges]} for t in self.trees]}


def _midpoint_tree(units: list[list[int]]) -> tuple[int, list[Edge]]:
    """Binary tree over a sequence of chains: the middle chain's head is the root, each half recurses; a
    chain hangs below its head. Returns the root rank and the edges (parent, child)."""
    edges: list[Edge] = []

    def build(lo, hi):
        if lo > hi:
            return None
        mid = (lo + hi) // 2
        chain = units[mid]
        edges.extend(zip(chain, chain[1:]))
        for child in (build(lo, mid - 1), build(mid + 1, hi)):
            if child is not None:
                edges.append((chain[0], child))
        return chain[0]

    root = build(0, len(units) - 1)
    return root, edges


def _bfs(root: int, edges: list[Edge]) -> Tree:
    children: dict[int, list[int]] = {}
    for u, v in edges:
        children.setdefault(u, []).append(v)
    order, frontier = [], [root]
    while frontier:
        nxt = []
        for u in frontier:
            for v in children.get(u, []):
                order.append((u, v))
                nxt.append(v)
        frontier = nxt
    return Tree(root, tuple(order))


def _unit_orders(topology: Topology) -> list[list[list[int]]]:
    """Candidate sequences of chains: the ring order (single node, each rank a chain) or the nodes with their
    intra-node ring (multi-node), every rotation, forwards and backwards, with every chain rotation."""
    if topology.num_nodes == 1:
        ring = find_ring(topology) or list(range(topology.num_ranks))
        bases = [[[r] for r in ring]]
        rotations = [0]
    else:
        cycles = node_cycles(topology, "double-binary-tree")
        bases = [cycles]
        rotations = range(topology.gpus_per_node)
    out = []
    for base in bases:
        for seq in (base, base[::-1]):
            for shift in range(len(seq)):
                for c in rotations:
                    out.append([chain[c:] + chain[:c] for chain in seq[shift:] + seq[:shift]])
    return out


def _tree_candidates(topology: Topology, root: int | None):
    for units in _unit_orders(topology):
        if root is None:
            top, edges = _midpoint_tree(units)
            yield _bfs(top, edges)
            continue
        k = next(i for i, u in enumerate(units) if root in u)
        chain = units[k]
        p = chain.index(root)
        if topology.num_nodes > 1:
            chain = chain[p:] + chain[:p]
        elif p:
            continue
        others = units[k + 1:] + units[:k]
        edges = list(zip(chain, chain[1:]))
        if others:
            sub, sub_edges = _midpoint_tree(others)
            edges += sub_edges + [(root, sub)]
        yield _bfs(root, edges)


def _greedy_tree(topology: Topology, root: int, usable: Callable[[int, int], bool],
                 avoid: set[int]) -> Tree | None:
    """Breadth-first binary tree from ``root``: each rank adopts up to two unreached ranks over usable links,
    ranks outside ``avoid`` adopting first, faster links first. None if some rank stays unreached."""
    reached, frontier, edges = {root}, [root], []
    caps = {(l.src, l.dst): l.capacity_GBps for l in topology.links}

    def speed(u: int, v: int) -> float:
        """The slower way between u and v that exists (a Reduce tree uses v -> u only; a rail may be one-way)."""
        return min(c for c in (caps.get((u, v)), caps.get((v, u))) if c is not None)

    while frontier:
        nxt = []
        for u in sorted(frontier, key=lambda r: (r in avoid, r)):
            options = sorted((v for v in range(topology.num_ranks) if v not in reached and usable(u, v)),
                             key=lambda v, u=u: (-speed(u, v), v))
            for v in options[:2]:
                reached.add(v)
                edges.append((u, v))
                nxt.append(v)
        frontier = nxt
    return _bfs(root, edges) if len(reached) == topology.num_ranks else None


def _greedy_pair(topology: Topology, root: int | None, usable) -> list[Tree] | None:
    """Two greedy trees; the second prefers the first one's leaves as its inner ranks."""
    roots = [root] if root is not None else list(range(topology.num_ranks))
    first = next((t for t in (_greedy_tree(topology, r, usable, set()) for r in roots) if t), None)
    if first is None:
        return None
    inner = first.interior() - {first.root}
    seconds = [t for t in (_greedy_tree(topology, r, usable, inner) for r in roots) if t]
    second = min(seconds, key=lambda t: len(t.interior() & inner))
    return [first, second]


def double_tree_routes(topology: Topology, collective: str, root) -> Routes:
    need_down = collective in ("broadcast", "allreduce")
    need_up = collective in ("reduce", "allreduce")
    root = (0 if root is None else root) if collective in ("broadcast", "reduce") else None

    def usable(u, v):
        return (not need_down or topology.link(u, v) is not None) and \
            (not need_up or topology.link(v, u) is not None)

    valid = []
    for tree in _tree_candidates(topology, root):
        if tree not in valid and all(usable(u, v) for u, v in tree.edges):
            valid.append(tree)
    if valid:
        first = valid[0]
        second = max(valid, key=lambda t: (len(first.interior() - t.interior()), -valid.index(t)))
        return TreeRoutes([first, second])
    pair = _greedy_pair(topology, root, usable)
    if pair is None:
        direction = "both ways" if need_up and need_down else ("to the root" if need_up else "from the root")
        raise not_applicable("double-binary-tree", f"no binary tree spans topology {topology.name} over links "
                              f"{direction}")
    return TreeRoutes(pair)
