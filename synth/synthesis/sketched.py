"""Whether a schedule keeps to a sketch: under ``--sketch`` every plan ``synth solve`` weighs must.

A sketch says which links a schedule may use (the intra-node links, the inter-node connections) and, for the
collectives that only copy, which GPUs may carry whose chunks across nodes (relays). The alpha-beta formulations
are built inside those rules. The other sources (tree packing, the compositions, the reversal of a baseline, the
sharded exchange) are built without them, and compete where their schedule happens to keep to them: a rail
sketch (GPU i talks to GPU i of the other nodes) admits the rail compositions, whose Broadcast at 1 GB on 2 x
dgx-a100 simulates at 99% of the limit where the sketch-guided search reached 24%.

The switch strategy (``uc-min``/``uc-max``), symmetry, chunk count and hints steer a search; they are not rules a
schedule can break. Reductions are held to the links only: relays name the chunks a *sender* carries, which the
reversed problem the formulations solve for them drops as well (:func:`synth.model.sketch.reverse_sketch`).
"""

from __future__ import annotations

import numpy as np

from synth.model.sketch import Sketch, relay_mask
from synth.model.topology import Topology
from synth.schedule.ir import Schedule


def sketch_violation(sketch: Sketch, topology: Topology, schedule: Schedule) -> str | None:
    """The first transfer of ``schedule`` that breaks ``sketch``, in words; None when every one keeps to it.

    >>> from synth.model.topology import load_topology
    >>> from synth.model.sketch import load_sketch
    >>> from synth.model.collectives import make_collective
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> topo = load_topology("ndv2", 2)             # only GPU 1 of a node sends to another node, to its GPU 0
    >>> sketch = load_sketch("ndv2-nic-relay", topo)
    >>> bcast = make_collective("broadcast", 16, 1, 0)
    >>> def one(src, dst):
    ...     return Schedule(bcast, topo.name, (Transfer(0, src, dst, 0),), 1, None, None, "test")
    >>> sketch_violation(sketch, topo, one(1, 8)) is None
    True
    >>> sketch_violation(sketch, topo, one(0, 8))
    'it sends 0 -> 8, a link the sketch ndv2-nic-relay does not allow'
    >>> dgx2 = load_topology("dgx2-2node-tecc")     # GPU 2k+1 carries the chunks of GPUs 2k and 2k+1 across
    >>> gather = make_collective("allgather", 32, 1)
    >>> relayed = Schedule(gather, dgx2.name, (Transfer(1, 3, 18, 0),), 1, None, None, "test")
    >>> sketch_violation(load_sketch("dgx2-tecc-relay", dgx2), dgx2, relayed)
    "GPU 3 carries rank 1's data across nodes, which the sketch dgx2-tecc-relay's relays do not allow"
    """
    transfers = schedule.transfers
    if not transfers:
        return None
    src = np.fromiter((t.src for t in transfers), dtype=np.int64, count=len(transfers))
    dst = np.fromiter((t.dst for t in transfers), dtype=np.int64, count=len(transfers))
    link = topology.link_indices(src, dst)
    allowed = sketch.allowed_links(topology)
    off = np.flatnonzero((link < 0) | ~allowed[np.maximum(link, 0)])
    if off.size:
        t = transfers[int(off[0])]
        if link[off[0]] < 0:
            return f"it sends {t.src} -> {t.dst}, which no link of {topology.name} joins"
        return f"it sends {t.src} -> {t.dst}, a link the sketch {sketch.name} does not allow"
    if schedule.collective.combining:
        return None
    chunk = np.fromiter((t.chunk for t in transfers), dtype=np.int64, count=len(transfers))
    carried = relay_mask(sketch, topology, schedule.collective)[chunk, link]
    off = np.flatnonzero(~carried)
    if off.size:
        t = transfers[int(off[0])]
        origin = sorted(schedule.collective.chunks[t.chunk].sources)[0]
        return (f"GPU {t.src} carries rank {origin}'s data across nodes, which the sketch {sketch.name}'s relays "
                "do not allow")
    return None
