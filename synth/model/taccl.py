"""Reading TACCL's own files: topology profiles and communication sketches, converted to our formats.

**Topology profiles.** TACCL describes one node by a *profile for one message size* (its INPUT_GUIDE): ``name``,
``gpus_per_node``, ``nics_per_node``, ``alpha`` (latency of an intra-node link), ``node_betas_list`` (the
per-size cost of each intra-node link class, cheapest first), ``node_invbws_list`` (``alpha + beta`` per
class), ``remote_alpha`` / ``remote_beta`` / ``remote_invbw`` (the same for the inter-node link). A beta is
"beta in us/MB times the input size in MB": the time one message of the profile's size spends on the link, so

    bw_GBps = size_bytes / beta_us / 1e3

and the profile's size matters (NDv2's alpha is 30 in its 1KB profile, 0.3 in its 1MB one). The size is read
from the profile's ``name`` or file name (``NDv2_1MB``, ``topo-ndv2-32KB.json``); without one the betas are
taken as us per MB (size 1MB) and the description says so. TACCL's guide asks users to multiply every cost by
one factor so that costs keep an integral part; such a factor scales every predicted time alike and does not
change which schedule is best, but times are then in the profile's unit, not microseconds (the description
says this too).

Which links a list profile means is TACCL's choice of machine: one beta is a switch (DGX-2, hub-and-spoke: every
GPU a port of an NVSwitch with ``size / beta`` GB/s), two betas on 8 GPUs are NDv2's hybrid cube-mesh (pairs
with two NVLinks cost ``node_betas_list[0]``, single ones ``node_betas_list[1]``; the pairs are the built-in
``dgx1``'s). TACCL's ``custom`` form gives a ``links`` lane-count matrix with ``betas`` (and ``invbws``)
matrices instead; TACCL indexes them ``[dst][src]``. ``nics_per_node`` NICs split the node's GPUs evenly
(consecutive GPUs share one), each at ``size / remote_beta`` GB/s with ``remote_alpha`` us.

A profile from which no link can be built is an error naming the fields, never a disconnected topology.

**Sketches** (``intranode_sketch``, ``internode_sketch``, ``symmetry_offsets``, ``hyperparameters``): see
:func:`taccl_sketch_to_dict`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from synth.errors import InputError, shown
from synth.units import format_size, parse_size

_SIZE_IN_NAME = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B)(?![A-Za-z])", re.IGNORECASE)
DEFAULT_PROFILE_SIZE = 1 << 20
PROFILE_KEYS = ("node_betas_list", "node_invbws_list", "remote_beta", "remote_invbw", "remote_alpha",
                "nics_per_node")


def is_taccl_topology(raw) -> bool:
    """True for TACCL's topology profiles (list form or ``custom`` matrix form), False for our format."""
    if not isinstance(raw, dict) or "format" in raw:
        return False
    links = raw.get("links")
    matrix = isinstance(links, list) and bool(links) and isinstance(links[0], list)
    return matrix or any(k in raw for k in PROFILE_KEYS)


def is_taccl_sketch(raw) -> bool:
    """True for TACCL's sketch files."""
    return isinstance(raw, dict) and any(k in raw for k in ("intranode_sketch", "internode_sketch",
                                                              "symmetry_offsets"))


def profile_size_bytes(raw: dict, source: str) -> tuple[int, str]:
    """The message size (bytes) a TACCL profile describes and where that came from."""
    for where, text in (("name", raw.get("name")), ("file name", Path(source).stem)):
        if isinstance(text, str):
            m = _SIZE_IN_NAME.search(text)
            if m:
                return parse_size(m.group(1) + m.group(2).replace("i", "").replace("I", ""), source), \
                    f"from its {where} {text!r}"
    return DEFAULT_PROFILE_SIZE, "no size in its name or file name, so betas are read as us per MB"


def _cost(raw: dict, key: str, source: str, positive: bool = True) -> float | None:
    if key not in raw:
        return None
    value = raw[key]
    if not _finite(value) or value < 0 or (positive and value == 0):
        raise InputError(source, key, f"must be a {'positive' if positive else 'non-negative'} finite number, "
                         f"got {shown(value)}")
    return float(value)


