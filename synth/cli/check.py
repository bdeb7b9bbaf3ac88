"""``synth check``: verify an MSCCL XML file before it touches a GPU.

The verdict is :func:`backends.msccl.verdict.check_text` (parse, lint, execute), the same one every file synth
writes must pass. Exit 0 when valid (warnings allowed), 1 when invalid or unreadable.
"""

from __future__ import annotations

import json

import click

from synth.errors import InputError
from synth.model.collectives import COLLECTIVES, normalize_name
from synth.model.topology import MAX_SMS_PER_GPU
from backends.msccl.findings import Finding
from backends.msccl.lint import TARGETS, cap_findings
from synth.cli._common import EXIT_BAD_INPUT, MAX_FIFO_DEPTH

CUSTOM = "custom"


@click.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--collective", type=click.Choice(COLLECTIVES + ("reduce_scatter", CUSTOM)), default=None,
              help="Check against this collective instead of the file's coll attribute "
                   f"({CUSTOM}: check no postcondition, only deadlocks, races and limits).")
@click.option("--target", type=click.Choice(TARGETS), default="both", show_default=True,
              help="Runtime the file must work on: the MSCCL executor in NCCL 2.23, the legacy MSCCL fork of "
                   "NCCL 2.12, or both (problems of only one runtime are then warnings).")
@click.option("--fifo-depth", type=click.IntRange(0, MAX_FIFO_DEPTH), default=None,
              help="Messages a connection may hold (0 = rendezvous sends). Default: judge at depth 1 and, "
                   "if that deadlocks, say whether the runtime's depth (2 Simple, 8 LL/LL128) would hang too.")
@click.option("--sms", type=click.IntRange(1, MAX_SMS_PER_GPU), default=None,
              help="The GPU's SM count: all threadblocks of a GPU run at once, so more than this is an error "
                   "(default: the --topology's, else only a warning above 80).")
@click.option("--topology", "-t", "topology_name", default=None,
              help="Built-in topology NAME or topology JSON FILE whose GPUs the file is for (their SM count).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
def check(file, collective, target, fifo_depth, sms, topology_name, as_json):
    """Check that the MSCCL XML FILE loads in the MSCCL runtimes and implements its collective."""
    from backends.msccl.parse import read_xml_text
    from backends.msccl.verdict import check_text

    name = collective if collective in (None, CUSTOM) else normalize_name(collective)
    if sms is None and topology_name is not None:
        sms = _topology_sms(topology_name)
    report = check_text(read_xml_text(file), file, target, name, fifo_depth, sms)
    if as_json:
        click.echo(json.dumps(_json_report(file, target, report), indent=1))
    else:
        _print_report(file, report)
    if not report.valid:
        click.get_current_context().exit(EXIT_BAD_INPUT)


def _topology_sms(topology_name: str) -> int:
    """The SM count of the topology's GPUs; refused when the topology does not know it."""
    from synth.model.topology import load_topology

    topology = load_topology(topology_name)
    if topology.sms_per_gpu is None:
        raise InputError(topology_name, "sms_per_gpu", f"topology {topology.name} does not say how many SMs its "
                         "GPUs have; give --sms N (H100 132, A100 108, V100 80)")
    return topology.sms_per_gpu


def _print_report(file, report) -> None:
    """One line per finding (``file:line: finding``), a line per algo, then the verdict."""
    for finding in cap_findings(report.file_findings):
        click.echo(_located(file, finding))
    for algo in report.algos:
        p = algo.program
        errors, warnings = _counts(algo.findings)
        click.echo(f"{file}:{p.line}: algo {p.name!r}: {p.coll} on {p.ngpus} ranks: "
                   f"{errors} error(s), {warnings} warning(s)")
        for finding in cap_findings(algo.findings):
            click.echo(_located(file, finding))
        if not algo.executed:
            click.echo(f"{file}:{p.line}: algo {p.name!r} not executed: fix the errors above first")
    errors, warnings = _counts([f for r in report.algos for f in r.findings] + list(report.file_findings))
    verdict = "valid" if report.valid else "INVALID"
    click.echo(f"{file}: {verdict}: {len(report.algos)} algo(s), {errors} error(s), {warnings} warning(s)")


def _located(file: str, finding: Finding) -> str:
    return f"{file}:{finding.line}: {finding}" if finding.line else f"{file}: {finding}"


def _counts(findings) -> tuple[int, int]:
    errors = sum(f.severity == "error" for f in findings)
    return errors, len(findings) - errors


def _json_report(file, target, report) -> dict:
    """The --json report: counts are exact, finding lists are capped like the text report."""
    return {"file": file, "target": target, "valid": report.valid,
            "findings": [f.to_dict() for f in cap_findings(report.file_findings)],
            "algos": [{"name": r.program.name, "coll": r.program.coll, "ngpus": r.program.ngpus,
                       "line": r.program.line, "valid": r.valid, "executed": r.executed,
                       "errors": _counts(r.findings)[0], "warnings": _counts(r.findings)[1],
                       "findings": [f.to_dict() for f in cap_findings(r.findings)]}
                      for r in report.algos]}
