"""Communication sketches: a person's hints that narrow the alpha-beta search (TACCL's idea, our format).

A sketch is written in *local* GPU indices (0 .. gpus_per_node-1) and applies to every node of the topology, so
one file serves 2, 4 or more nodes. It says

- ``intranode``: which links inside a node may carry data: ``all`` (default), an explicit ``links`` list of
  ``[src, dst]`` local pairs, or a ``ring`` order (consecutive GPUs, optionally both directions);
- ``switch``: how links through an NVSwitch are used: ``uc-max`` (any number of distinct peers, suits small
  sizes) or ``uc-min`` (few distinct peers: every distinct switch connection costs a little in the routing
  objective, suits large sizes);
- ``internode``: ``connections`` (which local GPU sends to which local GPUs of other nodes: an object
  ``{"1": [0]}``, ``"direct-map"`` for GPU i to GPU i, or ``"all"``), ``relays`` (which sender GPU carries the
  chunks of which local GPUs across nodes; chunks of GPUs not listed may not leave their node through that
  sender) and ``own_chunks_first`` (a sender puts its own chunks on the wire before relayed ones);
- ``symmetry``: rank rotations the solution must respect, as ``{"offset": o, "group": g}`` (rank
  ``r -> (r // g) * g + (r % g + o) % g``; ``g`` may be ``"node"`` or ``"all"``) or as a full ``permutation``;
- ``chunks_per_rank`` and solver ``hints`` (``time_limit_s``, ``mip_gap``, ``pieces``).

TACCL's sketch files (``intranode_sketch``, ``internode_sketch``, ``symmetry_offsets``, ``hyperparameters``) are
recognised and converted. The format is documented by ``synth/schemas/sketch.schema.json``; shipped sketches live
in the ``sketches`` package and are found by name.

Every problem raises :class:`synth.errors.InputError` naming the file, the field and the fix.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from synth.errors import InputError, shown
from synth.fileio import document_name, parse_json, read_json
from synth.model.symmetry import is_automorphism
from synth.model.taccl import is_taccl_sketch, taccl_sketch_to_dict
from synth.model.topology import Topology

FORMAT = "synth-sketch/1"
INTRANODE_STRATEGIES = ("all", "links", "ring")
SWITCH_STRATEGIES = ("uc-max", "uc-min")
MAX_SKETCH_BYTES = 1 << 20
MAX_HINT_TIME_LIMIT_S = 7 * 24 * 3600.0   # a week, as the CLI's --time-limit


@dataclass(frozen=True)
class IntraNode:
    """Which links inside a node may carry data. ``links`` are local ``(src, dst)`` pairs (empty for ``all``)."""

    strategy: str = "all"
    links: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class InterNode:
    """Which local GPU sends to which local GPUs of other nodes and whose chunks it carries.

    ``connections`` maps a local sender to local receivers (None: any inter-node link may be used);
    ``relays`` maps a local sender to the local GPUs whose chunks it may carry (None: any chunk).
    """

    connections: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    relays: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    own_chunks_first: bool = False


@dataclass(frozen=True)
class Hints:
    """Solver hints: time limit (s), relative MIP gap, and the most pieces per chunk pipelining tries (fewer,
    powers of two, compete: the best count depends on the size)."""

    time_limit_s: float | None = None
    mip_gap: float | None = None
    pieces: int | None = None


@dataclass(frozen=True)
class Sketch:
    """A validated sketch, resolved against one topology (``symmetry`` holds full rank permutations)."""

    name: str
    source: str
    intranode: IntraNode = IntraNode()
    switch_strategy: str = "uc-max"
    internode: InterNode = InterNode()
    symmetry: tuple[tuple[int, ...], ...] = ()
    chunks_per_rank: int | None = None
    hints: Hints = Hints()
    description: str = ""

    def allowed_links(self, topology: Topology) -> np.ndarray:
        """Boolean mask over ``topology.links``: the links this sketch lets any chunk use."""
        return _link_mask(self, topology)

    def chunk_link_mask(self, topology: Topology, collective) -> np.ndarray:
        """Boolean ``(chunks, links)`` mask: links each chunk may use (relays restrict inter-node links)."""
        mask = np.repeat(self.allowed_links(topology)[None, :], len(collective.chunks), axis=0)
        relay = relay_mask(self, topology, collective)
        return mask & relay


def unrestricted(topology: Topology) -> Sketch:
    """The sketch that allows everything (used when the user gives none)."""
    return Sketch(name="none", source="<default>")


# ----------------------------------------------------------------------------------------------- masks

def _local(topology: Topology, rank: int) -> int:
    return rank % topology.gpus_per_node


def _is_internode(topology: Topology, link) -> bool:
    return topology.node_of(link.src) != topology.node_of(link.dst)


def _link_mask(sketch: Sketch, topology: Topology) -> np.ndarray:
    links = topology.links
    mask = np.ones(len(links), dtype=bool)
    intra_ok = set(sketch.intranode.links)
    conns = None if sketch.internode.connections is None else \
        {(s, r) for s, rs in sketch.internode.connections for r in rs}
    for i, link in enumerate(links):
        pair = (_local(topology, link.src), _local(topology, link.dst))
        if _is_internode(topology, link):
            if conns is not None and pair not in conns:
                mask[i] = False
        elif sketch.intranode.strategy != "all" and pair not in intra_ok:
            mask[i] = False
    return mask


def relay_mask(sketch: Sketch, topology: Topology, collective) -> np.ndarray:
    """``(chunks, links)`` mask of the ``relays`` rule: a chunk crosses nodes only through a sender that carries
    the chunk's source GPU (by local index). True everywhere when the sketch names no relays."""
    mask = np.ones((len(collective.chunks), len(topology.links)), dtype=bool)
    if sketch.internode.relays is None or topology.num_nodes == 1:
        return mask
    carries = {s: set(gs) for s, gs in sketch.internode.relays}
    inter = [i for i, l in enumerate(topology.links) if _is_internode(topology, l)]
    for c in collective.chunks:
        origins = {_local(topology, r) for r in c.sources}
        for i in inter:
            sender = _local(topology, topology.links[i].src)
            if not origins & carries.get(sender, set()):
                mask[c.id, i] = False
    return mask