def _finite(value) -> bool:
    """A JSON number (not a bool) that is finite (JSON's 1e999 reads as infinity)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _beta(beta, invbw, alpha: float, source: str, where: str) -> float:
    """A per-size cost from ``beta``, or from ``invbw - alpha`` (TACCL: invbw = alpha + beta)."""
    if beta is None and invbw is not None:
        beta = invbw - alpha
    if beta is None or not _finite(beta) or beta <= 0:
        raise InputError(source, where, f"must give a positive finite per-size cost (beta), got {shown(beta)}")
    return float(beta)


def _bw(size: int, beta: float) -> float:
    return size / beta / 1e3


def taccl_topology_to_dict(raw: dict, source: str) -> dict:
    """Convert a TACCL topology profile (module docstring) into our topology dict."""
    size, size_why = profile_size_bytes(raw, source)
    gpn = raw.get("gpus_per_node")
    if "links" in raw:
        n = len(raw["links"]) if isinstance(raw["links"], list) else 0
        gpn = n if gpn is None else gpn
    from synth.model.topology import MAX_RANKS   # topology.py imports this module
    if isinstance(gpn, bool) or not isinstance(gpn, int) or not 1 <= gpn <= MAX_RANKS:
        raise InputError(source, "gpus_per_node", f"must be an integer in 1..{MAX_RANKS}, got {gpn!r}")
    alpha_raw = raw.get("alpha", raw.get("alphas", 0.0))
    alpha = 0.0 if isinstance(alpha_raw, list) else _cost({"alpha": alpha_raw}, "alpha", source, positive=False)
    out = {"name": raw.get("name", Path(source).stem), "ranks": gpn, "gpus_per_node": gpn, "links": [],
           "switches": [], "nics": []}
    if "links" in raw:
        layout = _matrix_links(raw, gpn, alpha_raw, size, source, out)
    elif "node_betas_list" in raw or "node_invbws_list" in raw:
        layout = _list_links(raw, gpn, alpha, size, source, out)
    else:
        raise InputError(source, "node_betas_list", "the profile gives no intra-node links: add node_betas_list "
                         "(and node_invbws_list), or TACCL's custom form: a links matrix with betas")
    if not out["links"] and not out["switches"] and gpn > 1:
        raise InputError(source, "links", "the profile yields no links between GPUs (every links entry is 0); "
                         "give lane counts > 0 in links, or use node_betas_list")
    remote = _nics(raw, gpn, size, source, out)
    unit_note = ("costs read as microseconds; a TACCL profile pre-multiplied by a factor (to keep integral costs) "
                 "gives times in its own unit, which does not change which schedule is best")
    out["description"] = (f"TACCL profile {out['name']} for {format_size(size)} messages ({size_why}): "
                          f"{layout}{remote}; {unit_note}")
    return out


def _list_links(raw: dict, gpn: int, alpha: float, size: int, source: str, out: dict) -> str:
    betas = raw.get("node_betas_list")
    invbws = raw.get("node_invbws_list")
    count = len(betas) if isinstance(betas, list) else len(invbws) if isinstance(invbws, list) else 0
    for key, value in (("node_betas_list", betas), ("node_invbws_list", invbws)):
        if value is not None and (not isinstance(value, list) or len(value) != count or not all(
                _finite(v) for v in value)):
            raise InputError(source, key, f"must be a list of {count or 'one or two'} finite numbers, got "
                             f"{shown(value)}")
    classes = [_beta(betas[k] if betas else None, invbws[k] if invbws else None, alpha, source,
                     f"node_betas_list[{k}]") for k in range(count)]
    if count == 1:
        bw = _bw(size, classes[0])
        out["switches"].append({"name": "nvswitch", "alpha_us": alpha,
                                "ports": [{"ranks": [r], "bw_GBps": bw} for r in range(gpn)]})
        return (f"{gpn} GPUs on a switch (TACCL's DGX-2 / hub-and-spoke layout), alpha {alpha:g}, beta "
                f"{classes[0]:g} per message -> {bw:.4g} GB/s per GPU port")
    if count == 2 and gpn == 8:
        from synth.model.topology import load_topology
        mesh = load_topology("dgx1")
        bws = [_bw(size, classes[0]) / 2, _bw(size, classes[1])]
        for link in mesh.links:
            double = link.lanes == 2
            out["links"].append({"src": link.src, "dst": link.dst, "alpha_us": alpha,
                                 "bw_GBps": bws[0] if double else bws[1], "lanes": link.lanes})
        return (f"NDv2 hybrid cube-mesh (TACCL's NDv2 layout, the pairs of built-in dgx1), alpha {alpha:g}; "
                f"double-NVLink pairs beta {classes[0]:g} -> 2 lanes of {bws[0]:.4g} GB/s, single pairs beta "
                f"{classes[1]:g} -> {bws[1]:.4g} GB/s")
    raise InputError(source, "node_betas_list", f"has {count} value(s) for {gpn} GPUs per node; TACCL's list "
                     "layouts are 1 value (a switch: DGX-2, hub-and-spoke) or 2 values on 8 GPUs (NDv2); for "
                     "other machines use TACCL's custom form (links, betas and invbws matrices)")


def _matrix(raw: dict, key: str, n: int, source: str) -> list | None:
    value = raw.get(key)
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    if not isinstance(value, list) or len(value) != n or not all(
            isinstance(row, list) and len(row) == n and all(
                _finite(v) and v >= 0 for v in row) for row in value):
        raise InputError(source, key, f"must be a {n} x {n} matrix of non-negative numbers (row = destination, "
                         "column = source, as TACCL indexes it)")
    return value


def _matrix_links(raw: dict, gpn: int, alpha_raw, size: int, source: str, out: dict) -> str:
    from synth.model.topology import MAX_LANES   # topology.py imports this module
    n = gpn
    lanes = _matrix(raw, "links", n, source)
    if lanes is None:
        raise InputError(source, "links", f"must be a {n} x {n} matrix of lane counts")
    betas = _matrix(raw, "betas", n, source) or _matrix(raw, "beta", n, source)
    invbws = _matrix(raw, "invbws", n, source)
    alphas = _matrix(raw, "alpha", n, source) or _matrix(raw, "alphas", n, source)
    scalar_beta = _cost(raw, "betas", source) if isinstance(raw.get("betas"), (int, float)) else None
    for dst in range(n):
        for src in range(n):
            count = lanes[dst][src]
            if src == dst or not count:
                continue
            if (isinstance(count, float) and not count.is_integer()) or count > MAX_LANES:
                raise InputError(source, f"links[{dst}][{src}]", f"must be a whole lane count in 0..{MAX_LANES}, "
                                 f"got {shown(count)}")
            a = float(alphas[dst][src]) if alphas else float(alpha_raw or 0.0)
            beta = betas[dst][src] if betas else scalar_beta
            beta = _beta(beta, invbws[dst][src] if invbws else None, a, source, f"betas[{dst}][{src}]")
            out["links"].append({"src": src, "dst": dst, "alpha_us": a, "bw_GBps": _bw(size, beta),
                                 "lanes": int(count)})
    return f"{len(out['links'])} links from TACCL's links/betas matrices (row = destination, column = source)"


def _nics(raw: dict, gpn: int, size: int, source: str, out: dict) -> str:
    count = raw.get("nics_per_node", -1)
    if isinstance(count, bool) or not isinstance(count, int):
        raise InputError(source, "nics_per_node", f"must be an integer, got {count!r}")
    if count <= 0:
        return ""
    if gpn % count:
        raise InputError(source, "nics_per_node", f"{count} NICs do not split {gpn} GPUs evenly")
    r_alpha = _cost(raw, "remote_alpha", source, positive=False)
    if r_alpha is None:
        raise InputError(source, "remote_alpha", "missing; a profile with nics_per_node needs remote_alpha and "
                         "remote_beta (or remote_invbw)")
    beta = _beta(_cost(raw, "remote_beta", source), _cost(raw, "remote_invbw", source), r_alpha, source,
                 "remote_beta")
    bw = _bw(size, beta)
    per = gpn // count
    out["nics"] = [{"ranks": list(range(k * per, (k + 1) * per)), "bw_GBps": bw, "alpha_us": r_alpha}
                   for k in range(count)]
    return (f"; {count} NIC(s) per node shared by {per} GPU(s) each, remote alpha {r_alpha:g}, remote beta "
            f"{beta:g} -> {bw:.4g} GB/s (join nodes with --nodes)")


def taccl_sketch_to_dict(raw: dict, source: str) -> dict:
    """Convert TACCL's sketch JSON into our sketch format (without its ``format`` header).

    ``intranode_sketch.strategy`` none/minmax/maxmin allow every link, ``switch`` takes
    ``switch_hyperedge_strategy[0]``; ``internode_sketch.internode_conn`` (an object, ``direct-map`` or
    ``fully-connected``) gives the connections and ``gpus_to_sender_rev_map`` the relays; ``enforce_ordering``
    means own chunks first; ``symmetry_offsets`` ``[[offset, group], ...]``; ``hyperparameters.input_chunkup``
    the chunks per rank.
    """
    out: dict = {"name": raw.get("name", Path(source).stem), "description": "converted from a TACCL sketch"}
    if "nnodes" in raw:
        out["nodes"] = raw["nnodes"]
    intra = raw.get("intranode_sketch", {})
    if not isinstance(intra, dict):
        raise InputError(source, "intranode_sketch", "must be an object with a strategy")
    strategy = intra.get("strategy", "none")
    if not isinstance(strategy, str):
        raise InputError(source, "intranode_sketch.strategy", f"must be a string, got {shown(strategy)}")
    if strategy == "switch":
        hyper = intra.get("switch_hyperedge_strategy", ["uc-max"])
        if not isinstance(hyper, list) or not hyper:
            raise InputError(source, "intranode_sketch.switch_hyperedge_strategy", "must be a list like [\"uc-max\"]")
        out["switch"] = {"strategy": hyper[0]}
    elif strategy not in ("none", "minmax", "maxmin"):
        raise InputError(source, "intranode_sketch.strategy", f"unknown TACCL strategy {strategy!r}; use none, "
                         "switch, minmax or maxmin")
    inter = raw.get("internode_sketch")
    if isinstance(inter, dict):
        conn = inter.get("internode_conn", "fully-connected")
        internode: dict = {"connections": "all" if isinstance(conn, str) and conn == "fully-connected" else conn}
        if "gpus_to_sender_rev_map" in inter:
            internode["relays"] = inter["gpus_to_sender_rev_map"]
        ordering = inter.get("enforce_ordering", False)
        if not isinstance(ordering, bool):
            raise InputError(source, "internode_sketch.enforce_ordering", f"must be true or false, got "
                             f"{shown(ordering)}")
        internode["own_chunks_first"] = ordering
        out["internode"] = internode
    elif inter is not None:
        raise InputError(source, "internode_sketch", "must be an object")
    offsets = raw.get("symmetry_offsets", [])
    if not isinstance(offsets, list):
        raise InputError(source, "symmetry_offsets", "must be a list of [offset, group] pairs")
    sym = []
    for k, pair in enumerate(offsets):
        if not isinstance(pair, list) or len(pair) != 2:
            raise InputError(source, f"symmetry_offsets[{k}]", "must be an [offset, group] pair")
        sym.append({"offset": pair[0], "group": pair[1]})
    out["symmetry"] = sym
    hyper = raw.get("hyperparameters", {})
    if not isinstance(hyper, dict):
        raise InputError(source, "hyperparameters", f"must be an object like {{\"input_chunkup\": 2}}, got "
                         f"{shown(hyper)}")
    if "input_chunkup" in hyper:
        out["chunks_per_rank"] = hyper["input_chunkup"]
    return out
