"""``synth solve``: synthesize a verified algorithm for one collective on one topology."""

from __future__ import annotations

import json

import click

from ..collectives import COLLECTIVES, make_collective, normalize_name
from ..errors import InfeasibleError, InputError
from ..execute import verify
from ..report import compare_with_limits
from ..fileio import write_atomic
from ..solve import SolverOptions
from ..synthesize import SynthesisResult, smallest_steps, synthesize_steps
from ..topology import check_connected, load_topology
from ..units import format_size, parse_size
from ._common import echo_err, solver_options


def _search_rounds(topology, name, steps, chunks, root, options, max_rounds, progress):
    """Fewest rounds (from ``steps`` up) for which a schedule exists; each probe is one small MILP."""
    last_error = None
    for rounds in range(steps, max_rounds + 1):
        progress(f"  trying steps={steps} rounds={rounds} chunks={chunks}")
        try:
            return synthesize_steps(topology, name, steps, rounds, chunks, root, options)
        except InfeasibleError as exc:
            last_error = exc
    raise InfeasibleError(f"no schedule with {steps} steps, up to {max_rounds} rounds and {chunks} chunk(s) per "
                          f"rank ({last_error}); give --steps/--rounds explicitly")


def find_schedule(topology, name, size_bytes, steps, rounds, chunks, root, options, progress,
                  include_baselines=False):
    """Solve the given (steps, rounds, chunks), or search the ones left open for the fastest at this size
    (with ``include_baselines``, NCCL-style baselines compete too)."""
    check_connected(topology)
    if steps is not None and rounds is not None:
        result = synthesize_steps(topology, name, steps, rounds, chunks or 1, root, options)
        return result, verify(result.schedule, topology, size_bytes)
    best = None
    for c in ([chunks] if chunks else [1, 2, 4]):
        if not chunks and not make_collective(name, topology.num_ranks, c, root).runs_at_power_of_two_sizes:
            continue  # the runtime would never select it at power-of-two sizes
        s = steps if steps is not None else smallest_steps(topology, name, c, root)
        if name == "allreduce" and s % 2:
            s += 1
        max_rounds = rounds if rounds is not None else s + 2 * topology.num_ranks * c
        start = rounds if rounds is not None else s
        try:
            result = _search_rounds(topology, name, s, c, root, options, max_rounds, progress) \
                if start == s or rounds is None else synthesize_steps(topology, name, s, start, c, root, options)
        except InfeasibleError:
            if chunks:
                raise
            continue
        report = verify(result.schedule, topology, size_bytes)
        progress(f"  found steps={result.steps} rounds={result.rounds} chunks={c}: {report.time_us:.2f} us")
        if best is None or report.time_us < best[1].time_us:
            best = (result, report)
    if include_baselines:
        best = _maybe_baseline(topology, name, size_bytes, root, best, progress)
    if best is None:
        raise InfeasibleError("no schedule found for the searched (steps, rounds, chunks); give them explicitly")
    return best


def _maybe_baseline(topology, name, size_bytes, root, best, progress):
    """Let NCCL-style baselines compete: the user gets the fastest verified schedule, never a slower one."""
    from ..baselines import best_baseline

    try:
        base_name, schedule, report = best_baseline(name, topology, size_bytes, root=root, runnable_only=True)
    except InputError:
        return best
    if best is not None and best[1].time_us <= report.time_us:
        return best
    progress(f"  baseline {base_name} is faster ({report.time_us:.2f} us): using it")
    chunks = schedule.collective.chunks_per_rank
    result = SynthesisResult(schedule, "baseline", 0.0, None, 1, schedule.steps, schedule.rounds, chunks)
    return result, verify(schedule, topology, size_bytes)


@click.command()
@click.argument("collective", type=click.Choice(COLLECTIVES + ("reduce_scatter",), case_sensitive=False),
                metavar="COLLECTIVE")
@click.option("--topology", "-t", required=True, help="Built-in topology name (see `synth topo list`) or JSON file.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Compose this many copies of a single-node topology through their NICs.")
@click.option("--size", default="1MB", show_default=True,
              help="Per-rank buffer size as nccl-tests prints it (e.g. 64KB, 1MB, 1GB); sets the predicted time.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Steps S (default: the hop lower bound).")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Total rounds R (default: the fewest that are feasible).")
@click.option("--chunks", type=click.IntRange(min=1), default=None,
              help="Chunks per rank C (default: the faster of 1 and 2 at --size).")
@click.option("--root", type=click.IntRange(min=0), default=None, help="Root rank for rooted collectives (default 0).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write MSCCL XML here.")
@click.option("--schedule-out", type=click.Path(dir_okay=False), default=None, help="Write the schedule JSON here.")
@click.option("--target", type=click.Choice(["executor", "legacy"]), default="executor", show_default=True,
              help="MSCCL runtime: the executor in NCCL >= 2.23, or the legacy MSCCL fork.")
