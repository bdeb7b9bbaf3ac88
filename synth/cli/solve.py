"""``synth solve``: synthesize a verified algorithm for one collective on one topology."""

from __future__ import annotations

import contextlib
import gc
import json
from pathlib import Path

import click

from synth.cli._common import (MAX_CHUNKS, MAX_ROUNDS, MAX_STEPS, check_root, check_workers, echo_err, hard_stop,
                               nodes_option, solver_options_for, workers_options)
from synth.cli._progress import ProgressLog
from synth.errors import InputError, NoSolutionError
from synth.fileio import OutputPlan
from synth.model.collectives import COLLECTIVES, normalize_name
from synth.solver.deadline import Deadline, DeadlinePassed, grace_s
from synth.synthesis.method import METHODS
from synth.units import format_size, parse_size

# --time-limit bounds the whole command, not one solver call: by default five minutes, what a user waits for a
# cluster's plan (the target for 256 GPUs).
SOLVE_TIME_LIMIT_S = 300.0


@contextlib.contextmanager
def _collector_paused():
    """The cyclic garbage collector paused (as it was before, after)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _set_up_frozen():
    """What exists when the search starts (modules, the topology, the request) lives to its end: frozen
    (:func:`gc.freeze`), it is not walked again by the cyclic collector's full passes (which found nothing in it and
    took 0.2-0.4 s of a 5 s dgx1 1 GB solve), nor are its pages copied by forked workers. Unfrozen after, so that a
    process running commands one after another (the tests) still collects what becomes garbage."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@click.command()
@click.argument("collective", type=click.Choice(COLLECTIVES + ("reduce_scatter",), case_sensitive=False),
                metavar="COLLECTIVE")
@click.option("--topology", "-t", required=True, help="Built-in topology name (see `synth topo list`) or JSON file.")
@nodes_option("Compose this many copies of a single-node topology through their NICs.")
@click.option("--size", default="1MB", show_default=True,
              help="Per-rank buffer size as nccl-tests prints it (e.g. 64KB, 1MB, 1GB); sets the predicted time.")
@click.option("--method", type=click.Choice(METHODS), default="auto", show_default=True,
              help="steps: SCCL-style (S, R, C) MILP; routed/timexp: sketch-guided alpha-beta MILPs with "
                   "pipelining; trees: throughput-optimal tree packing (not Alltoall); auto: every applicable one "
                   "plus the baselines, the fastest simulated file wins.")
@click.option("--sketch", default=None,
              help="Communication sketch: built-in name (sketches/) or JSON file (ours or TACCL's).")
@click.option("--steps", type=click.IntRange(1, MAX_STEPS), default=None, help="Steps S (default: the hop lower bound).")
@click.option("--rounds", type=click.IntRange(1, MAX_ROUNDS), default=None,
              help="Total rounds R (default: the fewest that are feasible).")
@click.option("--chunks", type=click.IntRange(1, MAX_CHUNKS), default=None,
              help="Chunks per rank C (default: searched at --size).")
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
@workers_options("the writing of candidates", "Local worker processes that write candidates (lower, lint, execute, "
                 "simulate) at once; the file chosen is the same as with 1 (the default: here, one by one). Each "
                 "holds one candidate's program in memory: about 1 GB at 256 GPUs.")
@solver_options_for(SOLVE_TIME_LIMIT_S, time_limit_help="Wall-clock limit of the whole command in seconds: the "
                    "search gets the time left (HiGHS calls included) and the best verified plan found by then is "
                    "written, with status time-limit. With none verified by then, the file being written may take "
                    "10% longer (at least 10 s); then the command stops with exit code 3.")
