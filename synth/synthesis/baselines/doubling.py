"""Recursive doubling (Allgather, butterfly Allreduce) and recursive halving-doubling baselines."""

from __future__ import annotations

from synth.model.topology import Topology
from synth.schedule.ir import REDUCE, Transfer
from synth.synthesis.baselines.plans import Routes, not_applicable


class DoublingRoutes(Routes):
    """Recursive doubling between partners ``r ^ 2**k`` (rank ids); the in-tree is the out-tree reversed.

    With ``butterfly`` set, Allreduce is the full-vector exchange: in round k every rank adds its partner's
    whole buffer (log2 n steps, each moving everything).
    """

    def __init__(self, n: int, butterfly: bool):
        self.n = n
        self.rounds = n.bit_length() - 1
        self.butterfly = butterfly

    def spread(self, origin, index):
        holders, edges = [origin], []
        for k in range(self.rounds):
            new = [h ^ (1 << k) for h in holders]
            edges += list(zip(holders, new))
            holders += new
        return edges

    def collect(self, root, index):
        return [(v, u) for u, v in reversed(self.spread(root, index))]

    def explicit(self, collective):
        if self.explicit_count(collective.name, collective.num_ranks, collective.chunks_per_rank) is None:
            return None
        return [Transfer(c.id, r, r ^ (1 << k), k, REDUCE) for k in range(self.rounds)
                for r in range(self.n) for c in collective.chunks]

    def explicit_count(self, collective_name, num_ranks, chunks_per_rank, root=None):
        if not (self.butterfly and collective_name == "allreduce"):
            return None
        return self.rounds * self.n * num_ranks * chunks_per_rank      # every rank, every chunk, every round


def doubling_routes(name: str, butterfly: bool):
    def make(topology: Topology, collective: str, root) -> Routes:
        n = topology.num_ranks
        if n & (n - 1):
            raise not_applicable(name, f"needs a power-of-two rank count, topology {topology.name} has {n}")
        for r in range(n):
            for k in range(n.bit_length() - 1):
                if topology.link(r, r ^ (1 << k)) is None:
                    raise not_applicable(name, f"needs links between ranks that differ in one bit; topology "
                                          f"{topology.name} has no link {r}->{r ^ (1 << k)}")
        return DoublingRoutes(n, butterfly)
    return make