@click.option("--proto", type=click.Choice(["Simple", "LL", "LL128"]), default="Simple", show_default=True,
              help="NCCL protocol written into the XML.")
@click.option("--min-bytes", type=click.IntRange(min=0), default=0, show_default=True,
              help="Smallest buffer (bytes) for which the runtime picks this algorithm.")
@click.option("--max-bytes", type=click.IntRange(min=1), default=1 << 40, show_default=True,
              help="Largest buffer (bytes) for which the runtime picks this algorithm.")
@click.option("--write-model", type=click.Path(dir_okay=False), default=None,
              help="Also write the MILP as an LP/MPS file (by extension) for other solvers.")
@click.option("--no-baseline", is_flag=True,
              help="Skip NCCL-style baselines (by default they compete when S/R/C are left open, and every "
                   "report compares with the best one).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@solver_options
def solve(collective, topology, nodes, size, steps, rounds, chunks, root, output, schedule_out, target, proto,
          min_bytes, max_bytes, write_model, no_baseline, as_json, time_limit, mip_gap, threads, seed):
    """Synthesize COLLECTIVE on a topology, verify it by replay, and write MSCCL XML.

    \b
    Examples:
      synth solve allgather --topology dgx1 -o allgather.xml
      synth solve allgather --topology dgx1 --steps 3 --rounds 7 --chunks 6 --json
      synth solve allreduce --topology ndv2 --nodes 2 --size 64MB -o ar.xml
    """
    name = normalize_name(collective)
    size_bytes = parse_size(size)
    if min_bytes > max_bytes:
        raise InputError("--min-bytes", "", f"{min_bytes} is larger than --max-bytes {max_bytes}")
    topo = load_topology(topology, nodes)
    options = SolverOptions(time_limit_s=time_limit, mip_gap=mip_gap, threads=threads, seed=seed)
    echo_err(f"synth: {name} on {topo.name} ({topo.num_ranks} ranks), size {format_size(size_bytes)}")
    result, report = find_schedule(topo, name, size_bytes, steps, rounds, chunks, root, options, echo_err,
                                   include_baselines=not no_baseline)
    schedule = result.schedule

    texts = {}
    if output:
        from ..emit import emit_verified_xml

        emitted = emit_verified_xml(schedule, target=target, topology=topo, size_bytes=size_bytes, proto=proto,
                                    min_bytes=min_bytes, max_bytes=max_bytes)
        texts[output] = emitted.text
        if not schedule.collective.runs_at_power_of_two_sizes:
            echo_err(f"warning: nchunksperloop {schedule.collective.loop_chunks} is not a power of two, so the "
                     "MSCCL runtime skips this algorithm at power-of-two sizes; prefer --chunks that make it one")
        echo_err(f"MSCCL program executed and verified: {emitted.threadblocks} threadblocks, {emitted.channels} "
                 f"channel(s), {'fused' if emitted.fused else 'plain'} lowering, simulated "
                 f"{emitted.simulated_us:.3f} us with the runtime's FIFO depth")
    if schedule_out:
        texts[schedule_out] = schedule.to_json() + "\n"
    if write_model:
        from ..encode.steps import encode_steps
        from ..solve import write_model as export_model

        if schedule.collective.combining:
            raise InputError("--write-model", "", "model export covers non-combining collectives (combining ones "
                             "are solved as reversals); export the Allgather/Broadcast model instead")
        export_model(encode_steps(topo, schedule.collective, result.steps, result.rounds).model, write_model)
    for path, text in texts.items():
        write_atomic(path, text)

    context = compare_with_limits(name, topo, size_bytes, report.time_us, root, not no_baseline)
    echo_err(f"status {result.status}, solve {result.solve_seconds:.3f} s (symmetry group of {result.symmetry_order}), "
             f"steps {result.steps}, rounds {result.rounds}, chunks {result.chunks}")
    echo_err(f"predicted time {report.time_us:.3f} us, algbw {report.algbw_GBps:.3f} GB/s, "
             f"busbw {report.busbw_GBps:.3f} GB/s (alpha-beta replay, verified)")
    echo_err(context.summary())
    for path in texts:
        echo_err(f"wrote {path}")
    if as_json:
        click.echo(json.dumps({
            "status": result.status, "solve_seconds": result.solve_seconds, "gap": result.gap,
            "predicted_time_us": report.time_us, "algbw_GBps": report.algbw_GBps, "busbw_GBps": report.busbw_GBps,
            "steps": result.steps, "rounds": result.rounds, "chunks": result.chunks,
            "collective": name, "topology": topo.name, "ranks": topo.num_ranks, "size_bytes": size_bytes,
            "symmetry_order": result.symmetry_order, "output": output, "schedule_output": schedule_out,
            "target": target, **context.to_dict(),
        }, indent=1))
