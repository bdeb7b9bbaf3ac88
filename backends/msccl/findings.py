"""A problem found in a program or schedule, shared by the linter, the interpreter and `synth check`."""

from __future__ import annotations

from dataclasses import dataclass

RUNTIMES = ("executor", "legacy")


@dataclass(frozen=True)
class Finding:
    """One finding. ``kind`` is the family (lint rule name, 'postcondition', 'deadlock', 'race', ...);
    ``runtimes`` says which MSCCL runtimes would reject or misrun the file because of it."""

    kind: str
    message: str
    severity: str = "error"          # 'error' makes the file invalid; 'warning' does not
    gpu: int | None = None
    tb: int | None = None
    step: int | None = None
    runtimes: tuple[str, ...] = RUNTIMES
    line: int = 0

    def location(self) -> str:
        parts = [f"{name} {value}" for name, value in (("gpu", self.gpu), ("tb", self.tb), ("step", self.step))
                 if value is not None]
        return "/".join(parts)

    def __str__(self) -> str:
        where = self.location()
        who = "both runtimes" if set(self.runtimes) == set(RUNTIMES) else " and ".join(self.runtimes) + " runtime"
        return f"{self.severity}: {self.kind}: {where + ': ' if where else ''}{self.message} ({who})"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message, "severity": self.severity, "gpu": self.gpu,
                "tb": self.tb, "step": self.step, "runtimes": list(self.runtimes), "line": self.line}
