"""``synth simulate``: time an MSCCL XML file (or a schedule.json, lowered first) on a topology at a size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from synth.errors import InputError
from synth.fileio import OutputPlan
from synth.model.topology import load_topology
from synth.units import format_size, parse_size
from synth.cli._common import MAX_REDUCE_US_PER_BYTE, FiniteFloat, echo_err, nodes_option

MAX_SHOWN_FINDINGS = 3


@click.command("simulate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--topology", "-t", "topology_name", required=True,
              help="Built-in topology NAME (see `synth topo list`) or a topology JSON FILE.")
@nodes_option()
@click.option("--size", default="1MB", show_default=True,
              help="nccl-tests size (the per-rank buffer), e.g. 64KB, 1MB, 1GB.")
@click.option("--reduce-us-per-byte", type=FiniteFloat(0.0, MAX_REDUCE_US_PER_BYTE), default=0.0, show_default=True,
              help="Reduction cost per byte at the reducing rank, microseconds.")
@click.option("--alpha-occupies", is_flag=True,
              help="Latency also occupies the link (TACCL's convention); default: latency overlaps.")
@click.option("--json", "as_json", is_flag=True, help="Print time_us, algbw_GBps, busbw_GBps, ... on stdout.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="Write a Chrome/Perfetto trace of the (first) algorithm: one track per rank/tb and per link.")
def simulate(file, topology_name, nodes, fabric, oversubscription, size, reduce_us_per_byte, alpha_occupies, as_json,
             trace_path):
    """Time the algorithm in FILE (MSCCL XML, or a synth schedule .json) on a topology at a size."""
    outputs = OutputPlan()
    outputs.declare("--trace", trace_path)
    size_bytes = parse_size(size)
    topology = load_topology(topology_name, nodes, fabric, oversubscription)
    programs = _load_programs(file, topology, size_bytes)
    from backends.msccl.interpret import execute_program       # after the inputs are checked: a refusal is fast
    from backends.msccl.simulate import simulate_program, trace_document

    results = []
    for program in programs:
        check = execute_program(program)
        report = simulate_program(program, topology, size_bytes, reduce_us_per_byte, alpha_occupies)
        results.append((program, check, report))
        _summarise(program, check, report)
    if trace_path:
        outputs.stage("--trace", json.dumps(trace_document(results[0][2])))
        outputs.commit()
        echo_err(f"wrote trace {trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
    if as_json:
        click.echo(json.dumps(_json_report(file, results), indent=1))


def _load_programs(file: str, topology, size_bytes: int) -> list:
    """MSCCL XML -> its programs; a schedule JSON -> the lead backend's lowering of it."""
    path = Path(file)
    if not os.path.isfile(path):      # os.path: False, not OSError, for an overlong name
        raise InputError(file, "", "no such file")
    if path.suffix.lower() == ".json":
        from synth.schedule.ir import check_schedule_fits, load_schedule

        schedule = load_schedule(path)
        check_schedule_fits(schedule, topology, file)
        from backends.msccl.lowering import lower_to_msccl   # after the file is checked: a refusal is fast
        return [lower_to_msccl(schedule, topology, size_bytes=size_bytes, target="executor")]
    from backends.msccl.parse import load_msccl_xml

    programs = load_msccl_xml(path)
    if not programs:
        raise InputError(file, "", "holds no <algo> to simulate")
    return programs


def _summarise(program, check, report) -> None:
    mode = "alpha occupies links" if report.alpha_occupies else "alpha overlaps"
    echo_err(f"{program.name}: {report.collective} on {report.num_ranks} ranks ({report.protocol}), "
             f"{report.topology}, {format_size(report.size_bytes)}: {report.time_us:.3f} us, "
             f"algbw {report.algbw_GBps:.2f} GB/s, busbw {report.busbw_GBps:.2f} GB/s ({mode})")
    errors = check.errors()
    if not errors:
        echo_err("  check: valid")
        return
    echo_err(f"  warning: the program fails its check ({len(errors)} error(s)); run `synth check` for all:")
    for finding in errors[:MAX_SHOWN_FINDINGS]:
        echo_err(f"    {finding}")


def _program_dict(program, check, report) -> dict:
    out = report.to_dict()
    out["valid"] = check.ok
    out["errors"] = len(check.errors())
    return out


def _json_report(file: str, results: list) -> dict:
    """Top level: the first program's figures (files usually hold one); ``programs`` lists every one."""
    programs = [_program_dict(*r) for r in results]
    first = programs[0]
    return {"file": file, "size_bytes": first["size_bytes"], "time_us": first["time_us"],
            "algbw_GBps": first["algbw_GBps"], "busbw_GBps": first["busbw_GBps"],
            "alpha_occupies": first["alpha_occupies"], "topology": first["topology"], "valid": first["valid"],
            "programs": programs}
