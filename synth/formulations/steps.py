"""The step formulation (SCCL-style steps S, rounds R, chunks C), DESIGN section 6.

Variables: a binary ``send[c, link, s]`` per chunk, link and step, and an integer ``rounds[s] >= 1`` per step
with ``sum(rounds) <= R``. A rank sends only what it holds at the start of the step; every rank that needs a
chunk receives it exactly once, relays at most once, sources never; a link carries at most
``lanes * rounds[s]`` chunks in step ``s`` and a switch port at most ``rounds[s]`` (times its bandwidth ratio).
Sends impossible by hop distance are never created. The cost is ``alpha * S + beta * (size / C) * R``.

Symmetry: with a group of rank permutations that preserve the topology and the collective and act freely, only
one representative chunk per orbit gets variables; the images are implied, and capacity rows (which are then
identical within a link orbit) are kept once per link orbit. A symmetric model can only show that no
*symmetric* schedule exists, so the caller proves infeasibility on the full model (``use_symmetry=False``).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from synth.model.collectives import Collective
from synth.errors import InfeasibleError, InputError
from synth.schedule.ir import COPY, Schedule, Transfer
from synth.solver.highs import Model, RowBuilder, SolveResult
from synth.model.symmetry import SymmetryGroup, symmetry_for_collective
from synth.model.topology import Topology


# An upper bound on send columns (before pruning) the step model may allocate; larger asks are refused up front.
MAX_SEND_COLUMNS = 20_000_000


@dataclass(frozen=True)
class StepsEncoding:
    """The model plus the index needed to decode it (one entry per send column)."""

    model: Model
    topology: Topology
    collective: Collective
    steps: int
    rounds: int
    send_chunk: np.ndarray     # representative chunk id per send column
    send_link: np.ndarray      # link index per send column
    send_step: np.ndarray      # step per send column
    round_col0: int            # first rounds column
    symmetry: SymmetryGroup    # rank permutations used (identity first) and their chunk maps


def min_steps(topology: Topology, collective: Collective) -> int:
    """Hop lower bound on steps: the farthest destination from its nearest source."""
    dist = topology.hop_distances()
    worst = 0
    for c in collective.chunks:
        for d in c.dest_ranks - c.sources:
            worst = max(worst, min(dist[s][d] for s in c.sources))
    return worst


def encode_steps(topology: Topology, collective: Collective, steps: int, rounds: int,
                 use_symmetry: bool = True) -> StepsEncoding:
    """Build the step MILP for a non-combining collective (combining ones are reversals; see synth.synthesis.steps)."""
    if collective.combining:
        raise ValueError("encode_steps takes non-combining collectives; reverse an Allgather/Broadcast instead")
    if steps < 1 or rounds < steps:
        raise InfeasibleError(f"(steps {steps}, rounds {rounds}): every step needs at least one round, so rounds "
                              "must be >= steps >= 1")
    need = min_steps(topology, collective)
    if need > steps:
        raise InfeasibleError(f"{collective.name} on {topology.name} needs at least {need} steps (hop distance); "
                              f"asked for {steps}")
    n = topology.num_ranks
    columns = len(collective.chunks) * len(topology.links) * steps
    if columns > MAX_SEND_COLUMNS:
        raise InputError("--steps", "", f"the step model would have about {columns:,} send variables (chunks x "
                         f"links x steps), more than the {MAX_SEND_COLUMNS:,} it can hold; ask for fewer steps or "
                         "chunks, or use --method routed")
    symmetry = symmetry_for_collective(topology, collective) if use_symmetry else \
        SymmetryGroup.trivial(n, len(collective.chunks))
    reps = symmetry.chunk_orbit_reps()
    dist = topology.hop_distances()
    links = topology.links

    # --- send columns, pruned by hop distance
    s_chunk, s_link, s_step = [], [], []
    for c in reps:
        chunk = collective.chunks[c]
        src = chunk.sources
        dests = chunk.dest_ranks
        reach = [min(dist[s][u] for s in src) for u in range(n)]
        for li, link in enumerate(links):
            if link.dst in src:
                continue
            for s in range(reach[link.src], steps):
                if link.dst not in dests and s == steps - 1:
                    continue  # a relay receiving in the last step cannot forward
                s_chunk.append(c)
                s_link.append(li)
                s_step.append(s)
    s_chunk = np.array(s_chunk, dtype=np.int64)
    s_link = np.array(s_link, dtype=np.int64)
    s_step = np.array(s_step, dtype=np.int64)
    nsend = len(s_chunk)
    round_col0 = nsend
    ncols = nsend + steps
    link_src = np.array([l.src for l in links], dtype=np.int64)
    link_dst = np.array([l.dst for l in links], dtype=np.int64)
    rb = RowBuilder()

    # --- receive exactly once (destinations), at most once (relays)
    recv_key = defaultdict(list)
    for col in range(nsend):
        recv_key[(int(s_chunk[col]), int(link_dst[s_link[col]]))].append(col)
    lo, hi, ent_r, ent_c = [], [], [], []
    for c in reps:
        chunk = collective.chunks[c]
        for v in range(n):
            if v in chunk.sources:
                continue
            cols = recv_key.get((c, v), [])
            if v in chunk.dest_ranks:
                if not cols:
                    raise InfeasibleError(f"rank {v} cannot receive chunk {c} within {steps} steps")
                lo.append(1.0)
                hi.append(1.0)
            elif not cols:
                continue
            else:
                lo.append(0.0)
                hi.append(1.0)
            r = len(lo) - 1
            ent_r += [r] * len(cols)
            ent_c += cols
    rb.add(ent_r, ent_c, 1.0, lo, hi)

    # --- availability: send(c, u->v, s) <= sum of receipts of c at u in steps < s
    incoming = defaultdict(list)   # (chunk, rank) -> [(step, col)]
    for col in range(nsend):
        incoming[(int(s_chunk[col]), int(link_dst[s_link[col]]))].append((int(s_step[col]), col))
    ent_r, ent_c, ent_v = [], [], []
    nrows = 0
    for col in range(nsend):
        c, u, s = int(s_chunk[col]), int(link_src[s_link[col]]), int(s_step[col])
        if u in collective.chunks[c].sources:
            continue
        ent_r.append(nrows)
        ent_c.append(col)
        ent_v.append(1.0)
        for s2, col2 in incoming.get((c, u), []):
            if s2 < s:
                ent_r.append(nrows)
                ent_c.append(col2)
                ent_v.append(-1.0)
        nrows += 1
    rb.add(ent_r, ent_c, ent_v, np.full(nrows, -np.inf), 0.0)

    # --- link and port capacity per step, one row per link orbit (all images counted)
    link_rep = symmetry.link_orbit_reps(topology)
    port_rep = symmetry.port_orbit_reps(topology)
    link_images = symmetry.link_images(topology)
    cap_row = {}
    ent_r, ent_c, ent_v, lo, hi = [], [], [], [], []

    def row_for(key, lanes):
        if key not in cap_row:
            cap_row[key] = len(lo)
            lo.append(-np.inf)
            hi.append(0.0)
            ent_r.append(cap_row[key])
            ent_c.append(round_col0 + key[-1])
            ent_v.append(-float(lanes))
        return cap_row[key]

    port_cap = _port_caps(topology)
    for col in range(nsend):
        li, s = int(s_link[col]), int(s_step[col])
        for image in link_images[:, li].tolist():
            rep = int(link_rep[image])
            if rep == image:
                ent_r.append(row_for(("link", rep, s), links[rep].lanes))
                ent_c.append(col)
                ent_v.append(1.0)
            for port in links[image].ports:
                if port_rep[port] == port:
                    ent_r.append(row_for(("port",) + port + (s,), port_cap[port[:2]]))
                    ent_c.append(col)
                    ent_v.append(1.0)
    rb.add(ent_r, ent_c, ent_v, lo, hi)

    # --- total rounds
    rb.add([0] * steps, [round_col0 + s for s in range(steps)], 1.0, [-np.inf], [float(rounds)])

    rows, cols, vals, row_lo, row_hi = rb.arrays()
    cost = np.zeros(ncols)  # pure feasibility: measured 2x faster than minimising sends; decode prunes waste
    col_lower = np.concatenate([np.zeros(nsend), np.ones(steps)])
    col_upper = np.concatenate([np.ones(nsend), np.full(steps, float(rounds))])
    names = tuple(f"send_c{c}_{links[l].src}to{links[l].dst}_s{s}" for c, l, s in zip(s_chunk, s_link, s_step)) \
        + tuple(f"rounds_s{s}" for s in range(steps))
    model = Model(cost, col_lower, col_upper, np.ones(ncols, dtype=bool), rows, cols, vals, row_lo, row_hi, names)
    return StepsEncoding(model, topology, collective, steps, rounds, s_chunk, s_link, s_step, round_col0, symmetry)


def _port_caps(topology: Topology) -> dict:
    """Chunks per round a switch port carries: its bandwidth over its links' (at least 1)."""
    link_bw: dict[tuple[str, int], float] = {}
    for l in topology.links:
        for use in l.ports:
            key = (use.switch, use.port)
            link_bw[key] = min(link_bw.get(key, l.bw_GBps), l.bw_GBps)
    caps = {}
    for sw in topology.switches:
        for pi, port in enumerate(sw.ports):
            bw = link_bw.get((sw.name, pi), 1.0)
            caps[(sw.name, pi)] = max(1, int(min(port.egress_GBps, port.ingress_GBps) / bw + 1e-9))
    return caps


