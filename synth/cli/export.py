"""``synth export``: write schedules in other tools' formats (NCCL graph files)."""

from __future__ import annotations

import click

from synth.cli._common import SynthGroup, echo_err, nodes_option


@click.group(cls=SynthGroup)
def export():
    """Export schedules for other runtimes."""


@export.command("nccl-graph")
@click.argument("schedule_file", metavar="SCHEDULE.json", type=click.Path(dir_okay=False))
@click.option("--topology", "topology_name", required=True, help="Built-in topology name or JSON file.")
@nodes_option("Compose this many copies of the topology through their NICs.")
@click.option("--typeintra", type=click.Choice(["auto", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"]),
              default="auto", show_default=True,
              help="NCCL's path type inside a node (auto: from the ring's links; NVL: NVLink; PIX..SYS: PCIe).")
@click.option("--typeinter", type=click.Choice(["auto", "PIX", "PXB", "PXN", "PHB", "SYS"]), default="auto",
              show_default=True,
              help="NCCL's path type between a GPU and its NIC (auto: from an imported dump's NICs, else PIX).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the graph XML here (default: print it). Use it with NCCL_GRAPH_FILE.")
def nccl_graph(schedule_file, topology_name, nodes, fabric, oversubscription, typeintra, typeinter, output):
    """Write a ring-shaped schedule (JSON from synth solve --schedule-out or a baseline) as an NCCL graph file,
    with the channel count and per-channel speed NCCL's own search would use. Schedules that are not rings are
    refused with the reason."""
    from backends.nccl.graph_export import graph_view, render_nccl_graph
    from synth.schedule.ir import check_schedule_fits, load_schedule
    from synth.model.topology import load_topology
    from synth.fileio import OutputPlan

    outputs = OutputPlan()
    outputs.declare("-o", output)
    schedule = load_schedule(schedule_file)
    topology = load_topology(topology_name, nodes, fabric, oversubscription)
    check_schedule_fits(schedule, topology, schedule_file)
    view = graph_view(schedule, topology, None if typeintra == "auto" else typeintra,
                      None if typeinter == "auto" else typeinter)
    text = render_nccl_graph(view)
    if output is None:
        click.echo(text, nl=False)
        return
    outputs.stage("-o", text)
    outputs.commit()
    echo_err(f"wrote {output}: {len(view.channels)} channel(s) at {view.speedintra} GB/s each, typeintra "
             f"{view.typeintra}, for {topology.num_ranks} ranks ({topology.num_nodes} node(s)); use it with "
             f"NCCL_GRAPH_FILE={output}")
