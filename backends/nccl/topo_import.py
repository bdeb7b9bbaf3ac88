"""Import NCCL topology dumps (``NCCL_TOPO_DUMP_FILE``) into our topology JSON format (DESIGN section 8).

NCCL writes what it detected about a node as ``<system version="1">`` holding ``<cpu>`` elements, nested
``<pci busid class link_speed link_width>`` elements (PCIe switches, GPUs, NICs), ``<gpu dev sm rank gdr>``
with ``<nvlink target count tclass>`` children, and ``<nic>`` elements holding ``<net speed>`` devices.
:func:`import_nccl_dumps` turns one dump per node into the dict that :func:`synth.model.topology.topology_from_dict`
validates:

- **NVLink** between two GPUs becomes a directed link per listed ``<nvlink>`` with ``lanes = count`` and the
  per-link bandwidth of the GPU generation (:data:`NVLINK_GBPS_BY_SM`, GB/s per direction).
- **NVSwitch** (``tclass="0x068000"``): every attached GPU is a port of one switch per node, with egress and
  ingress bandwidth ``count * per-link bandwidth``.
- **PCIe**: GPUs that cannot reach each other over NVLink at all (not directly, not through an NVSwitch, not
  through other GPUs' NVLinks) get a PCIe link whose bandwidth is the narrowest link on the PCIe path between
  them (each ``pci`` element's ``link_speed`` x ``link_width``, see :func:`pcie_bandwidth_GBps`), crossing the
  inter-CPU link when they hang off different CPUs. Shared PCIe uplinks are not modelled as shared.
- **NICs**: every ``<net>`` is a NIC with ``speed`` (Mb/s) / 8000 GB/s, used by the local GPUs nearest to it in
  the PCIe tree (ties are spread evenly). NICs no GPU is nearest to are left out.
- **Several dumps** (one per node, in the order given; GPUs ordered by ``dev`` within a node) make a
  multi-node topology: the nodes' NICs are ports of one network switch, as :func:`synth.model.topology.compose_nodes`
  does for built-ins. Every dump must describe the same number of GPUs.

Latencies are not in the dumps; the defaults below match the built-in topologies (profile the real machine
with ``synth profile`` for measured values).

The files are untrusted (DESIGN section 11): defusedxml refuses DTDs and entities, sizes are bounded before
anything is built, attributes are matched against patterns before conversion, and every problem is an
:class:`~synth.errors.InputError` naming the file, the element and what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from synth.errors import InputError
from synth.model.topology import FORMAT, MAX_RANKS

# Per-link NVLink bandwidth (GB/s per direction) by compute capability, as NCCL assumes it.
NVLINK_GBPS_BY_SM = {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6}
NVSWITCH_TCLASS = 0x068000
NVLINK_ALPHA_US = 0.7
PCIE_ALPHA_US = 1.0
NET_ALPHA_US = 2.0
# Effective PCIe payload rate as a fraction of the raw signalling rate (encoding and protocol overhead):
# 16 GT/s x 16 lanes -> 24 GB/s (Gen4 x16), 8 GT/s x 16 -> 12 GB/s (Gen3 x16).
PCIE_EFFICIENCY = 0.75
# Bandwidth (GB/s) between two CPU sockets when a PCIe path crosses them, by CPU vendor.
INTER_CPU_GBPS = {"GenuineIntel": 10.0, "AuthenticAMD": 16.0}
INTER_CPU_GBPS_DEFAULT = 6.0

MAX_DUMP_BYTES = 16 << 20
MAX_ELEMENTS = 200_000
MAX_DEPTH = 64
MAX_GPUS_PER_NODE = 64
MAX_NICS_PER_NODE = 256

_INT = re.compile(r"^\s*(0[xX][0-9a-fA-F]{1,16}|[0-9]{1,18})\s*$")
_SPEED = re.compile(r"^\s*([0-9]{1,4}(?:\.[0-9]{1,6})?)\s*GT/s", re.IGNORECASE)
_FLOAT = re.compile(r"^\s*[0-9]{1,12}(?:\.[0-9]{1,12})?\s*$")


@dataclass(frozen=True)
class _Gpu:
    dev: int
    sm: int
    busid: str
    chain: tuple          # ancestors from the GPU's own pci element up to its cpu (Element objects)
    nvlinks: tuple        # (target busid, count, tclass)
    where: str


@dataclass(frozen=True)
class _Net:
    name: str
    bw_GBps: float
    alpha_us: float
    chain: tuple
    where: str


@dataclass(frozen=True)
class _Node:
    """One parsed dump: its GPUs (ordered by dev) and network devices."""

    source: str
    gpus: tuple[_Gpu, ...]
    nets: tuple[_Net, ...]
    cpu_vendor: dict      # id(cpu element) -> vendor string


# ----------------------------------------------------------------------------------------------- parsing

def _int_attr(el: Element, key: str, source: str, where: str, default: int | None = None) -> int:
    text = el.get(key)
    if text is None:
        if default is None:
            raise InputError(source, f"{where}.{key}", "missing; NCCL dumps always carry it")
        return default
    m = _INT.match(text)
    if not m:
        raise InputError(source, f"{where}.{key}", f"must be an integer, got {text[:40]!r}")
    return int(m.group(1), 0)


def pcie_bandwidth_GBps(link_speed: str, link_width: str) -> float | None:
    """Effective bandwidth (GB/s per direction) of a PCIe link from NCCL's ``link_speed``/``link_width``.

    ``link_speed`` is e.g. ``"16.0 GT/s PCIe"`` or ``"8 GT/s"``; the result is
    ``GT/s x lanes / 8 x PCIE_EFFICIENCY``. Returns None when the speed cannot be read (NCCL writes an empty
    string for links it could not query); such a link does not limit the path.

    >>> pcie_bandwidth_GBps("16.0 GT/s PCIe", "16")
    24.0
    """
    m = _SPEED.match(link_speed or "")
    w = _INT.match(link_width or "")
    if not m or not w:
        return None
    gts, lanes = float(m.group(1)), int(w.group(1), 0)
    if gts <= 0 or lanes <= 0:
        return None
    return gts * lanes / 8.0 * PCIE_EFFICIENCY


def _read_text(path: Path) -> str:
    source = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise InputError(source, "", f"file is {size} bytes; NCCL topology dumps are far smaller "
                             f"(limit {MAX_DUMP_BYTES})")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(source, "", f"cannot read file ({exc.strerror})") from None
    if len(data) > MAX_DUMP_BYTES:
        raise InputError(source, "", f"file is larger than {MAX_DUMP_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(source, f"byte {exc.start}", "not UTF-8 text; is this an NCCL topology dump?") from None


def parse_nccl_dump(text: str, source: str) -> _Node:
    """Parse one dump's text. Raises InputError for malformed, hostile or unsupported input."""
    if len(text) > MAX_DUMP_BYTES:
        raise InputError(source, "", f"more than {MAX_DUMP_BYTES} characters")
    if text.count("<") > MAX_ELEMENTS:
        raise InputError(source, "", f"more than {MAX_ELEMENTS} elements; not an NCCL topology dump")
    try:
        root = fromstring(text, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as exc:
        raise InputError(source, "", f"refused: {exc.__class__.__name__} (DTDs and entities are not "
                         "allowed in topology dumps)") from None
    except ParseError as exc:
        line, col = getattr(exc, "position", (0, 0))
        raise InputError(source, f"line {line}", f"invalid XML ({str(exc).split(':')[0]}, column {col})") from None
    if root.tag != "system":
        raise InputError(source, root.tag, "the root element must be <system version=\"1\"> "
                         "(write the file with NCCL_TOPO_DUMP_FILE)")
    version = root.get("version", "1")
    if version.strip() != "1":
        raise InputError(source, "system.version", f"unsupported version {version[:20]!r}; expected 1")

    gpus: list[_Gpu] = []
    nets: list[_Net] = []
    vendors: dict = {}
    # Iterative pre-order walk (document order) keeping the chain of pci/cpu ancestors, innermost first.
    stack = [(child, (), f"system.{child.tag}", 1) for child in reversed(list(root))]
    while stack:
        el, chain, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(source, where, f"nested more than {MAX_DEPTH} levels deep")
        tag = el.tag if isinstance(el.tag, str) else "?"
        if tag == "gpu":
            gpus.append(_parse_gpu(el, chain, source, where))
            if len(gpus) > MAX_GPUS_PER_NODE:
                raise InputError(source, where, f"more than {MAX_GPUS_PER_NODE} GPUs in one node")
            continue
        if tag == "nic":
            for j, net in enumerate(el.findall("net")):
                nets.append(_parse_net(net, chain, source, f"{where}.net[{j}]"))
                if len(nets) > MAX_NICS_PER_NODE:
                    raise InputError(source, where, f"more than {MAX_NICS_PER_NODE} network devices")
            continue
        if tag == "cpu":
            vendors[id(el)] = el.get("vendor", "")
        inner = (el,) + chain if tag in ("cpu", "pci") else chain
        label = f"{tag}[{el.get('busid')}]" if tag == "pci" and el.get("busid") else tag
        for child in reversed(list(el)):
            stack.append((child, inner, f"{where.rsplit('.', 1)[0]}.{label}.{child.tag}", depth + 1))
    if not gpus:
        raise InputError(source, "gpu", "no <gpu> elements; dump the topology from a process that uses GPUs")
    devs = [g.dev for g in gpus]
    if len(set(devs)) != len(devs):
        dup = sorted({d for d in devs if devs.count(d) > 1})
        raise InputError(source, "gpu.dev", f"device(s) {dup} appear twice")
    busids = [g.busid for g in gpus]
    if len(set(busids)) != len(busids):
        raise InputError(source, "pci.busid", "two GPUs share a PCI bus id")
    return _Node(source, tuple(sorted(gpus, key=lambda g: g.dev)), tuple(nets), vendors)


def _parse_gpu(el: Element, chain: tuple, source: str, where: str) -> _Gpu:
    dev = _int_attr(el, "dev", source, where)
    where = f"gpu[dev={dev}]"
    sm = _int_attr(el, "sm", source, where)
    if not chain or chain[0].tag != "pci" or not chain[0].get("busid"):
        raise InputError(source, where, "must sit inside the <pci busid=...> element of its device")
    busid = _norm_busid(chain[0].get("busid"))
    links = []
    for j, nv in enumerate(el.findall("nvlink")):
        nwhere = f"{where}.nvlink[{j}]"
        target = nv.get("target")
        if not target:
            raise InputError(source, f"{nwhere}.target", "missing; NCCL dumps always carry it")
        count = _int_attr(nv, "count", source, nwhere)
        if not 1 <= count <= 64:
            raise InputError(source, f"{nwhere}.count", f"{count} NVLinks is not plausible (1..64)")
        tclass = _int_attr(nv, "tclass", source, nwhere, default=0)
        links.append((_norm_busid(target), count, tclass))
    if links and sm not in NVLINK_GBPS_BY_SM:
        known = ", ".join(f"sm{k}" for k in NVLINK_GBPS_BY_SM)
        raise InputError(source, f"{where}.sm", f"no NVLink bandwidth known for sm{sm}; known: {known} "
                         "(profile the machine with synth profile instead)")
    return _Gpu(dev, sm, busid, chain, tuple(links), where)


def _parse_net(el: Element, chain: tuple, source: str, where: str) -> _Net:
    name = el.get("name", "")[:64] or where
    speed = _int_attr(el, "speed", source, where)
    if not 0 < speed <= 100_000_000:
        raise InputError(source, f"{where}.speed", f"{speed} Mb/s is not a plausible NIC speed")
    latency = el.get("latency", "0")
    alpha = float(latency) if _FLOAT.match(latency) else 0.0
    return _Net(name, speed / 8000.0, alpha if alpha > 0 else NET_ALPHA_US, chain, where)


def _norm_busid(busid: str) -> str:
    return busid.strip().lower()[:32]


# ----------------------------------------------------------------------------------------------- building

def _path_bandwidth(a: tuple, b: tuple, vendors: dict) -> float | None:
    """Narrowest PCIe link between two devices given their ancestor chains (innermost first)."""
    ids_b = {id(e) for e in b}
    lca = next((e for e in a if id(e) in ids_b), None)
    links = []
    for chain in (a, b):
        for e in chain:
            if lca is not None and e is lca:
                break
            if e.tag == "pci":
                links.append(pcie_bandwidth_GBps(e.get("link_speed", ""), e.get("link_width", "")))
    if lca is None:  # different CPU sockets
        vendor = next((vendors.get(id(e), "") for e in a if e.tag == "cpu"), "")
        links.append(INTER_CPU_GBPS.get(vendor, INTER_CPU_GBPS_DEFAULT))
    known = [x for x in links if x is not None]
    return min(known) if known else None


def _hops(a: tuple, b: tuple) -> int:
    ids_b = {id(e): i for i, e in enumerate(b)}
    for i, e in enumerate(a):
        if id(e) in ids_b:
            return i + ids_b[id(e)]
    return len(a) + len(b) + 1000


def _node_parts(node: _Node) -> dict:
    """Links (local ranks), NVSwitch ports and NICs of one node."""
    source = node.source
    local = {g.busid: i for i, g in enumerate(node.gpus)}
    links: dict[tuple[int, int], dict] = {}
    switch_ports = []
    nvl_neighbours: dict[int, set[int]] = {i: set() for i in range(len(node.gpus))}
    for i, g in enumerate(node.gpus):
        per_link = NVLINK_GBPS_BY_SM.get(g.sm)
        on_switch = 0
        for j, (target, count, tclass) in enumerate(g.nvlinks):
            if tclass == NVSWITCH_TCLASS:
                on_switch += count
            elif target in local:
                dst = local[target]
                if dst == i:
                    raise InputError(source, f"{g.where}.nvlink[{j}].target", "an NVLink to the GPU itself")
                if (i, dst) in links:
                    links[(i, dst)]["lanes"] += count
                else:
                    links[(i, dst)] = {"src": i, "dst": dst, "alpha_us": NVLINK_ALPHA_US, "bw_GBps": per_link,
                                       "lanes": count}
                nvl_neighbours[i].add(dst)
                nvl_neighbours[dst].add(i)
            # NVLinks to CPUs (POWER9) or devices outside the dump carry no GPU-to-GPU traffic: skipped.
        if on_switch:
            switch_ports.append({"ranks": [i], "bw_GBps": on_switch * per_link})
    switched = [p["ranks"][0] for p in switch_ports]
    for a in switched:
        nvl_neighbours[a].update(b for b in switched if b != a)
    component = _components(nvl_neighbours)
    for i, a in enumerate(node.gpus):
        for j, b in enumerate(node.gpus):
            if i == j or component[i] == component[j]:
                continue
            bw = _path_bandwidth(a.chain, b.chain, node.cpu_vendor)
            if bw is None:
                raise InputError(source, f"{a.where}", f"no PCIe link speed on the path to gpu[dev={b.dev}]; "
                                 "the dump must give link_speed and link_width")
            links[(i, j)] = {"src": i, "dst": j, "alpha_us": PCIE_ALPHA_US, "bw_GBps": bw, "lanes": 1}
    return {"links": [links[k] for k in sorted(links)], "switch_ports": switch_ports,
            "nics": _assign_nics(node)}


def _components(neighbours: dict[int, set[int]]) -> dict[int, int]:
    comp: dict[int, int] = {}
    for start in sorted(neighbours):
        if start in comp:
            continue
        comp[start] = start
        todo = [start]
        while todo:
            v = todo.pop()
            for w in neighbours[v]:
                if w not in comp:
                    comp[w] = start
                    todo.append(w)
    return comp


def _assign_nics(node: _Node) -> list[dict]:
    """Each GPU uses its nearest NIC in the PCIe tree; among equally near NICs the least used one."""
    if not node.nets:
        return []
    users: list[list[int]] = [[] for _ in node.nets]
    for i, g in enumerate(node.gpus):
        dist = [_hops(g.chain, net.chain) for net in node.nets]
        best = min(dist)
        choice = min((k for k, d in enumerate(dist) if d == best), key=lambda k: (len(users[k]), k))
        users[choice].append(i)
    return [{"ranks": ranks, "bw_GBps": net.bw_GBps, "alpha_us": net.alpha_us}
            for net, ranks in zip(node.nets, users) if ranks]


def import_nccl_dumps(paths: list, name: str | None = None) -> dict:
    """Build a topology dict (our JSON format) from NCCL topology dumps, one file per node.

    Parameters
    ----------
    paths : list of str or Path
        ``NCCL_TOPO_DUMP_FILE`` outputs, one per node, in node order.
    name : str, optional
        Topology name; defaults to the first file's stem (with ``xK`` for K nodes).

    Returns
    -------
    dict
        Ready for :func:`synth.model.topology.topology_from_dict`: ``ranks``, ``gpus_per_node``, ``links`` (NVLink
        lanes at the generation's GB/s per link, PCIe paths in GB/s), ``switches`` (NVSwitch ports at
        ``count x`` per-link GB/s; the network switch joining nodes) and ``nics`` (GB/s, alpha in us).

    Examples
    --------
    A one-node dump with two GPUs on PCIe Gen4 x16 behind one CPU:

    >>> import tempfile
    >>> from pathlib import Path
    >>> from synth.model.topology import topology_from_dict
    >>> gpu = ('<pci busid="0000:{0}1:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">'
    ...        '<gpu dev="{0}" sm="86" rank="{0}"/></pci>')
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     dump = Path(folder) / "pcie_2gpu.xml"
    ...     text = '<system version="1"><cpu numaid="0">' + gpu.format(0) + gpu.format(1) + "</cpu></system>"
    ...     _ = dump.write_text(text)
    ...     raw = import_nccl_dumps([dump])
    >>> raw["name"], topology_from_dict(raw).num_ranks
    ('pcie_2gpu', 2)
    >>> [(link["src"], link["dst"], link["bw_GBps"]) for link in raw["links"]]
    [(0, 1, 24.0), (1, 0, 24.0)]
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("DUMP", "", "give at least one NCCL topology dump")
    nodes = [parse_nccl_dump(_read_text(p), str(p)) for p in paths]
    gpn = len(nodes[0].gpus)
    for node in nodes[1:]:
        if len(node.gpus) != gpn:
            raise InputError(node.source, "gpu", f"has {len(node.gpus)} GPUs but {nodes[0].source} has {gpn}; "
                             "every node must have the same number of GPUs")
    total = gpn * len(nodes)
    if total > MAX_RANKS:
        raise InputError(str(paths[-1]), "", f"{total} GPUs in all is more than the supported {MAX_RANKS}")
    base = name or paths[0].stem
    parts = [_node_parts(node) for node in nodes]
    links, switches, net_ports = [], [], []
    for k, part in enumerate(parts):
        off = k * gpn
        links += [dict(l, src=l["src"] + off, dst=l["dst"] + off) for l in part["links"]]
        if part["switch_ports"]:
            switches.append({"name": "nvswitch" if len(nodes) == 1 else f"nvswitch@node{k}",
                             "alpha_us": NVLINK_ALPHA_US,
                             "ports": [dict(p, ranks=[r + off for r in p["ranks"]]) for p in part["switch_ports"]]})
        for nic in part["nics"]:
            net_ports.append({"ranks": [r + off for r in nic["ranks"]], "egress_GBps": nic["bw_GBps"],
                              "ingress_GBps": nic["bw_GBps"]})
    if len(nodes) > 1:
        missing = [node.source for node, part in zip(nodes, parts) if not part["nics"]]
        if missing:
            raise InputError(missing[0], "nic", "has no network device, so the nodes cannot be joined")
        alpha = max(nic["alpha_us"] for part in parts for nic in part["nics"])
        switches.append({"name": "network", "alpha_us": alpha, "ports": net_ports})
    gens = sorted({f"sm{g.sm}" for node in nodes for g in node.gpus})
    desc = (f"imported from NCCL topology dump{'s' if len(nodes) > 1 else ''} "
            f"{', '.join(p.name for p in paths[:4])}{' ...' if len(paths) > 4 else ''}: "
            f"{len(nodes)} node(s) of {gpn} GPUs ({', '.join(gens)})")
    out = {"format": FORMAT, "name": base if len(nodes) == 1 else f"{base}x{len(nodes)}", "description": desc,
           "ranks": total, "gpus_per_node": gpn, "links": links, "switches": switches, "nics": parts[0]["nics"]}
    return out