def decode_steps(enc: StepsEncoding, result: SolveResult) -> Schedule:
    """Expand the representative sends to all images and order them by step."""
    x = result.x
    chosen = np.flatnonzero(x[: enc.round_col0] > 0.5)
    links = enc.topology.links
    transfers = set()
    elements = list(enc.symmetry.elements())
    for col in chosen:
        c, li, s = int(enc.send_chunk[col]), int(enc.send_link[col]), int(enc.send_step[col])
        for perm, cmap in elements:
            transfers.add(Transfer(cmap[c], perm[links[li].src], perm[links[li].dst], s, COPY))
    transfers = _prune_dead_relays(enc.collective, transfers)
    rounds_per_step = _rounds_needed(enc.topology, transfers, enc.steps)
    schedule = Schedule(enc.collective, enc.topology.name, tuple(sorted(transfers, key=lambda t: (t.step, t.chunk))),
                        enc.steps, int(sum(rounds_per_step)), tuple(rounds_per_step), "steps")
    return schedule


def _prune_dead_relays(collective: Collective, transfers: set) -> set:
    """Drop sends to ranks that neither need the chunk nor forward it (the feasibility model allows them)."""
    transfers = set(transfers)
    while True:
        forwards = {(t.src, t.chunk) for t in transfers}
        dead = {t for t in transfers if t.dst not in collective.chunks[t.chunk].dest_ranks
                and (t.dst, t.chunk) not in forwards}
        if not dead:
            return transfers
        transfers -= dead


