"""The lowerings the verified writer may make of a schedule, for checking its floors (``tests/test_msccl_floor.py``,
``benchmarks/bench_floor.py``)."""

from __future__ import annotations

from backends.msccl.fit import Fit, Lowering, fit_lowering, lower_fitted, measure, wider_fits


def unmerged_variants(schedule, topology, target: str = "executor") -> list[Fit]:
    """Every unmerged fitted lowering the writer may make: fused and plain, each channel spread, in link order."""
    out = []
    for fuse in (True, False):
        fit = fit_lowering(schedule, topology, target, fuse, most_cnt=1)
        if not fit.fits:
            continue
        out += wider_fits(schedule, topology, target, fit)
        ordered = Lowering(fuse, fit.lowering.channels, in_link_order=True)
        out.append(measure(lower_fitted(schedule, topology, target, ordered), ordered, target, topology.sms_per_gpu))
    return [v for v in out if v.fits]
