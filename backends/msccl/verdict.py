"""The verdict on MSCCL XML text: what ``synth check`` reports and what the verified writer insists on.

:func:`check_text` parses the text (untrusted input, DESIGN section 11), lints it against the runtimes' rules
(DESIGN section 7), then executes each algorithm data-exactly with
:func:`backends.msccl.interpret.execute_program` (postcondition, deadlock, races). One function, so that the
files we write are judged exactly as the files users bring.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.msccl.findings import Finding
from backends.msccl.interpret import execute_program
from backends.msccl.ir import MscclProgram
from backends.msccl.lint import blocks_execution, for_target, lint_program, lint_text
from backends.msccl.parse import parse_msccl_document


@dataclass(frozen=True)
class AlgoReport:
    """Findings for one ``<algo>`` (all of them; reports print a capped list).

    ``executed`` is False when structural errors made execution meaningless.
    """

    program: MscclProgram
    executed: bool
    findings: tuple[Finding, ...]

    @property
    def valid(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


@dataclass(frozen=True)
class FileReport:
    """The verdict on one file: findings about the text itself plus one report per ``<algo>``."""

    source: str
    target: str
    file_findings: tuple[Finding, ...]
    algos: tuple[AlgoReport, ...]

    @property
    def valid(self) -> bool:
        return all(r.valid for r in self.algos) and not any(f.severity == "error" for f in self.file_findings)

    def errors(self) -> list[Finding]:
        return [f for f in self.file_findings + tuple(f for r in self.algos for f in r.findings)
                if f.severity == "error"]


def check_text(text: str, source: str, target: str = "both", collective: str | None = None,
               fifo_depth: int | None = None, sms: int | None = None) -> FileReport:
    """Parse, lint and execute MSCCL XML text; raises the parser's XmlError when it is not readable.

    ``collective`` overrides the file's ``coll`` (``custom``: no postcondition); ``fifo_depth`` as in
    :func:`~backends.msccl.interpret.execute_program`; ``sms``: the GPU's SM count, which bounds its
    threadblocks (None: unknown).
    """
    document = parse_msccl_document(text, source)
    file_findings = tuple(for_target(lint_text(text, source), target)) + document.notes
    algos = tuple(check_program(p, target, collective, fifo_depth, sms) for p in document.programs)
    return FileReport(source, target, file_findings, algos)


def check_program(program: MscclProgram, target: str = "both", collective: str | None = None,
                  fifo_depth: int | None = None, sms: int | None = None) -> AlgoReport:
    """Lint one program, then execute it unless the lint found structural errors."""
    findings = lint_program(program, target, cap=False, sms=sms)
    executed = not blocks_execution(findings)
    if executed:
        result = execute_program(program, collective=collective, fifo_depth=fifo_depth)
        known = {_identity(f) for f in findings}
        findings += [f for f in for_target(result.findings, target) if _identity(f) not in known]
    return AlgoReport(program, executed, tuple(findings))


def _identity(f: Finding) -> tuple:
    return (f.kind, f.gpu, f.tb, f.step, f.message)