def _rounds_needed(topology: Topology, transfers, steps: int) -> list[int]:
    """Fewest rounds per step that fit every link's and switch port's load."""
    load = defaultdict(int)
    port_load = defaultdict(int)
    for t in transfers:
        link = topology.link(t.src, t.dst)
        load[(t.src, t.dst, t.step)] += 1
        for port in link.ports:
            port_load[(port, t.step)] += 1
    rounds = [1] * steps
    for (src, dst, s), count in load.items():
        rounds[s] = max(rounds[s], -(-count // topology.link(src, dst).lanes))
    caps = _port_caps(topology)
    for ((sw, port, _), s), count in port_load.items():
        rounds[s] = max(rounds[s], -(-count // caps[(sw, port)]))
    return rounds


def balanced_round_splits(rounds: int, steps: int, limit: int = 3) -> list[tuple[int, ...]]:
    """The ``limit`` most even ways to split ``rounds`` over ``steps`` (each >= 1), most even first.

    With the rounds of every step fixed the model is pure binary and HiGHS finds feasible ones in about 10 ms
    on DGX-1 (3,7,6), against ~0.7 s with integer rounds; the hard part is proving uneven splits infeasible,
    which the integer model does in one go.
    """
    if steps > 12 or rounds < steps:
        return []
    splits = []
    for cut in itertools.combinations(range(1, rounds), steps - 1):
        parts = tuple(b - a for a, b in zip((0,) + cut, cut + (rounds,)))
        splits.append((max(parts) - min(parts), parts))
        if len(splits) > 20000:
            break
    return [parts for _, parts in sorted(splits)[:limit]]


def with_fixed_rounds(enc: StepsEncoding, parts: tuple[int, ...]) -> StepsEncoding:
    """The same encoding with ``rounds[s]`` fixed to ``parts[s]``."""
    lo, hi = enc.model.col_lower.copy(), enc.model.col_upper.copy()
    lo[enc.round_col0:] = parts
    hi[enc.round_col0:] = parts
    return replace(enc, model=replace(enc.model, col_lower=lo, col_upper=hi))
