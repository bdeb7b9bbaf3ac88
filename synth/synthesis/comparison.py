"""How a schedule compares with the physical limit and with NCCL-style baselines (every solve reports this)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from synth.errors import InputError
from synth.synthesis.request import SynthesisRequest


@dataclass(frozen=True)
class LimitComparison:
    """``percent_of_limit`` = limit time / achieved time x 100 (100 means at the limit); ``limit_binding`` says
    which bound gives the limit: ``"bandwidth"``, ``"latency"`` or ``"crossing"``
    (:attr:`synth.bounds.physical.Bound.limit_source`)."""

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


def compare_with_limits(request: SynthesisRequest, time_us: float,
                        baseline: tuple[str, float] | None = None,
                        unloadable: Collection[tuple[str, int]] = ()) -> LimitComparison:
    """How ``time_us`` (us) compares with the request's physical limit and with a baseline.

    ``baseline`` is ``(label, time_us)`` of the baseline the runtime would run (simulated, when the caller has
    written it); without it, the fastest runnable baseline's replayed time is used, leaving out the ``unloadable``
    ones (``(name, chunks per way)`` the writer refused for a runtime limit, and the same baseline with more
    chunks: 16 x dgx-h100 Alltoall 1 MB was compared with an all-pairs exchange that needs 255 threadblocks of a
    GPU's 132).

    >>> from synth.model.topology import load_topology
    >>> request = SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20)
    >>> c = compare_with_limits(request, 100.0)
    >>> c.baseline, 0 < c.percent_of_limit < 100
    ('bidir-ring', True)
    >>> compare_with_limits(request, 100.0, unloadable=[("bidir-ring", 1)]).baseline != "bidir-ring"
    True
    """
    bound = request.bound
    name = base_us = speedup = None
    if baseline is not None:
        name, base_us = baseline
    elif request.include_baselines:
        try:
            best = request.baselines.best(runnable_only=True, unloadable=unloadable)
            name, base_us = best.name, best.report.time_us
        except InputError:
            pass  # no baseline applies on this topology, or none the runtime can load
    if base_us is not None:
        speedup = base_us / time_us
    return LimitComparison(bound.limit_us, bound.limit_source, 100.0 * bound.limit_us / time_us, name, base_us,
                           speedup)
