"""``synth bounds`` (the physical limit of a collective) and ``synth baseline`` (NCCL-style schedules)."""

from __future__ import annotations

import json

import click

from synth.errors import InputError
from synth.units import format_size, parse_size
from synth.fileio import OutputPlan
from synth.cli._common import MAX_CHUNKS, check_root, echo_err, nodes_option
from synth.model.topology import MAX_RANKS

_SIZE_HELP = "nccl-tests' size (e.g. 1GB = 2**30 bytes, or a byte count such as 1000000000)."


def _topology_options(func):
    options = [
        click.option("--topology", "-t", "topology_name", required=True,
                     help="Built-in topology name or JSON file."),
        nodes_option("Compose this many copies joined through their NICs."),
        click.option("--size", "size_text", required=True, help=_SIZE_HELP),
        click.option("--root", type=click.IntRange(0, MAX_RANKS - 1), default=None,
                     help="Root rank of broadcast, reduce, gather, scatter (default 0)."),
        click.option("--json", "as_json", is_flag=True, help="Print a JSON object on stdout."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command("bounds")
@click.argument("collective")
@_topology_options
@click.option("--chunks", type=click.IntRange(1, MAX_CHUNKS), default=1, show_default=True,
              help="Chunks per rank, for the store-and-forward path of one chunk.")
def bounds(collective, topology_name, nodes, fabric, oversubscription, size_text, root, as_json, chunks):
    """Lower bounds on COLLECTIVE's time: bandwidth (max-flow / LP), latency (alpha diameter, direct bound) and,
    across nodes, the crossing bound (what must leave a node through its NIC ports)."""
    from synth.bounds.physical import lower_bound
    from synth.model.topology import load_topology

    check_root(collective, root)
    size = parse_size(size_text)
    topo = load_topology(topology_name, nodes, fabric, oversubscription)
    b = lower_bound(collective, topo, size, chunks, root)
    if as_json:
        click.echo(json.dumps(b.to_dict(), indent=1))
        return
    echo_err(f"{b.collective} {format_size(size)} ({size} bytes) on {topo.name} ({topo.num_ranks} ranks)")
    echo_err(f"  bandwidth bound  {b.bandwidth_us:14.3f} us  ({b.method})")
    echo_err(f"  latency bound    {b.latency_us:14.3f} us  (alpha diameter, {b.hops} hops)")
    if b.direct_us > b.latency_us:
        echo_err(f"  direct bound     {b.direct_us:14.3f} us  (what cannot be relayed in time, queued on shared "
                 f"links and ports)")
    drained = b.drain_us > b.bandwidth_us and b.drain_us >= max(b.direct_us, b.crossing_us)
    if drained:
        echo_err(f"  drain bound      {b.drain_us:14.3f} us  (the bandwidth bound plus the alpha the last byte "
                 f"still travels)")
    crossing = b.limit_source == "crossing"
    if crossing:
        echo_err(f"  crossing bound   {b.crossing_us:14.3f} us  (what must leave a node through its NIC ports, "
                 f"summed and fanned out as time allows)")
    gives = "bandwidth binds, with the last byte's alpha" if drained else f"{b.binding} binds"
    if crossing:     # at large sizes the crossing bound is the bandwidth bound plus a crossing's latency
        gives = "bandwidth binds, with the crossing bound's latency" if b.binding == "bandwidth" else \
            "the crossing bound gives it"
    echo_err(f"  limit            {b.limit_us:14.3f} us  ({gives}; algbw {b.algbw_GBps:.3f} GB/s)")
    echo_err(f"  one-chunk path   {b.chunk_path_us:14.3f} us  (store-and-forward, {chunks} chunk(s) per rank)")


@click.command("baseline")
@click.argument("name")
@click.argument("collective")
@_topology_options
@click.option("--chunks", type=click.IntRange(1, MAX_CHUNKS), default=1, show_default=True,
              help="Chunks per rank per ring or tree (pipelining); ignored by NAME 'best', which tries 1, 2, 4.")
@click.option("-o", "--output", "xml_out", type=click.Path(dir_okay=False), default=None,
              help="Write the schedule as MSCCL XML, lowered with the topology and checked like `synth check`.")
@click.option("--target", type=click.Choice(["executor", "legacy"]), default="executor", show_default=True,
              help="MSCCL runtime the XML (and NAME 'best') must fit: the executor in NCCL >= 2.23, or the "
                   "legacy MSCCL fork.")
@click.option("--schedule-out", type=click.Path(dir_okay=False), default=None,
              help="Write the schedule as synth JSON.")
def baseline(name, collective, topology_name, nodes, fabric, oversubscription, size_text, root, as_json, chunks,
             xml_out, target, schedule_out):
    """Build, verify and time baseline NAME for COLLECTIVE; NAME 'best' picks the fastest that applies.

    Baselines: ring, bidir-ring, multi-ring, double-binary-tree, recursive-doubling,
    recursive-halving-doubling, hierarchical, all-pairs.
    """
    outputs = OutputPlan()
    outputs.declare("-o", xml_out)
    outputs.declare("--schedule-out", schedule_out)
    check_root(collective, root)
    size = parse_size(size_text)
    from synth.synthesis.baselines import BASELINES, best_baseline, build_baseline   # after the cheap checks
    from synth.bounds.physical import lower_bound
    from synth.schedule.costmodel import algbw_GBps
    from synth.schedule.replay import verify
    from synth.model.topology import load_topology

    if name != "best" and name not in BASELINES:
        raise InputError("NAME", "", f"unknown baseline {name!r}; choose best or one of {', '.join(BASELINES)}")
    topo = load_topology(topology_name, nodes, fabric, oversubscription)
    emitted = None
    if name == "best" and xml_out:
        name, schedule, report, emitted = _best_written(collective, topo, size, root, target)
    elif name == "best":
        best = best_baseline(collective, topo, size, root)
        name, schedule, report = best.name, best.schedule, best.report
    else:
        schedule = build_baseline(name, collective, topo, chunks, root, order_bytes=size)
        report = verify(schedule, topo, size)
    bound = lower_bound(schedule.collective.name, topo, size, schedule.collective.chunks_per_rank, root)
    time_us = report.time_us
    if xml_out:
        from backends.msccl.writer import emit_verified_xml

        emitted = emitted or emit_verified_xml(schedule, topo, target, size)
        outputs.stage("-o", emitted.text)
        time_us = emitted.simulated_us     # the file, as the runtime would run it, is the figure we report
    if schedule_out:
        outputs.stage("--schedule-out", schedule.to_json() + "\n")
    outputs.commit()
    summary = {"baseline": name, "collective": schedule.collective.name, "topology": topo.name,
               "ranks": topo.num_ranks, "size_bytes": size,
               "chunks_per_rank": schedule.collective.chunks_per_rank, "steps": schedule.steps,
               "transfers": len(schedule.transfers), "time_us": time_us, "plan_time_us": report.time_us,
               "timed_by": "simulated file" if xml_out else "replay",
               "algbw_GBps": algbw_GBps(size, time_us),
               "busbw_GBps": algbw_GBps(size, time_us) * schedule.collective.busbw_factor(),
               "limit_us": bound.limit_us,
               "fraction_of_limit": bound.limit_us / time_us if time_us > 0 else 1.0}
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    timed = f"file simulated {time_us:.3f} us (plan {report.time_us:.3f} us)" if xml_out else f"{time_us:.3f} us"
    echo_err(f"{name} {summary['collective']} {format_size(size)} on {topo.name}: {timed}, "
             f"algbw {summary['algbw_GBps']:.3f} GB/s, busbw {summary['busbw_GBps']:.3f} GB/s, "
             f"{summary['fraction_of_limit']:.1%} of the limit ({bound.limit_us:.3f} us); "
             f"{len(schedule.transfers)} transfers in {schedule.steps} steps")


def _best_written(collective, topo, size, root, target):
    """The fastest baseline (1, 2 or 4 chunks per rank) that the runtime selects at power-of-two sizes and whose
    XML fits its limits: ``(name, schedule, report, emitted)``."""
    from backends.msccl.writer import emit_first_accepted
    from synth.synthesis.baselines import evaluate_baselines

    table = evaluate_baselines(collective, topo, size, root)
    table.best(runnable_only=True)     # raises, naming why, when no baseline runs at power-of-two sizes
    ranked = sorted((run for run in table.runs if run.runnable), key=lambda run: run.report.time_us)
    emitted = emit_first_accepted([run.schedule for run in ranked], topo, target, size)
    run = ranked[emitted.candidate]
    return run.name, run.schedule, run.report, emitted
