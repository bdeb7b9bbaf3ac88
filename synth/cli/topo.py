"""``synth topo``: list, show (and import) topologies."""

from __future__ import annotations

import json
import re

import click

from synth.model.symmetry import free_symmetry_group
from synth.model.topology import builtin_names, load_topology
from synth.cli._common import SynthGroup, nodes_option


@click.group(cls=SynthGroup)
def topo():
    """List, inspect and import topologies."""


@topo.command("list")
def list_topologies():
    """List the built-in topologies (plus the ring-N and fully-connected-N families)."""
    for name in builtin_names():
        t = load_topology(name)
        click.echo(f"{name:18s} {t.num_ranks:3d} ranks  {t.num_nodes} node(s)  {t.description}")
    click.echo(f"{'ring-N':18s}   N ranks  1 node(s)  bidirectional ring, 25 GB/s, 0.7 us")
    click.echo(f"{'fully-connected-N':18s}   N ranks  1 node(s)  every pair linked, 25 GB/s, 0.7 us")


@topo.command("show")
@click.argument("topology")
@nodes_option("Compose this many copies joined through their NICs.")
@click.option("--json", "as_json", is_flag=True, help="Print the topology in the JSON file format.")
def show(topology, nodes, fabric, oversubscription, as_json):
    """Show a topology given by built-in NAME or JSON FILE."""
    t = load_topology(topology, nodes, fabric, oversubscription)
    if as_json:
        click.echo(json.dumps(t.to_dict(), indent=1))
        return
    click.echo(f"{t.name}: {t.num_ranks} ranks, {t.num_nodes} node(s) of {t.gpus_per_node} ({t.source})")
    if t.description:
        click.echo(f"  {t.description}")
    click.echo(f"  {t.sms_per_gpu} SMs per GPU (at most that many threadblocks per GPU)" if t.sms_per_gpu
               else "  SMs per GPU unknown (add sms_per_gpu to bound threadblocks per GPU)")
    direct = list(t.direct_links())
    click.echo(f"  {len(direct)} direct links, {len(t.links) - len(direct)} links through switches")
    for l in direct[:_LISTED] if t.num_nodes > 1 else direct:
        click.echo(f"    {l.src:3d} -> {l.dst:3d}  lanes {l.lanes}  {l.bw_GBps:g} GB/s per lane  alpha {l.alpha_us:g} us")
    if t.num_nodes > 1 and len(direct) > _LISTED:
        click.echo(f"    ... (the node's {len(direct) // t.num_nodes} direct links in each of the {t.num_nodes} nodes)")
    for names, sw in _switch_groups(t.switches):
        shown = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)} switches alike)"
        if len(sw.ports) <= _LISTED:
            ports = ", ".join(f"{p.switch or list(p.ranks)}:{p.egress_GBps:g}/{p.ingress_GBps:g}" for p in sw.ports)
        else:
            sizes = sorted({len(p.ranks) for p in sw.ports})
            speeds = sorted({f"{p.egress_GBps:g}/{p.ingress_GBps:g}" for p in sw.ports})
            ports = f"{len(sw.ports)} ports of {'/'.join(map(str, sizes))} rank(s), {' or '.join(speeds)}"
        click.echo(f"  switch {shown} (alpha {sw.alpha_us:g} us) ports {'leaf' if sw.is_spine else 'ranks'}:"
                   f"egress/ingress GB/s: {ports}")
    for l in _sample_paths(t):
        via = " -> ".join(f"{u.switch}[{u.port}] {u.direction}" for u in l.ports) or "a direct link"
        click.echo(f"  path {l.src} -> {l.dst}: {l.bw_GBps:g} GB/s, alpha {l.alpha_us:g} us via {via}")
    for nic in t.nics:
        click.echo(f"  NIC for local ranks {list(nic.ranks)}: {nic.bw_GBps:g} GB/s, alpha {nic.alpha_us:g} us")
    group = free_symmetry_group(t)
    click.echo(f"  symmetry: {len(group)} rank permutations acting freely")


_LISTED = 16   # a composed machine lists this many direct links and switch ports; beyond, it summarises


def _switch_groups(switches):
    """Runs of switches that differ only in their name's number (a switch per node, a leaf per rail) and port
    ranks: one line each."""
    groups: list[tuple[tuple, list[str], object]] = []
    for sw in switches:
        shape = (re.sub(r"\d+", "#", sw.name), sw.alpha_us,
                 tuple((len(p.ranks), p.egress_GBps, p.ingress_GBps, bool(p.switch)) for p in sw.ports))
        if groups and groups[-1][0] == shape:
            groups[-1][1].append(sw.name)
        else:
            groups.append((shape, [sw.name], sw))
    return [(names, sw) for _, names, sw in groups]


def _sample_paths(t):
    """Through a composed fabric, one link of each kind from rank 0: inside its node, to its own NIC's peer in
    the next node, and to the next NIC's rank in the next node (across rails on a rail fabric)."""
    if t.num_nodes == 1 or not t.nics:
        return []
    g = t.gpus_per_node
    first, other = t.nics[0].ranks[0], (t.nics[1].ranks[0] if len(t.nics) > 1 else None)
    pairs = [(first, first + 1), (first, g + first)] + ([(first, g + other)] if other is not None else [])
    return [t.link(a, b) for a, b in pairs if t.link(a, b) is not None]


@topo.command("import-nccl")
@click.argument("dumps", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the topology JSON here (default: print it).")
@click.option("--name", default=None, help="Topology name (default: the first dump's file name).")
def import_nccl(dumps, output, name):
    """Import NCCL topology dumps (NCCL_TOPO_DUMP_FILE), one per node, as a topology JSON file."""
    from backends.nccl.topo_import import read_nccl_dumps
    from synth.model.topology import topology_from_dict
    from synth.fileio import OutputPlan
    from synth.cli._common import echo_err

    outputs = OutputPlan()
    outputs.declare("-o", output)
    result = read_nccl_dumps(list(dumps), name=name)
    t = topology_from_dict(result.topology, dumps[0])
    for warning in result.warnings:
        echo_err(f"Warning: {warning}")
    text = json.dumps(t.to_dict(), indent=1) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    outputs.stage("-o", text)
    outputs.commit()
    direct = sum(1 for l in t.links if l.switch is None)
    echo_err(f"wrote {output}: {t.num_ranks} ranks, {t.num_nodes} node(s), {direct} direct links, "
             f"{len(t.switches)} switch(es), {len(t.nics)} NIC(s) per node")
    for summary in result.nodes:
        echo_err(f"  {summary}")
