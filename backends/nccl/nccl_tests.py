"""Fit link latency and bandwidth from nccl-tests output (``sendrecv_perf``, ``all_reduce_perf``).

nccl-tests prints one row per message size with out-of-place and in-place columns::

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s) ...
         1048576        262144     float     sum      -1    52.31   20.05   20.05      0    51.90   20.20 ...

Both ``time`` columns (microseconds) are samples of the model below, fitted by least squares on the
*relative* residual ``(t - model) / t`` (nccl-tests' noise grows with the time, and sizes span eight orders
of magnitude, so unweighted residuals would let the largest sizes decide alpha alone):

- ``sendrecv_perf``: every rank sends ``size`` bytes to its neighbour: ``t = alpha + size / bw``.
- ``all_reduce_perf`` on ``n`` ranks, modelled as NCCL's ring (ReduceScatter then Allgather, ``2(n-1)``
  steps of ``size/n`` bytes each): ``t = 2(n-1) alpha + 2(n-1)/n * size / bw``. ``bw`` is then the bandwidth
  of one ring link and ``alpha`` the latency of one step.

``alpha`` is in microseconds, ``bw`` in GB/s (1e9 bytes/s, so ``1 GB/s = 1e3 bytes/us``). Rows with a
non-zero ``#wrong`` count are skipped (the run was not correct), as are sizes outside ``[min_bytes,
max_bytes]`` when given. Files are bounded in size and parsed without evaluating anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.errors import InputError

TESTS = ("sendrecv", "all_reduce")
MAX_FILE_BYTES = 32 << 20
MAX_ROWS = 100_000

_TEST_LINE = re.compile(r"^#\s*Collective test starting:\s*([A-Za-z_]+)")
_RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$")


@dataclass(frozen=True)
class Sample:
    """One measured time: ``size_bytes`` took ``time_us`` (out-of-place or in-place column)."""

    size_bytes: int
    time_us: float
    inplace: bool


@dataclass(frozen=True)
class NcclTestsTable:
    """What one nccl-tests output file holds: the test, its rank count and the samples."""

    source: str
    test: str
    num_ranks: int | None
    samples: tuple[Sample, ...]
    skipped_rows: int


@dataclass(frozen=True)
class LinkFit:
    """Fitted latency (us) and bandwidth (GB/s) of one link class, with the fit's relative RMS error."""

    label: str
    source: str
    test: str
    num_ranks: int | None
    alpha_us: float
    bw_GBps: float
    samples: int
    rel_rms_error: float

    def predict_us(self, size_bytes: float) -> float:
        """Time (us) the fitted model gives for a ``size_bytes`` run of this test."""
        steps, volume = _model_factors(self.test, self.num_ranks)
        return steps * self.alpha_us + volume * size_bytes / (self.bw_GBps * BYTES_PER_US_PER_GBPS)

    def to_dict(self) -> dict:
        return {"label": self.label, "source": self.source, "test": self.test, "num_ranks": self.num_ranks,
                "alpha_us": self.alpha_us, "bw_GBps": self.bw_GBps, "samples": self.samples,
                "rel_rms_error": self.rel_rms_error}


@dataclass(frozen=True)
class LineFit:
    """``time_us = intercept_us + slope_us_per_byte * size_bytes`` fitted on relative residuals."""

    intercept_us: float
    slope_us_per_byte: float
    rel_rms_error: float


# ----------------------------------------------------------------------------------------------- parsing

