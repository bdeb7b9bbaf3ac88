"""How a schedule compares with the physical limit and with NCCL-style baselines (every solve reports this)."""

from __future__ import annotations

from dataclasses import dataclass

from synth.synthesis.baselines import best_baseline
from synth.bounds.physical import lower_bound
from synth.errors import InputError
from synth.model.topology import Topology


@dataclass(frozen=True)
class LimitComparison:
    """``percent_of_limit`` = limit time / achieved time x 100 (100 means at the limit)."""

    limit_us: float
    limit_binding: str
    percent_of_limit: float
    baseline: str | None
    baseline_us: float | None
    speedup_vs_baseline: float | None

    def summary(self) -> str:
        text = (f"limit {self.limit_us:.3f} us ({self.limit_binding} bound): {self.percent_of_limit:.1f}% of the "
                "limit")
        if self.baseline is not None:
            text += f"; best baseline {self.baseline} {self.baseline_us:.3f} us, speedup {self.speedup_vs_baseline:.2f}x"
        return text

    def to_dict(self) -> dict:
        return {"limit_us": self.limit_us, "limit_binding": self.limit_binding,
                "percent_of_limit": self.percent_of_limit, "baseline": self.baseline,
                "baseline_us": self.baseline_us, "speedup_vs_baseline": self.speedup_vs_baseline}


def compare_with_limits(collective: str, topology: Topology, size_bytes: int, time_us: float,
                        root: int | None = None, with_baseline: bool = True) -> LimitComparison:
    bound = lower_bound(collective, topology, size_bytes, root=root)
    name = base_us = speedup = None
    if with_baseline:
        try:
            name, _, base = best_baseline(collective, topology, size_bytes, root=root)
            base_us, speedup = base.time_us, base.time_us / time_us
        except InputError:
            pass  # no baseline applies on this topology
    return LimitComparison(bound.limit_us, bound.binding, 100.0 * bound.limit_us / time_us, name, base_us, speedup)
