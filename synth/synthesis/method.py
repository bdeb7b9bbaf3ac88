"""How ``synth solve`` searches (a light module: the CLI reads it to build ``--method``'s choices)."""

from __future__ import annotations

from synth.text_enum import TextEnum



class Method(TextEnum):
    """One formulation, or ``auto`` (every applicable one plus the baselines)."""

    AUTO = "auto"
    STEPS = "steps"
    ROUTED = "routed"
    TIMEXP = "timexp"
    TREES = "trees"
    HIERARCHY = "hierarchy"



METHODS = tuple(m.value for m in Method)