def _read(path: Path) -> str:
    source = str(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(source, "", f"larger than {MAX_FILE_BYTES} bytes; is this nccl-tests output?")
        return path.read_text(errors="replace")
    except OSError as exc:
        raise InputError(source, "", f"cannot read file ({exc.strerror})") from None


def _detect_test(text: str, source: str) -> str | None:
    for line in text.splitlines():
        m = _TEST_LINE.match(line)
        if m:
            return _normalize_test(m.group(1), source)
    stem = Path(source).name.lower()
    if "sendrecv" in stem:
        return "sendrecv"
    if "all_reduce" in stem or "allreduce" in stem:
        return "all_reduce"
    return None


def _normalize_test(name: str, source: str) -> str:
    key = name.lower().removesuffix("_perf").replace("-", "_")
    key = {"allreduce": "all_reduce", "send_recv": "sendrecv"}.get(key, key)
    if key not in TESTS:
        raise InputError(source, "test", f"{name!r} is not supported; fit sendrecv_perf or all_reduce_perf output")
    return key


def parse_nccl_tests(text: str, source: str = "<text>", test: str | None = None) -> NcclTestsTable:
    """Read the result table of one nccl-tests run.

    ``test`` (``sendrecv`` or ``all_reduce``) overrides detection from the ``# Collective test starting``
    line or the file name.
    """
    if len(text) > MAX_FILE_BYTES:
        raise InputError(source, "", f"larger than {MAX_FILE_BYTES} characters")
    test = _normalize_test(test, source) if test else _detect_test(text, source)
    if test is None:
        raise InputError(source, "test", "cannot tell which nccl-tests binary wrote this; pass --test sendrecv "
                         "or --test all_reduce")
    columns: list[str] | None = None
    samples: list[Sample] = []
    skipped = 0
    ranks = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if _RANK_LINE.match(stripped):
                ranks += 1
            tokens = stripped.lstrip("#").split()
            if "size" in tokens and "time" in tokens:
                columns = tokens
            continue
        if columns is None:
            continue
        tokens = stripped.split()
        if not tokens or not tokens[0].isdigit() or len(tokens[0]) > 15 or len(tokens) < len(columns):
            continue
        if len(samples) + skipped >= MAX_ROWS:
            raise InputError(source, f"line {lineno}", f"more than {MAX_ROWS} result rows")
        size = int(tokens[0])
        if size == 0:
            continue
        row = _row_samples(columns, tokens, size)
        if row is None:
            skipped += 1
            continue
        samples.extend(row)
    if columns is None:
        raise InputError(source, "", "no nccl-tests result table (a '#  size  count  type ... time  algbw' "
                         "header) found")
    if not samples:
        raise InputError(source, "", "the result table has no usable rows")
    if ranks == 0 and test == "all_reduce":
        ranks = _ranks_from_busbw(columns, text) or 0
    return NcclTestsTable(source, test, ranks or None, tuple(samples), skipped)


def _row_samples(columns: list[str], tokens: list[str], size: int) -> list[Sample] | None:
    """The row's out-of-place and in-place samples, or None when the row reports wrong results."""
    out = []
    time_cols = [i for i, c in enumerate(columns) if c == "time"]
    for k, i in enumerate(time_cols):
        wrong = next((j for j in range(i + 1, len(columns)) if columns[j] in ("#wrong", "error")), None)
        if wrong is not None and wrong < len(tokens) and _NUMBER.match(tokens[wrong]):
            if float(tokens[wrong]) > 0:
                return None
        if i < len(tokens) and _NUMBER.match(tokens[i]):
            t = float(tokens[i])
            if 0 < t < 1e15:
                out.append(Sample(size, t, inplace=k == 1))
    return out


def _ranks_from_busbw(columns: list[str], text: str) -> int | None:
    """n from nccl-tests' Allreduce bus factor busbw / algbw = 2(n-1)/n, read from the largest row."""
    try:
        ia, ib = columns.index("algbw"), columns.index("busbw")
    except ValueError:
        return None
    best = None
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) > ib and tokens[0].isdigit() and _NUMBER.match(tokens[ia]) and _NUMBER.match(tokens[ib]):
            alg, bus = float(tokens[ia]), float(tokens[ib])
            if alg > 0:
                best = bus / alg
    if best is None or not 0.9 <= best < 2.0:
        return None
    return max(2, round(2 / (2 - best)))


