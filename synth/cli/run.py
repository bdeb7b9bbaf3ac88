"""``synth run``: execute an MSCCL XML file on real local processes with torch.distributed and check it."""

from __future__ import annotations

import json

import click

from synth.cli._common import MAX_TIME_LIMIT_S, FiniteFloat


@click.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--nprocs", type=click.IntRange(min=1, max=64), default=None,
              help="Processes to start (default: the file's ngpus; must equal it).")
@click.option("--backend", type=click.Choice(["gloo"]), default="gloo", show_default=True,
              help="torch.distributed backend (gloo runs on CPU).")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True,
              help="Seed of the random inputs.")
@click.option("--chunk-elements", type=click.IntRange(min=1, max=4096), default=16, show_default=True,
              help="float64 values per chunk.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(1.0, MAX_TIME_LIMIT_S), default=60.0, show_default=True,
              help="Seconds a receive or dependency may wait before the run is declared stuck.")
@click.option("--root", type=click.IntRange(0, 63), default=0, show_default=True,
              help="Root rank of broadcast/reduce/gather/scatter programs.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON on stdout.")
def run(file, nprocs, backend, seed, chunk_elements, timeout_s, root, as_json):
    """Run every algorithm in FILE (MSCCL XML) on NPROCS processes and compare each rank's output with the
    collective computed by torch from the same inputs. Exit 1 with an Error line naming the rank and chunk
    when any output is wrong, a message never arrives or the file cannot run."""
    from synth.runtime.torch_run import raise_on_failure, run_msccl_file
    from synth.runtime.launch import require_torch
    from synth.cli._common import echo_err

    require_torch("synth run")
    reports = run_msccl_file(file, nprocs, backend=backend, seed=seed, chunk_elements=chunk_elements,
                             timeout_s=timeout_s, root=root)
    for report in reports:
        echo_err(report.summary())
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in reports], indent=1))
    raise_on_failure(reports)
