"""Plots of the per-size frontier (optional: needs matplotlib, the ``plot`` extra).

:func:`plot_size_frontier` draws two panels against nccl-tests' size (log-log): time (us) and algorithm
bandwidth (GB/s). One line per step-frontier algorithm, one for the alpha-beta schedules (each at the size it
was synthesized for) and one for the fastest baseline at each size; dots where the MSCCL runtime would run the
algorithm (element count a multiple of nchunksperloop), circles on the chosen algorithm per size, and the
physical limit (:mod:`synth.bounds.physical`) as a black dashed line. Files are written atomically.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Iterable

from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.fileio import write_atomic
from synth.sweep.sizes import Algorithm, AlgorithmKind, SizeChoice
from synth.units import format_size

FORMATS = ("png", "svg")


def available() -> bool:
    """True when matplotlib is installed (``pip install 'synth-collectives[plot]'``)."""
    return importlib.util.find_spec("matplotlib") is not None


def _lines(choices: tuple[SizeChoice, ...], algorithms: list[Algorithm]) -> list[tuple[str, str, list]]:
    """(label, line style, [(size, Timing)]) per line: one per step frontier point, one for the alpha-beta
    schedules and one for ``synth solve``'s plans (each at the size it was made for), one per gathered Allreduce,
    one for the fastest baseline at each size."""
    lines = []
    for alg in algorithms:
        if alg.kind == AlgorithmKind.STEPS:
            lines.append((alg.label, "-", [(c.size_bytes, c.timing(alg.key)) for c in choices]))
        elif alg.kind == AlgorithmKind.GATHERED:
            lines.append((alg.label, ":", [(c.size_bytes, c.timing(alg.key)) for c in choices]))
    for kind, label in ((AlgorithmKind.ALPHA_BETA, "alpha-beta (synthesized per size)"),
                        (AlgorithmKind.SOLVED, "synth solve's plan (per size)")):
        tuned = {a.tuned_bytes: a.key for a in algorithms if a.kind == kind}
        lines.append((label, "-.", [(c.size_bytes, c.timing(tuned[c.size_bytes])) for c in choices
                                    if c.size_bytes in tuned]))
    lines.append(("best baseline", "--", [(c.size_bytes, c.timing(c.best_baseline)) for c in choices
                                          if c.best_baseline]))
    # algorithms left out of the choice (e.g. excluded because they break a runtime limit) have no timing
    lines = [(label, style, [(s, t) for s, t in series if t is not None]) for label, style, series in lines]
    return [line for line in lines if line[2]]


def plot_size_frontier(choices: tuple[SizeChoice, ...], algorithms: Iterable[Algorithm], stem: str | Path,
                       title: str = "") -> list[Path]:
    """Write ``stem.png`` and ``stem.svg``; returns the paths. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    sizes = [c.size_bytes for c in choices]
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax_time, ax_bw = fig.subplots(1, 2)
    for label, style, series in _lines(choices, list(algorithms)):
        xs = [s for s, t in series]
        (line,) = ax_time.plot(xs, [t.time_us for _, t in series], style, linewidth=1.2, label=label)
        ax_bw.plot(xs, [t.algbw_GBps for _, t in series], style, linewidth=1.2, color=line.get_color())
        run = [(s, t) for s, t in series if t.runnable]
        ax_time.plot([s for s, _ in run], [t.time_us for _, t in run], "o", markersize=3, color=line.get_color())
        ax_bw.plot([s for s, _ in run], [t.algbw_GBps for _, t in run], "o", markersize=3,
                   color=line.get_color())
    chosen = [(c.size_bytes, c.timing(c.chosen)) for c in choices if c.chosen]
    if chosen:
        ax_time.plot([s for s, _ in chosen], [t.time_us for _, t in chosen], "o", markersize=9,
                     markerfacecolor="none", color="black", label="chosen")
        ax_bw.plot([s for s, _ in chosen], [t.algbw_GBps for _, t in chosen], "o", markersize=9,
                   markerfacecolor="none", color="black")
    limits = [(c.size_bytes, c.limit_us) for c in choices if c.limit_us]
    if limits:
        ax_time.plot([s for s, _ in limits], [u for _, u in limits], "k--", linewidth=1.5, label="limit")
        ax_bw.plot([s for s, _ in limits], [s / (u * BYTES_PER_US_PER_GBPS) for s, u in limits], "k--",
                   linewidth=1.5)
    ticks = sizes[:: max(1, len(sizes) // 6)]
    for ax, ylabel in ((ax_time, "time (us)"), (ax_bw, "algbw (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks, [format_size(s) for s in ticks])
        ax.set_xlabel("size (nccl-tests, bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    ax_time.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    stem = Path(stem)
    written = []
    for fmt in FORMATS:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=120, metadata={"Date": None} if fmt == "svg" else None)
        path = stem.with_suffix(f".{fmt}")
        write_atomic(path, buf.getvalue())
        written.append(path)
    return written
