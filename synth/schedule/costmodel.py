"""The alpha-beta cost model (DESIGN section 4), shared by the replay check and the XML simulator.

A transfer of ``b`` bytes on a link occupies the link's bandwidth (all lanes) for ``b / capacity`` and arrives
``alpha + b / capacity`` after it starts. Transfers on one directed link serialise their bandwidth use; latency
overlaps. A transfer through a switch also occupies the sender's egress port and the receiver's ingress port
for the time it takes at that port's bandwidth. Links are full duplex. Times are microseconds; 1 GB/s moves
1e3 bytes per microsecond.

``alpha_occupies=True`` is TACCL's convention: the link is also busy during alpha.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from synth.model.topology import PortUse, Topology

BYTES_PER_US_PER_GBPS = 1e3


def algbw_GBps(size_bytes: float, time_us: float) -> float:
    """nccl-tests' algorithm bandwidth: the per-rank buffer (bytes) over the collective's time (us), in GB/s.

    >>> algbw_GBps(1 << 30, 1000.0)
    1073.741824
    """
    return size_bytes / (time_us * BYTES_PER_US_PER_GBPS) if time_us > 0 else float("inf")


class Reservation(NamedTuple):
    start_us: float
    busy_until_us: float
    arrival_us: float


class LinkClock:
    """Tracks when each link and switch port is next free; ``reserve`` books one transfer.

    What ``reserve`` needs of a link (alpha, bandwidth, its ports and theirs) is looked up once per link: links
    of composed machines are made on demand, and a replay books millions.
    """

    def __init__(self, topology: Topology, alpha_occupies: bool = False):
        self.topology = topology
        self.alpha_occupies = alpha_occupies
        self.link_free = [0.0] * len(topology.links)
        self.port_free: dict[PortUse, float] = {}
        self.port_bw = topology.port_capacity()
        self.busy_us = [0.0] * len(topology.links)
        self._costs: dict[int, tuple[float, float, tuple]] = {}

    def _cost(self, link_index: int) -> tuple[float, float, tuple]:
        """(alpha us, bytes per us, ((port, bytes per us), ...)) of a link."""
        cost = self._costs.get(link_index)
        if cost is None:
            link = self.topology.links[link_index]
            cost = (link.alpha_us, link.capacity_GBps * BYTES_PER_US_PER_GBPS,
                    tuple((p, self.port_bw[p] * BYTES_PER_US_PER_GBPS) for p in link.ports))
            self._costs[link_index] = cost
        return cost

    def duration_us(self, link_index: int, nbytes: float) -> float:
        """Time the link's bandwidth is used by ``nbytes``."""
        return nbytes / self._cost(link_index)[1]

    def reserve(self, link_index: int, ready_us: float, nbytes: float) -> Reservation:
        """Book ``nbytes`` on a link no earlier than ``ready_us``; returns start, busy-until and arrival."""
        alpha_us, bytes_per_us, ports = self._cost(link_index)
        port_free = self.port_free
        start = self.link_free[link_index]
        if ready_us > start:
            start = ready_us
        for p, _ in ports:
            free = port_free.get(p, 0.0)
            if free > start:
                start = free
        beta_us = nbytes / bytes_per_us
        busy = beta_us + alpha_us if self.alpha_occupies else beta_us
        self.link_free[link_index] = start + busy
        self.busy_us[link_index] += busy
        for p, port_bytes_per_us in ports:
            held = nbytes / port_bytes_per_us
            # a port as fast as the link is held while the link is busy (alpha too, in TACCL's convention); a
            # faster one (a spine uplink carrying several NICs) for its share of bandwidth: links share it
            port_free[p] = start + (held if held > busy or held < beta_us else busy)
        return Reservation(start, start + busy, start + alpha_us + beta_us)


def load_bound_us(links: Iterable[tuple[int, int]], topology: Topology, nbytes: float,
                  most_merged: int = 1, latency: bool = True) -> float:
    """A lower bound on the makespan of any timing of these chunks by :class:`LinkClock` (latency overlapping):
    one chunk of ``nbytes`` per ``(src, dst)`` in ``links`` (one per transfer), moved in messages of at most
    ``most_merged`` chunks. A link serialises its messages' bandwidth use, so its last arrives at least its total
    busy time plus alpha after 0; a switch port serialises the time it is held (its bytes at its bandwidth), so
    its last message starts once every other has been through and arrives alpha plus its own link time later
    (where the port is slower than the link, that last message holds it for up to ``most_merged`` chunks' port
    time; where it is faster, a spine uplink shared by several NICs, one chunk's link time is still to come).
    ``latency=False`` leaves alpha out: the busy time of the busiest link or port alone.

    >>> from synth.model.topology import load_topology
    >>> load_bound_us([(0, 1), (0, 1), (1, 2)], load_topology("ring-4"), 25_000)   # 2 x 1 us + 0.7 us
    2.7
    >>> load_bound_us([(0, 1), (0, 1), (1, 2)], load_topology("ring-4"), 25_000, latency=False)
    2.0
    """
    per_link = Counter(topology.link_index[pair] for pair in links)
    port_bw = topology.port_capacity()
    port_total: Counter = Counter()
    port_last: dict = {}       # per port, the least a last message can add after the others: alpha - excess
    bound = 0.0
    for index, count in per_link.items():
        link = topology.links[index]
        beta_us = nbytes / (link.capacity_GBps * BYTES_PER_US_PER_GBPS)
        alpha_us = link.alpha_us if latency else 0.0
        bound = max(bound, count * beta_us + alpha_us)
        for port in link.ports:
            held_us = nbytes / (port_bw[port] * BYTES_PER_US_PER_GBPS)
            port_total[port] += count * held_us
            merged = min(count, most_merged) if held_us > beta_us else 1
            last = alpha_us - merged * (held_us - beta_us) if latency else 0.0
            port_last[port] = min(port_last.get(port, last), last)
    return max([bound] + [total + port_last[port] for port, total in port_total.items()])
