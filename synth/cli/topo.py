"""``synth topo``: list, show (and import) topologies."""

from __future__ import annotations

import json

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
def show(topology, nodes, as_json):
    """Show a topology given by built-in NAME or JSON FILE."""
    t = load_topology(topology, nodes)
    if as_json:
        click.echo(json.dumps(t.to_dict(), indent=1))
        return
    click.echo(f"{t.name}: {t.num_ranks} ranks, {t.num_nodes} node(s) of {t.gpus_per_node} ({t.source})")
    if t.description:
        click.echo(f"  {t.description}")
    click.echo(f"  {t.sms_per_gpu} SMs per GPU (at most that many threadblocks per GPU)" if t.sms_per_gpu
               else "  SMs per GPU unknown (add sms_per_gpu to bound threadblocks per GPU)")
    direct = [l for l in t.links if l.switch is None]
    click.echo(f"  {len(direct)} direct links, {len(t.links) - len(direct)} links through switches")
    for l in direct:
        click.echo(f"    {l.src:3d} -> {l.dst:3d}  lanes {l.lanes}  {l.bw_GBps:g} GB/s per lane  alpha {l.alpha_us:g} us")
    for sw in t.switches:
        ports = ", ".join(f"{list(p.ranks)}:{p.egress_GBps:g}/{p.ingress_GBps:g}" for p in sw.ports)
        click.echo(f"  switch {sw.name} (alpha {sw.alpha_us:g} us) ports ranks:egress/ingress GB/s: {ports}")
    for nic in t.nics:
        click.echo(f"  NIC for local ranks {list(nic.ranks)}: {nic.bw_GBps:g} GB/s, alpha {nic.alpha_us:g} us")
    group = free_symmetry_group(t)
    click.echo(f"  symmetry: {len(group)} rank permutations acting freely")


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
