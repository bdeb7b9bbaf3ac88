"""The all-pairs baseline: every chunk goes straight to each rank that needs it."""

from __future__ import annotations

from synth.model.topology import Topology
from synth.synthesis.baselines.plans import Routes, not_applicable


class AllPairsRoutes(Routes):
    """Every chunk goes straight from its source to each peer (needs a link between every pair)."""

    def __init__(self, n: int):
        self.n = n

    def spread(self, origin, index):
        return [(origin, (origin + i) % self.n) for i in range(1, self.n)]

    def collect(self, root, index):
        return [((root + i) % self.n, root) for i in range(1, self.n)]

    def path(self, src, dst, index):
        return [(src, dst)]

    def priority(self, src, dst, edges):
        return (dst - src) % self.n


def all_pairs_routes(topology: Topology, collective: str, root) -> Routes:
    n = topology.num_ranks
    for a in range(n):
        for b in range(n):
            if a != b and topology.link(a, b) is None:
                raise not_applicable("all-pairs", f"topology {topology.name} has no direct link {a}->{b}")
    return AllPairsRoutes(n)
