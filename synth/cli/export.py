"""``synth export``: write schedules in other tools' formats (NCCL graph files)."""

from __future__ import annotations

import click

from synth.cli._common import SynthGroup, echo_err


@click.group(cls=SynthGroup)
def export():
    """Export schedules for other runtimes."""


@export.command("nccl-graph")
@click.argument("schedule_file", metavar="SCHEDULE.json", type=click.Path(dir_okay=False))
@click.option("--topology", "topology_name", required=True, help="Built-in topology name or JSON file.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Compose this many copies of the topology through their NICs.")
@click.option("--typeintra", type=click.Choice(["NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"]), default="NVL",
              show_default=True, help="Path type NCCL assumes inside a node (NVL: NVLink; PIX..SYS: PCIe).")
@click.option("--typeinter", type=click.Choice(["PIX", "PXB", "PXN", "PHB", "SYS", "NET"]), default="PIX",
              show_default=True, help="Path type between a GPU and its NIC.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the graph XML here (default: print it). Use it with NCCL_GRAPH_FILE.")
def nccl_graph(schedule_file, topology_name, nodes, typeintra, typeinter, output):
    """Write a ring-shaped schedule (JSON from synth solve --schedule-out or a baseline) as an NCCL graph file,
    one channel per ring. Schedules that are not rings are refused with the reason."""
    from backends.nccl.graph_export import export_nccl_graph, find_rings
    from synth.schedule.ir import load_schedule
    from synth.model.topology import load_topology
    from synth.fileio import write_atomic

    schedule = load_schedule(schedule_file)
    topology = load_topology(topology_name, nodes)
    text = export_nccl_graph(schedule, topology, typeintra, typeinter)
    if output is None:
        click.echo(text, nl=False)
        return
    write_atomic(output, text)
    echo_err(f"wrote {output}: {len(find_rings(schedule))} channel(s) for {topology.num_ranks} ranks "
             f"({topology.num_nodes} node(s)); use it with NCCL_GRAPH_FILE={output}")