def has_nic(topology: Topology, local_gpu: int) -> bool:
    """True if local GPU ``local_gpu`` can send off its node: it is on a NIC or has an inter-node link."""
    if any(local_gpu in nic.ranks for nic in topology.nics):
        return True
    return any(_is_internode(topology, l) and _local(topology, l.src) == local_gpu for l in topology.links)


# ----------------------------------------------------------------------------------------------- loading

def builtin_sketch_names() -> list[str]:
    """Names of the shipped sketches."""
    return sorted(p.name[:-5] for p in resources.files("synth.sketches").iterdir() if p.name.endswith(".json"))


def load_sketch(name_or_path: str | Path, topology: Topology) -> Sketch:
    """Load a shipped sketch by name or a JSON file by path and validate it against ``topology``.

    TACCL's sketch files are recognised and converted.

    >>> from synth.model.topology import load_topology
    >>> load_sketch("ndv2-tecc-relay", load_topology("ndv2-2node-tecc")).internode.connections
    ((1, (0,)),)
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or os.path.exists(path):     # os.path: False, not OSError, for an overlong name
        source = str(path)
        raw = read_json(path, "sketch", max_bytes=MAX_SKETCH_BYTES)
    else:
        candidate = resources.files("synth.sketches") / f"{name_or_path}.json"
        if str(name_or_path) not in builtin_sketch_names():    # is_file() raises for an overlong name
            known = ", ".join(builtin_sketch_names())
            raise InputError("--sketch", "", f"unknown sketch {str(name_or_path)!r}; use a JSON file path or one "
                             f"of: {known}")
        source = f"sketches/{name_or_path}.json"
        raw = parse_json(candidate.read_bytes(), source, "sketch")
    if is_taccl_sketch(raw):
        raw = taccl_sketch_to_dict(raw, source)
    return sketch_from_dict(raw, topology, source)


def _decimal(text: str) -> int | None:
    """The integer an ASCII-decimal string spells (JSON object keys are strings), else None.

    ``str.isdigit`` is not enough: it accepts superscripts and other scripts' digits that ``int()`` refuses.

    >>> _decimal("12"), _decimal("-3"), _decimal("¹"), _decimal("٣")
    (12, -3, None, None)
    """
    body = text.strip()
    body = body[1:] if body.startswith("-") else body
    if not body or len(body) > 12 or not (body.isascii() and body.isdigit()):
        return None
    return int(text)


def _int(value, source: str, where: str, lo: int = 0, hi: int | None = None, what: str = "an integer") -> int:
    if isinstance(value, str) and _decimal(value) is not None:
        value = _decimal(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        rng = f" in {lo}..{hi}" if hi is not None else (f" >= {lo}" if lo else "")
        raise InputError(source, where, f"must be {what}{rng}, got {shown(value)}")
    return value


def _gpu(value, gpn: int, source: str, where: str) -> int:
    if isinstance(value, str) and _decimal(value) is not None:
        value = _decimal(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < gpn:
        raise InputError(source, where, f"unknown GPU {shown(value)}; local GPUs are 0..{gpn - 1}")
    return value


def _flag(raw: dict, key: str, source: str, where: str) -> bool:
    """A JSON boolean (``"no"`` or 0 are refused, not read as a truth value)."""
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise InputError(source, where, f"must be true or false, got {shown(value)}")
    return value


def _choice(value, choices: tuple[str, ...], source: str, where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InputError(source, where, f"unknown strategy {shown(value)}; use {', '.join(choices[:-1])} or "
                         f"{choices[-1]}")
    return value


def _local_pairs_with_link(topology: Topology, internode: bool) -> set[tuple[int, int]]:
    pairs = set()
    for link in topology.links:
        if _is_internode(topology, link) == internode:
            pairs.add((_local(topology, link.src), _local(topology, link.dst)))
    return pairs


def sketch_from_dict(raw: dict, topology: Topology, source: str = "<memory>") -> Sketch:
    """Validate a sketch in our JSON format against ``topology`` and build it."""
    name = document_name(raw, source, FORMAT, "sketch")
    known = {"format", "name", "description", "gpus_per_node", "nodes", "intranode", "switch", "internode",
             "symmetry", "chunks_per_rank", "hints"}
    extra = sorted(set(raw) - known)
    if extra:
        raise InputError(source, extra[0], f"unknown field; sketch fields are {', '.join(sorted(known))}")
    gpn = topology.gpus_per_node
    if "gpus_per_node" in raw and _int(raw["gpus_per_node"], source, "gpus_per_node", 1) != gpn:
        raise InputError(source, "gpus_per_node", f"is {raw['gpus_per_node']} but topology {topology.name} has {gpn} "
                         "GPUs per node; use a sketch written for this machine")
    if "nodes" in raw and _int(raw["nodes"], source, "nodes", 1) != topology.num_nodes:
        raise InputError(source, "nodes", f"is {raw['nodes']} but topology {topology.name} has "
                         f"{topology.num_nodes} node(s); drop the field or use --nodes {raw['nodes']}")

    intranode = _parse_intranode(raw.get("intranode", {}), topology, source)
    switch = raw.get("switch", {})
    if not isinstance(switch, dict):
        raise InputError(source, "switch", "must be an object like {\"strategy\": \"uc-min\"}")
    strategy = _choice(switch.get("strategy", "uc-max"), SWITCH_STRATEGIES, source, "switch.strategy")
    internode = _parse_internode(raw.get("internode", {}), topology, source)
    chunks = raw.get("chunks_per_rank")
    if chunks is not None:
        chunks = _int(chunks, source, "chunks_per_rank", 1, 1024, "a positive integer")
    hints = _parse_hints(raw.get("hints", {}), source)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise InputError(source, "description", f"must be a string, got {shown(description)}")
    sketch = Sketch(name=name, source=source, intranode=intranode, switch_strategy=strategy, internode=internode,
                    chunks_per_rank=chunks, hints=hints, description=description)
    symmetry = _parse_symmetry(raw.get("symmetry", []), topology, source, sketch)
    return Sketch(name=name, source=source, intranode=intranode, switch_strategy=strategy, internode=internode,
                  symmetry=symmetry, chunks_per_rank=chunks, hints=hints, description=sketch.description)


def _parse_intranode(raw, topology: Topology, source: str) -> IntraNode:
    gpn = topology.gpus_per_node
    if raw in ("all", None):
        return IntraNode()
    if not isinstance(raw, dict):
        raise InputError(source, "intranode", "must be an object with a strategy (all, links, ring)")
    strategy = _choice(raw.get("strategy", "links" if "links" in raw else "ring" if "ring" in raw else "all"),
                       INTRANODE_STRATEGIES, source, "intranode.strategy")
    bidirectional = _flag(raw, "bidirectional", source, "intranode.bidirectional")
    if strategy == "all":
        return IntraNode()
    existing = _local_pairs_with_link(topology, internode=False)
    pairs = []
    if strategy == "links":
        items = raw.get("links")
        if not isinstance(items, list) or not items:
            raise InputError(source, "intranode.links", "must be a non-empty list of [src, dst] local GPU pairs")
        for k, item in enumerate(items):
            where = f"intranode.links[{k}]"
            if not isinstance(item, list) or len(item) != 2:
                raise InputError(source, where, "must be a [src, dst] pair of local GPUs")
            pair = (_gpu(item[0], gpn, source, where), _gpu(item[1], gpn, source, where))
            pairs.append(pair)
            if bidirectional:
                pairs.append(pair[::-1])
    else:
        ring = raw.get("ring")
        if not isinstance(ring, list) or len(ring) < 2:
            raise InputError(source, "intranode.ring", "must list at least two local GPUs in ring order")
        order = [_gpu(g, gpn, source, f"intranode.ring[{k}]") for k, g in enumerate(ring)]
        if len(set(order)) != len(order):
            raise InputError(source, "intranode.ring", "lists a GPU twice; each GPU appears once in a ring")
        for a, b in zip(order, order[1:] + order[:1]):
            pairs.append((a, b))
            if bidirectional:
                pairs.append((b, a))
    for a, b in pairs:
        if a == b:
            raise InputError(source, "intranode", f"pair {a}->{b} is a GPU to itself; remove it")
        if (a, b) not in existing:
            raise InputError(source, f"intranode.{strategy}", f"uses link {a}->{b}, which topology "
                             f"{topology.name} does not have inside a node; use existing links only")
    return IntraNode(strategy, tuple(sorted(set(pairs))))


def _parse_internode(raw, topology: Topology, source: str) -> InterNode:
    gpn = topology.gpus_per_node
    if raw is None:
        return InterNode()
    if not isinstance(raw, dict):
        raise InputError(source, "internode", "must be an object with connections, relays, own_chunks_first")
    if topology.num_nodes == 1:
        return InterNode()  # a multi-node sketch used on one node: nothing to restrict
    existing = _local_pairs_with_link(topology, internode=True)
    conn = raw.get("connections", "all")
    connections = None
    if isinstance(conn, str) and conn == "direct-map":
        connections = tuple((g, (g,)) for g in range(gpn))
    elif isinstance(conn, str) and conn in ("all", "fully-connected"):
        connections = None
    elif isinstance(conn, dict):
        items = []
        for key, dsts in conn.items():
            where = f"internode.connections.{key}"
            sender = _gpu(key, gpn, source, where)
            if not isinstance(dsts, list) or not dsts:
                raise InputError(source, where, "must be a non-empty list of receiving local GPUs")
            items.append((sender, tuple(sorted({_gpu(d, gpn, source, where) for d in dsts}))))
        connections = tuple(sorted(items))
    else:
        raise InputError(source, "internode.connections", "must be an object {sender: [receivers]}, "
                         "\"direct-map\" or \"all\"")
    if connections is not None:
        for sender, dsts in connections:
            for d in dsts:
                if (sender, d) not in existing:
                    raise InputError(source, f"internode.connections.{sender}", f"GPU {sender} -> remote GPU {d}: "
                                     f"topology {topology.name} has no such inter-node link; senders with links "
                                     f"are {sorted({s for s, _ in existing})}")
    relays = raw.get("relays")
    if relays is not None:
        if not isinstance(relays, dict) or not relays:
            raise InputError(source, "internode.relays", "must be an object {sender GPU: [GPUs whose chunks it "
                             "carries]}")
        senders = None if connections is None else {s for s, _ in connections}
        nic_gpus = [g for g in range(gpn) if has_nic(topology, g)]
        items = []
        for key, gpus in relays.items():
            where = f"internode.relays.{key}"
            sender = _gpu(key, gpn, source, where)
            if not has_nic(topology, sender):
                raise InputError(source, where, f"GPU {sender} has no NIC (no inter-node link leaves it in "
                                 f"{topology.name}); relay through a GPU that has one: {nic_gpus}")
            if senders is not None and sender not in senders:
                raise InputError(source, where, f"GPU {sender} is not a sender in internode.connections; add it "
                                 f"there or relay through one of {sorted(senders)}")
            if not isinstance(gpus, list) or not gpus:
                raise InputError(source, where, "must be a non-empty list of local GPUs")
            items.append((sender, tuple(sorted({_gpu(g, gpn, source, where) for g in gpus}))))
        relays = tuple(sorted(items))
    own = _flag(raw, "own_chunks_first", source, "internode.own_chunks_first")
    return InterNode(connections, relays, own)


def _parse_hints(raw, source: str) -> Hints:
    if not isinstance(raw, dict):
        raise InputError(source, "hints", "must be an object with time_limit_s, mip_gap, pieces")
    extra = sorted(set(raw) - {"time_limit_s", "mip_gap", "pieces"})
    if extra:
        raise InputError(source, f"hints.{extra[0]}", "unknown hint; use time_limit_s, mip_gap or pieces")
    out = {}
    for key, high in (("time_limit_s", MAX_HINT_TIME_LIMIT_S), ("mip_gap", 1.0)):
        if key in raw:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
                    v > high or (key == "time_limit_s" and v == 0):
                what = "a positive" if key == "time_limit_s" else "a non-negative"
                raise InputError(source, f"hints.{key}", f"must be {what} finite number up to {high:g}, got "
                                 f"{shown(v)}")
            out[key] = float(v)
    if "pieces" in raw:
        out["pieces"] = _int(raw["pieces"], source, "hints.pieces", 1, 256, "a positive integer")
    return Hints(**out)


def _parse_symmetry(raw, topology: Topology, source: str, sketch: Sketch) -> tuple[tuple[int, ...], ...]:
    n, gpn = topology.num_ranks, topology.gpus_per_node
    if not isinstance(raw, list):
        raise InputError(source, "symmetry", "must be a list of {offset, group} or {permutation}")
    perms = []
    mask = _link_mask(sketch, topology)
    for k, item in enumerate(raw):
        where = f"symmetry[{k}]"
        if not isinstance(item, dict):
            raise InputError(source, where, "must be an object {\"offset\": o, \"group\": g} or {\"permutation\": [...]}")
        if "permutation" in item:
            perm = item["permutation"]
            if not isinstance(perm, list) or len(perm) != n or any(isinstance(p, bool) or not isinstance(p, int)
                                                                   for p in perm) or sorted(perm) != list(range(n)):
                raise InputError(source, where, f"permutation must list every rank 0..{n - 1} once")
            perm = tuple(perm)
        else:
            group = item.get("group", "node")
            if isinstance(group, str) and group in ("node", "all"):
                group = gpn if group == "node" else n
            group = _int(group, source, f"{where}.group", 1, n)
            offset = _int(item.get("offset"), source, f"{where}.offset", 0, None)
            if n % group:
                raise InputError(source, f"{where}.group", f"{n} ranks do not split into groups of {group}")
            perm = tuple((r // group) * group + (r % group + offset) % group for r in range(n))
        if not is_automorphism(topology, perm):
            raise InputError(source, where, f"is not a symmetry of topology {topology.name} (it maps a link onto a "
                             "missing or different link); remove it")
        for i, link in enumerate(topology.links):
            j = topology.link_index[(perm[link.src], perm[link.dst])]
            if mask[i] != mask[j]:
                raise InputError(source, where, f"maps allowed link {link.src}->{link.dst} onto a link the sketch "
                                 "forbids (or the reverse); make the sketch symmetric or remove this symmetry")
        _check_relay_symmetry(sketch, topology, perm, source, where)
        perms.append(perm)
    return tuple(perms)


def _check_relay_symmetry(sketch: Sketch, topology: Topology, perm, source: str, where: str) -> None:
    """A symmetry must map every sender's relayed GPUs onto its image sender's relayed GPUs."""
    if sketch.internode.relays is None or topology.num_nodes == 1:
        return
    gpn = topology.gpus_per_node
    carries = {s: set(gs) for s, gs in sketch.internode.relays}
    for base in range(0, topology.num_ranks, gpn):
        for s in range(gpn):
            image_sender = perm[base + s] % gpn
            image = {perm[base + g] % gpn for g in carries.get(s, ())}
            if image != carries.get(image_sender, set()):
                raise InputError(source, where, f"maps the relays of GPU {s} onto GPU {image_sender}, which relays "
                                 f"{sorted(carries.get(image_sender, set()))}; make internode.relays symmetric or "
                                 "remove this symmetry")


def reverse_sketch(sketch: Sketch) -> Sketch:
    """The sketch for the time-reversed problem (reductions): every allowed link reversed.

    Relays name the chunks a *sender* carries, which has no counterpart once links are reversed, so they are
    dropped; the connections (reversed) and the intra-node restriction still apply.
    """
    intra = sketch.intranode
    if intra.strategy != "all":
        intra = IntraNode(intra.strategy, tuple(sorted((b, a) for a, b in intra.links)))
    inter = sketch.internode
    if inter.connections is not None:
        rev: dict[int, set] = {}
        for s, rs in inter.connections:
            for r in rs:
                rev.setdefault(r, set()).add(s)
        inter = InterNode(tuple(sorted((s, tuple(sorted(rs))) for s, rs in rev.items())), None,
                          inter.own_chunks_first)
    else:
        inter = InterNode(None, None, inter.own_chunks_first)
    return Sketch(sketch.name + "-reversed", sketch.source, intra, sketch.switch_strategy, inter, sketch.symmetry,
                  sketch.chunks_per_rank, sketch.hints, sketch.description)