# ----------------------------------------------------------------------------------------------- fitting

def fit_line(sizes, times) -> LineFit:
    """Least squares on relative residuals of ``t = a + b * size``; ``a`` is clamped at 0.

    >>> f = fit_line([1e3, 1e6, 1e9], [1.0 + 0.1, 1.0 + 100.0, 1.0 + 1e5])
    >>> round(f.intercept_us, 3), round(f.slope_us_per_byte * 1e4, 3)
    (1.0, 1.0)
    """
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if len(s) < 2 or len(np.unique(s)) < 2:
        raise ValueError("need at least two distinct sizes")
    A = np.column_stack([1.0 / t, s / t])
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if a < 0:
        w = s / t
        a, b = 0.0, float(w.sum() / (w * w).sum())
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        raise ValueError("times do not grow with the size")
    rel = (t - (a + b * s)) / t
    return LineFit(float(a), float(b), float(np.sqrt(np.mean(rel * rel))))


def _model_factors(test: str, num_ranks: int | None) -> tuple[float, float]:
    """(alpha multiplier, bytes multiplier) of the test's time model (module docstring)."""
    if test == "sendrecv":
        return 1.0, 1.0
    n = num_ranks or 2
    return 2.0 * (n - 1), 2.0 * (n - 1) / n


def fit_table(table: NcclTestsTable, label: str | None = None, min_bytes: int = 0,
              max_bytes: int | None = None) -> LinkFit:
    """Fit one parsed table to its test's model; alpha in us, bandwidth in GB/s."""
    chosen = [x for x in table.samples if x.size_bytes >= min_bytes and (max_bytes is None or x.size_bytes <= max_bytes)]
    if table.test == "all_reduce" and not table.num_ranks:
        raise InputError(table.source, "ranks", "cannot tell the number of ranks (no '#  Rank' lines); pass --ranks")
    try:
        line = fit_line([x.size_bytes for x in chosen], [x.time_us for x in chosen])
    except ValueError as exc:
        raise InputError(table.source, "time", f"cannot fit alpha and bandwidth: {exc}") from None
    steps, volume = _model_factors(table.test, table.num_ranks)
    alpha = line.intercept_us / steps
    bw = volume / line.slope_us_per_byte / BYTES_PER_US_PER_GBPS
    return LinkFit(label or Path(table.source).stem, table.source, table.test, table.num_ranks, alpha, bw,
                   len(chosen), line.rel_rms_error)


def fit_nccl_tests(paths, test: str | None = None, num_ranks: int | None = None, min_bytes: int = 0,
                   max_bytes: int | None = None) -> list[LinkFit]:
    """Fit alpha (us) and bandwidth (GB/s) from nccl-tests output files, one :class:`LinkFit` per file.

    Each file is one link class (e.g. ``sendrecv_perf`` between two GPUs of a node for NVLink, between two
    nodes for the network); the label is the file's stem. ``test`` and ``num_ranks`` override what the
    files say.

    Examples
    --------
    >>> rows = "\\n".join(f"{s} {s // 4} float sum -1 {2 + s / 2e4:.3f} 0 0 0" for s in (8, 1 << 10, 1 << 20, 1 << 26))
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "nvlink_sendrecv.txt")
    >>> _ = open(p, "w").write("# size count type redop root time algbw busbw #wrong\\n" + rows)
    >>> fit = fit_nccl_tests([p])[0]
    >>> round(fit.alpha_us, 2), round(fit.bw_GBps, 2)
    (2.0, 20.0)
    """
    fits = []
    for path in paths:
        path = Path(path)
        table = parse_nccl_tests(_read(path), str(path), test)
        if num_ranks is not None:
            table = NcclTestsTable(table.source, table.test, num_ranks, table.samples, table.skipped_rows)
        fits.append(fit_table(table, min_bytes=min_bytes, max_bytes=max_bytes))
    return fits
