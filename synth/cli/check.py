"""``synth check``: verify an MSCCL XML file before it touches a GPU.

Parses the file (untrusted input, DESIGN section 11), lints it against the runtimes' rules (DESIGN section 7),
then executes each algorithm data-exactly with :func:`backends.msccl.interpret.execute_program` (postcondition,
deadlock, races). Exit 0 when valid (warnings allowed), 1 when invalid or unreadable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import click

from synth.model.collectives import COLLECTIVES, normalize_name
from backends.msccl.findings import Finding
from backends.msccl.lint import TARGETS, blocks_execution, cap_findings, for_target, lint_program, lint_text
from synth.cli._common import EXIT_BAD_INPUT

CUSTOM = "custom"


@dataclass(frozen=True)
class AlgoReport:
    """Findings for one ``<algo>`` (all of them; reports print a capped list).

    ``executed`` is False when structural errors made execution meaningless.
    """

    name: str
    coll: str
    ngpus: int
    line: int
    executed: bool
    findings: tuple[Finding, ...]

    @property
    def valid(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


@click.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--collective", type=click.Choice(COLLECTIVES + ("reduce_scatter", CUSTOM)), default=None,
              help="Check against this collective instead of the file's coll attribute "
                   f"({CUSTOM}: check no postcondition, only deadlocks, races and limits).")
@click.option("--target", type=click.Choice(TARGETS), default="both", show_default=True,
              help="Runtime the file must work on: the MSCCL executor in NCCL 2.23, the legacy MSCCL fork of "
                   "NCCL 2.12, or both (problems of only one runtime are then warnings).")
@click.option("--fifo-depth", type=click.IntRange(min=0), default=None,
              help="Messages a connection may hold (0 = rendezvous sends). Default: judge at depth 1 and, "
                   "if that deadlocks, say whether the runtime's depth (2 Simple, 8 LL/LL128) would hang too.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
def check(file, collective, target, fifo_depth, as_json):
    """Check that the MSCCL XML FILE loads in the MSCCL runtimes and implements its collective."""
    from backends.msccl.parse import parse_msccl_document, read_xml_text

    text = read_xml_text(file)
    document = parse_msccl_document(text, file)
    file_findings = tuple(for_target(lint_text(text, file), target)) + document.notes
    name = collective if collective in (None, CUSTOM) else normalize_name(collective)
    reports = [_check_program(p, name, target, fifo_depth) for p in document.programs]
    valid = all(r.valid for r in reports) and not any(f.severity == "error" for f in file_findings)
    if as_json:
        click.echo(json.dumps(_json_report(file, target, valid, file_findings, reports), indent=1))
    else:
        _print_report(file, valid, file_findings, reports)
    if not valid:
        click.get_current_context().exit(EXIT_BAD_INPUT)


def _check_program(program, collective, target, fifo_depth) -> AlgoReport:
    """Lint one program, then execute it unless the lint found structural errors."""
    from backends.msccl.interpret import execute_program

    findings = lint_program(program, target, cap=False)
    executed = not blocks_execution(findings)
    if executed:
        result = execute_program(program, collective=collective, fifo_depth=fifo_depth)
        known = {_identity(f) for f in findings}
        findings += [f for f in for_target(result.findings, target) if _identity(f) not in known]
    return AlgoReport(program.name, program.coll, program.ngpus, program.line, executed, tuple(findings))


def _identity(f: Finding) -> tuple:
    return (f.kind, f.gpu, f.tb, f.step, f.message)


def _print_report(file, valid, file_findings, reports) -> None:
    """One line per finding (``file:line: finding``), a line per algo, then the verdict."""
    for finding in cap_findings(file_findings):
        click.echo(_located(file, finding))
    for report in reports:
        errors, warnings = _counts(report.findings)
        click.echo(f"{file}:{report.line}: algo {report.name!r}: {report.coll} on {report.ngpus} ranks: "
                   f"{errors} error(s), {warnings} warning(s)")
        for finding in cap_findings(report.findings):
            click.echo(_located(file, finding))
        if not report.executed:
            click.echo(f"{file}:{report.line}: algo {report.name!r} not executed: fix the errors above first")
    errors, warnings = _counts([f for r in reports for f in r.findings] + list(file_findings))
    verdict = "valid" if valid else "INVALID"
    click.echo(f"{file}: {verdict}: {len(reports)} algo(s), {errors} error(s), {warnings} warning(s)")


def _located(file: str, finding: Finding) -> str:
    return f"{file}:{finding.line}: {finding}" if finding.line else f"{file}: {finding}"


def _counts(findings) -> tuple[int, int]:
    errors = sum(f.severity == "error" for f in findings)
    return errors, len(findings) - errors


def _json_report(file, target, valid, file_findings, reports) -> dict:
    """The --json report: counts are exact, finding lists are capped like the text report."""
    return {"file": file, "target": target, "valid": valid,
            "findings": [f.to_dict() for f in cap_findings(file_findings)],
            "algos": [{"name": r.name, "coll": r.coll, "ngpus": r.ngpus, "line": r.line, "valid": r.valid,
                       "executed": r.executed, "errors": _counts(r.findings)[0],
                       "warnings": _counts(r.findings)[1],
                       "findings": [f.to_dict() for f in cap_findings(r.findings)]}
                      for r in reports]}
