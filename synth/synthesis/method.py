"""How ``synth solve`` searches (a light module: the CLI reads it to build ``--method``'s choices)."""

from __future__ import annotations

from enum import Enum


class Method(str, Enum):
    """One formulation, or ``auto`` (every applicable one plus the baselines)."""

    AUTO = "auto"
    STEPS = "steps"
    ROUTED = "routed"
    TIMEXP = "timexp"
    TREES = "trees"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


METHODS = tuple(m.value for m in Method)