def solve(collective, topology, nodes, fabric, oversubscription, size, method, sketch, steps, rounds, chunks, root,
          output, schedule_out,
          target, proto, min_bytes, max_bytes, write_model, no_baseline, as_json, workers, scheduler, time_limit,
          mip_gap, threads, seed):
    """Synthesize COLLECTIVE on a topology, verify it by replay, and write MSCCL XML.

    \b
    Examples:
      synth solve allgather --topology dgx1 -o allgather.xml
      synth solve allgather --topology dgx1 --steps 3 --rounds 7 --chunks 6 --json
      synth solve allgather --topology ndv2-2node-tecc --size 1GB --sketch ndv2-tecc-relay -o ag.xml
      synth solve allgather --topology dgx-h100 --nodes 8 --fabric rail --size 1GB --workers 2 -o ag.xml
    """
    deadline = Deadline.after(time_limit)           # the whole command, input checks and writing included
    # the set-up makes what lives to the end (modules, the topology, the request): the cyclic collector need not
    # walk it, now (a full pass while importing) or later (see _set_up_frozen)
    with _collector_paused():
        from synth.model.topology import load_topology
        from synth.solver.highs import SolverOptions, Status
        from synth.synthesis.parallel import open_executor
        from synth.synthesis.request import SynthesisRequest
        from synth.synthesis.solve import WRITER_PRELOAD, XmlRequest, solve as solve_request, step_model_text

        outputs = OutputPlan()
        outputs.declare("-o", output)
        outputs.declare("--schedule-out", schedule_out)
        outputs.declare("--write-model", write_model)
        if write_model and Path(write_model).suffix not in (".lp", ".mps"):
            raise InputError("--write-model", write_model, "give a file ending in .lp or .mps")
        check_workers(workers, scheduler)
        name = normalize_name(collective)
        check_root(name, root)
        size_bytes = parse_size(size)
        if min_bytes > max_bytes:
            raise InputError("--min-bytes", "", f"{min_bytes} is larger than --max-bytes {max_bytes}")
        topo = load_topology(topology, nodes, fabric, oversubscription)
        progress = ProgressLog(deadline)
        options = SolverOptions(time_limit_s=time_limit, mip_gap=mip_gap, threads=threads, seed=seed, progress=progress)
        request = SynthesisRequest(topo, name, size_bytes, root, method, sketch, steps, rounds, chunks, options,
                                   include_baselines=not no_baseline, target=target, deadline=deadline)
        gc.freeze()     # before the collector resumes: its first pass would walk all of it (see _set_up_frozen)
    echo_err(f"synth: {name} on {topo.name} ({topo.num_ranks} ranks), size {format_size(size_bytes)}, time limit "
             f"{time_limit:g} s")
    # a Dask scheduler is reached before any search; local workers start when the first candidate is written
    with _set_up_frozen(), open_executor(workers or 1, scheduler, WRITER_PRELOAD) as (executor, slots), progress:
        try:
            with hard_stop(deadline):
                solution = solve_request(request, XmlRequest(proto, min_bytes, max_bytes), progress, executor, slots)
        except DeadlinePassed:      # in the search, before any file: solve_request names the file otherwise
            raise NoSolutionError(f"the {time_limit:g} s time limit and {grace_s(deadline):g} s of grace ran out "
                                  f"in '{progress.phase}', before a plan could be written; nothing is written. "
                                  "Raise --time-limit") from None
    chosen = solution.chosen
    result, replay = chosen.candidate.result, chosen.candidate.report
    schedule = result.schedule
    emitted = solution.xml
    report = solution.report()
    if output:
        outputs.stage("-o", emitted.text)
        if not schedule.runs_at_power_of_two_sizes:
            echo_err(f"warning: nchunksperloop {schedule.loop_chunks} is not a power of two, so the "
                     "MSCCL runtime skips this algorithm at power-of-two sizes; prefer --chunks that make it one")
    if schedule_out:
        outputs.stage("--schedule-out", schedule.to_json() + "\n")
    if write_model:
        outputs.stage("--write-model", step_model_text(solution, Path(write_model).suffix))
    written = outputs.commit()

    if solution.honoured_slower_than_baseline:
        asked = f"--method {request.method}" if request.method != "auto" else "--steps/--rounds"
        own = sum(c.result.status != Status.BASELINE for c in solution.candidates)
        echo_err(f"chosen: {chosen.candidate.label} (fastest simulated of the {own} verified candidate(s) that "
                 f"{asked} allows)")
        echo_err(f"note: {asked} is honoured, but the runtime's own {solution.baseline.candidate.label} simulates "
                 f"faster ({solution.baseline.simulated_us:.3f} us against {chosen.simulated_us:.3f} us); leave "
                 f"{asked} out to let it compete")
    else:
        echo_err(f"chosen: {chosen.candidate.label} (fastest simulated of {len(solution.candidates)} verified "
                 "candidate(s))")
    if solution.fell_back_to_baseline:
        echo_err("note: the runtime's own choice (a baseline) simulates faster than every synthesized plan, so it "
                 "is the one written")
    if solution.sketch_broken:
        echo_err(f"note: the baseline written does not keep to the sketch ({solution.sketch_broken})")
    if solution.time_limited:
        echo_err(f"status time-limit: the {time_limit:g} s limit cut the search; the best verified plan found by "
                 f"then is the one written ({deadline.elapsed_s():.1f} s in all; raise --time-limit to search longer)")
    account = f"{'plan ' if solution.time_limited else ''}status {result.status}"
    if result.gap is not None and result.status != "optimal":
        account += f" (MIP gap {100 * result.gap:.2f}%)"
    shape = ", ".join(f"{k} {v}" for k, v in (("steps", result.steps), ("rounds", result.rounds),
                                                ("chunks", result.chunks)) if v is not None)
    echo_err(f"{account}, solve {result.solve_seconds:.3f} s (symmetry group of {result.symmetry_order}), {shape}")
    flows = " with fused flows" if emitted.lowering is not None and emitted.lowering.fused_flows else ""
    echo_err(f"MSCCL program executed and verified: {emitted.threadblocks} threadblocks, {emitted.channels} "
             f"channel(s), {'fused' if emitted.fused else 'plain'} lowering{flows} ({emitted.target})")
    echo_err(f"predicted time {report['predicted_time_us']:.3f} us (simulated with the runtime's FIFO depth; plan "
             f"{replay.time_us:.3f} us), algbw {report['algbw_GBps']:.3f} GB/s, busbw {report['busbw_GBps']:.3f} GB/s")
    echo_err(solution.comparison.summary())
    for path in written:
        echo_err(f"wrote {path}")
    if as_json:
        click.echo(json.dumps(dict(report, output=output, schedule_output=schedule_out), indent=1))
