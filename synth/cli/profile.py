"""``synth profile``: fit link latency/bandwidth from nccl-tests output, or measure them with torch.distributed."""

from __future__ import annotations

import json

import click

from synth.cli._common import SynthGroup, echo_err
from synth.model.topology import MAX_RANKS

MAX_PROFILE_SIZES = 64         # message sizes per pair; each costs --iters round trips


@click.group(cls=SynthGroup)
def profile():
    """Fit or measure link latency (us) and bandwidth (GB/s)."""


@profile.command("fit")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--test", type=click.Choice(["auto", "sendrecv", "all_reduce", "all_gather", "reduce_scatter",
                                           "alltoall"]), default="auto", show_default=True,
              help="Which nccl-tests binary wrote the files (auto: from the output, the file name or the table).")
@click.option("--ranks", type=click.IntRange(2, MAX_RANKS), default=None,
              help="Ranks of the run, checked against the table (default: the '#  Rank' lines or the table).")
@click.option("--min-bytes", type=str, default=None, help="Ignore rows below this size (e.g. 64KB).")
@click.option("--max-bytes", type=str, default=None, help="Ignore rows above this size (e.g. 1GB).")
@click.option("--json", "as_json", is_flag=True, help="Print the fits as JSON on stdout.")
def fit(files, test, ranks, min_bytes, max_bytes, as_json):
    """Fit alpha and bandwidth per link class, one class per nccl-tests output FILE (its name is the label).

    Each table is fitted to t = steps x alpha + busbw_factor x size / bw with nccl-tests' bus-bandwidth factor
    (sendrecv 1, all_reduce 2(n-1)/n, all_gather/reduce_scatter/alltoall (n-1)/n) and NCCL's latency steps
    (sendrecv 1, all_reduce 2(n-1), all_gather/reduce_scatter n-1, alltoall 1); each fit reports which sizes
    fed alpha and which the bandwidth, its residual, and warnings when it is implausible."""
    from backends.nccl.nccl_tests import describe_fit, fit_nccl_tests
    from synth.units import parse_size

    fits = fit_nccl_tests(files, test=None if test == "auto" else test, num_ranks=ranks,
                          min_bytes=parse_size(min_bytes, "--min-bytes") if min_bytes else 0,
                          max_bytes=parse_size(max_bytes, "--max-bytes") if max_bytes else None)
    for f in fits:
        for warning in f.warnings:
            echo_err(f"Warning: {f.label}: {warning}")
    if as_json:
        click.echo(json.dumps([f.to_dict() for f in fits], indent=1))
        return
    for f in fits:
        ranks_text = f", {f.num_ranks} ranks" if f.num_ranks else ""
        nodes_text = f" on {f.num_nodes} nodes" if f.num_nodes and f.num_nodes > 1 else ""
        what = "bus bandwidth" if f.num_nodes and f.num_nodes > 1 else "bandwidth"
        click.echo(f"{f.label}: {f.test}{ranks_text}{nodes_text}, {f.samples} samples: alpha {f.alpha_us:.3g} us, "
                   f"{what} {f.bw_GBps:.4g} GB/s (relative RMS error {100 * f.rel_rms_error:.1f}%)")
        for line in describe_fit(f):
            click.echo(line)


@profile.command("run")
@click.option("--nprocs", type=click.IntRange(min=2, max=64), required=True, help="Local processes (ranks).")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True,
              help="auto: nccl when there are --nprocs GPUs, else gloo on CPU.")
@click.option("--sizes", default="1KB,4KB,16KB,64KB,256KB,1MB,4MB,16MB", show_default=True,
              help="Comma-separated message sizes.")
@click.option("--iters", type=click.IntRange(min=1, max=1000), default=10, show_default=True,
              help="Timed round trips per pair and size (the fastest is kept).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Topology JSON to write.")
@click.option("--name", default=None, help="Topology name.")
@click.option("--json", "as_json", is_flag=True, help="Print every pair's measurements and fit as JSON on stdout.")
def run(nprocs, backend, sizes, iters, output, name, as_json):
    """Measure latency and bandwidth between every pair of NPROCS local ranks and write a profiled topology."""
    from synth.runtime.p2p_profile import profile_pairs
    from synth.runtime.launch import require_torch
    from synth.units import parse_size
    from synth.errors import InputError
    from synth.fileio import OutputPlan

    outputs = OutputPlan()
    outputs.declare("-o", output)
    size_list = [parse_size(s.strip(), "--sizes") for s in sizes.split(",") if s.strip()]
    if not size_list or len(size_list) > MAX_PROFILE_SIZES:
        raise InputError("--sizes", "", f"give 1..{MAX_PROFILE_SIZES} comma-separated sizes, got {len(size_list)}")
    require_torch("synth profile run")
    result = profile_pairs(nprocs, backend, size_list, iters)
    outputs.stage("-o", json.dumps(result.topology_dict(name), indent=1) + "\n")
    outputs.commit()
    for p in result.pairs:
        echo_err(f"  {p.a} <-> {p.b}: alpha {p.alpha_us:.3g} us, bandwidth {p.bw_GBps:.4g} GB/s "
                 f"(relative RMS error {100 * p.rel_rms_error:.1f}%)")
    echo_err(f"wrote {output}: {nprocs} ranks measured with {result.backend}")
    if as_json:
        click.echo(json.dumps({"backend": result.backend, "pairs": [p.to_dict() for p in result.pairs]}, indent=1))
