"""Fit link latency and bandwidth from nccl-tests output (``sendrecv_perf``, ``all_reduce_perf``,
``all_gather_perf``, ``reduce_scatter_perf``, ``alltoall_perf``).

nccl-tests prints one row per message size with out-of-place and in-place columns::

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s) ...
         1048576        262144     float     sum      -1    52.31   20.05   20.05      0    51.90   20.20 ...

``size`` is nccl-tests' size (DESIGN section 4: the output buffer of all_gather, the input of reduce_scatter,
the per-rank send buffer of alltoall); ``count`` is the per-rank element count, so ``size / (count x type
size)`` is ``n`` for all_gather, reduce_scatter and alltoall and 1 otherwise. Both ``time`` columns
(microseconds) are samples of the model below, fitted by least squares on the *relative* residual
``(t - model) / t`` (nccl-tests' noise grows with the time, and sizes span eight orders of magnitude, so
unweighted residuals would let the largest sizes decide alpha alone):

    t = steps x alpha + busbw_factor x size / bw

with nccl-tests' bus-bandwidth factor (:data:`KINDS`), so ``bw`` is what nccl-tests' ``busbw`` tends to at
large sizes, and ``steps`` the latency-bound steps of NCCL's algorithm: sendrecv 1; all_reduce as a ring
``2(n-1)``; all_gather and reduce_scatter as a ring ``n-1``; alltoall 1 (every peer at once). On one node
``bw`` is then the bandwidth of one ring link (sendrecv: of the link between the pair); across nodes it is
the per-GPU share of the slowest hop (usually the network), not the bandwidth of one link, and the fit says so.

``alpha`` is in microseconds, ``bw`` in GB/s (1e9 bytes/s, so ``1 GB/s = 1e3 bytes/us``).

What is read (every problem is an :class:`~synth.errors.InputError`, never a traceback): launcher prefixes are
stripped (``mpirun --tag-output``'s ``[1,0]<stdout>:``, ``srun --label``'s `` 0: ``); the test comes from
``--test``, the ``# Collective test starting`` line, the file name, or the table itself (row shape, ``redop``
and ``busbw / algbw``); the rank count from the ``#  Rank`` lines or the table; a table without its header
lines is read in nccl-tests' default column order. Rows with a non-zero ``#wrong`` count are skipped, as are
sizes outside ``[min_bytes, max_bytes]`` when given. Files are bounded in size and parsed without evaluating
anything.

Each fit reports its quality (:class:`LinkFit`): the relative RMS residual, which sizes fed alpha (the latency
term dominates the model there) and which fed the bandwidth, and warnings when it is implausible (alpha of
hundreds of microseconds, a bandwidth the largest row gets nowhere near, a large residual, too few sizes on
one side).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from synth.errors import InputError
from synth.schedule.costmodel import BYTES_PER_US_PER_GBPS
from synth.units import format_size

MAX_FILE_BYTES = 32 << 20
MAX_ROWS = 100_000
ALPHA_IMPLAUSIBLE_US = 100.0
RESIDUAL_LARGE = 0.10
# The fitted bandwidth is an extrapolation when the largest row reaches less than this share of it.
BANDWIDTH_REACHED = 0.8


@dataclass(frozen=True)
class TestKind:
    """One nccl-tests binary: its bus-bandwidth factor and its model's latency steps, as functions of n."""

    name: str
    busbw_factor: object      # n -> float, nccl-tests' busbw / algbw
    steps: object             # n -> float, latency-bound steps of NCCL's algorithm
    size_per_count: bool      # size / (count x type size) == n (else 1)
    redop: bool               # the redop column names an operation (else "none")


KINDS = {
    "sendrecv": TestKind("sendrecv", lambda n: 1.0, lambda n: 1.0, False, True),
    "all_reduce": TestKind("all_reduce", lambda n: 2.0 * (n - 1) / n, lambda n: 2.0 * (n - 1), False, True),
    "all_gather": TestKind("all_gather", lambda n: (n - 1) / n, lambda n: n - 1.0, True, False),
    "reduce_scatter": TestKind("reduce_scatter", lambda n: (n - 1) / n, lambda n: n - 1.0, True, True),
    "alltoall": TestKind("alltoall", lambda n: (n - 1) / n, lambda n: 1.0, True, False),
}
TESTS = tuple(KINDS)
_ALIASES = {"allreduce": "all_reduce", "send_recv": "sendrecv", "allgather": "all_gather",
            "reducescatter": "reduce_scatter", "all_to_all": "alltoall"}
_TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8,
               "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# nccl-tests' own column orders (plain, and with per-iteration timing), for tables pasted without their headers.
DEFAULT_COLUMNS = ("size count type redop root time algbw busbw #wrong time algbw busbw #wrong").split()
PER_ITERATION_COLUMNS = ("size count type redop root time algbw busbw #wrong i_min i_max i_p99 i_cv% "
                         "time algbw busbw #wrong i_min i_max i_p99 i_cv%").split()

_TEST_LINE = re.compile(r"^#\s*Collective test starting:\s*([A-Za-z_]+)")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+(?:\s+Pid\s+\d+\s+on\s+(\S+))?")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$")
_COUNT = re.compile(r"^[0-9]{1,15}$")   # ASCII digits only: str.isdigit() accepts '¹', which int() refuses
_PREFIXES = (re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?"),   # mpirun --tag-output
             re.compile(r"^\s*\d+:\s"))                                # srun --label


@dataclass(frozen=True)
class Sample:
    """One measured time: ``size_bytes`` took ``time_us`` (out-of-place or in-place column)."""

    size_bytes: int
    time_us: float
    inplace: bool


@dataclass(frozen=True)
class NcclTestsTable:
    """What one nccl-tests output file holds: the test, its rank and node counts and the samples.

    ``busbw_ratio`` (busbw / algbw) and ``size_per_count`` (size / (count x type size)) are read from the
    largest row; they tell the test and the rank count when the file does not.
    """

    source: str
    test: str
    num_ranks: int | None
    samples: tuple[Sample, ...]
    skipped_rows: int
    num_nodes: int | None = None
    busbw_ratio: float | None = None
    size_per_count: float | None = None


@dataclass(frozen=True)
class LinkFit:
    """Fitted latency (us) and bandwidth (GB/s) of one link class, with the fit's quality.

    ``bandwidth_means`` says what ``bw_GBps`` is (one link, or a bus bandwidth across nodes);
    ``alpha_sizes`` / ``bandwidth_sizes`` are the sizes (bytes) where the latency / bandwidth term dominates
    the fitted model; ``warnings`` say why the fit may be implausible.
    """

    label: str
    source: str
    test: str
    num_ranks: int | None
    alpha_us: float
    bw_GBps: float
    samples: int
    rel_rms_error: float
    num_nodes: int | None = None
    bandwidth_means: str = ""
    alpha_sizes: tuple[int, ...] = ()
    bandwidth_sizes: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()

    def predict_us(self, size_bytes: float) -> float:
        """Time (us) the fitted model gives for a ``size_bytes`` run of this test."""
        steps, volume = _model_factors(self.test, self.num_ranks)
        return steps * self.alpha_us + volume * size_bytes / (self.bw_GBps * BYTES_PER_US_PER_GBPS)

    def to_dict(self) -> dict:
        return {"label": self.label, "source": self.source, "test": self.test, "num_ranks": self.num_ranks,
                "num_nodes": self.num_nodes, "alpha_us": self.alpha_us, "bw_GBps": self.bw_GBps,
                "bandwidth_means": self.bandwidth_means, "samples": self.samples,
                "rel_rms_error": self.rel_rms_error, "alpha_sizes": list(self.alpha_sizes),
                "bandwidth_sizes": list(self.bandwidth_sizes), "warnings": list(self.warnings)}


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


def strip_launcher_prefix(line: str) -> str:
    """``line`` without an ``mpirun --tag-output`` (``[1,0]<stdout>:``) or ``srun --label`` (`` 0: ``) prefix.

    >>> strip_launcher_prefix("[1,0]<stdout>:#  Rank  0 Group  0")
    '#  Rank  0 Group  0'
    >>> strip_launcher_prefix(" 0:      1024    256   float")
    '     1024    256   float'
    """
    for prefix in _PREFIXES:
        m = prefix.match(line)
        if m:
            return line[m.end():]
    return line


def _normalize_test(name: str, source: str) -> str:
    key = name.lower().removesuffix("_perf").replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in KINDS:
        raise InputError(source, "test", f"{name!r} is not supported; fit the output of "
                         f"{', '.join(t + '_perf' for t in TESTS)}")
    return key


def _test_from_name(source: str) -> str | None:
    stem = Path(source).name.lower().replace("-", "_")
    for key in sorted(set(KINDS) | set(_ALIASES), key=len, reverse=True):
        if key in stem:
            return _ALIASES.get(key, key)
    return None


def _test_from_table(ratio: float | None, per_count: float | None, redop: str | None,
                     ranks: int | None, source: str) -> str:
    """The test the table's shape says (module docstring), or an InputError saying how to name it."""
    how = (f"pass --test ({', '.join(TESTS)}), or keep nccl-tests' '# Collective test starting' line, or name "
           "the file after the binary (e.g. all_gather_perf.txt)")
    if per_count is not None and per_count > 1.5:
        if redop not in (None, "none"):
            return "reduce_scatter"
        raise InputError(source, "test", "the table is all_gather or alltoall output (redop none, size = n x "
                         f"count), which look alike; {how}")
    if ratio is not None and ratio > 1.02:
        return "all_reduce"
    if ratio is not None and 0.98 <= ratio <= 1.02 and ranks is not None and ranks > 2:
        return "sendrecv"
    raise InputError(source, "test", f"cannot tell which nccl-tests binary wrote this table; {how}")


@dataclass(frozen=True)
class _Rows:
    columns: tuple[str, ...] | None
    samples: tuple[Sample, ...]
    skipped: int
    ranks: int
    hosts: frozenset
    announced: str | None
    ratio: float | None
    per_count: float | None
    redop: str | None


def _scan(text: str, source: str) -> _Rows:
    columns: list[str] | None = None
    samples: list[Sample] = []
    skipped = ranks = 0
    hosts: set[str] = set()
    announced = None
    last = None
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        stripped = strip_launcher_prefix(raw_line).strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            m = _RANK_LINE.match(stripped)
            if m:
                ranks += 1
                if m.group(2):
                    hosts.add(m.group(2))
            m = _TEST_LINE.match(stripped)
            if m and announced is None:
                announced = m.group(1)
            tokens = stripped.lstrip("#").split()
            if "size" in tokens and "time" in tokens:
                columns = tokens
            continue
        tokens = stripped.split()
        if not tokens or not _COUNT.match(tokens[0]):
            continue
        cols = columns
        if cols is None and len(tokens) >= len(DEFAULT_COLUMNS) and _NUMBER.match(tokens[5]):
            # a header-less table: nccl-tests' own column order
            cols = PER_ITERATION_COLUMNS if len(tokens) >= len(PER_ITERATION_COLUMNS) else DEFAULT_COLUMNS
        if cols is None or len(tokens) < len(cols):
            continue
        if len(samples) + skipped >= MAX_ROWS:
            raise InputError(source, f"line {lineno}", f"more than {MAX_ROWS} result rows")
        size = int(tokens[0])
        if size == 0:
            continue
        row = _row_samples(cols, tokens, size)
        if row is None:
            skipped += 1
            continue
        samples.extend(row)
        columns = list(cols)
        last = tokens
    ratio = per_count = redop = None
    if last is not None and columns is not None:
        ratio = _busbw_ratio(columns, last)
        per_count = _size_per_count(columns, last)
        redop = last[columns.index("redop")].lower() if "redop" in columns else None
    return _Rows(tuple(columns) if columns else None, tuple(samples), skipped, ranks, frozenset(hosts),
                 announced, ratio, per_count, redop)


def _busbw_ratio(columns: list[str], tokens: list[str]) -> float | None:
    if "algbw" not in columns or "busbw" not in columns:
        return None
    alg, bus = tokens[columns.index("algbw")], tokens[columns.index("busbw")]
    if not (_NUMBER.match(alg) and _NUMBER.match(bus)) or float(alg) <= 0:
        return None
    return float(bus) / float(alg)


def _size_per_count(columns: list[str], tokens: list[str]) -> float | None:
    if "count" not in columns or "type" not in columns:
        return None
    count, type_name = tokens[columns.index("count")], tokens[columns.index("type")].lower()
    if not _COUNT.match(count) or int(count) == 0 or type_name not in _TYPE_BYTES:
        return None
    return int(tokens[0]) / (int(count) * _TYPE_BYTES[type_name])


def _ranks_from_shape(test: str, ratio: float | None, per_count: float | None) -> int | None:
    """n from the table: size / (count x type size) for AG/RS/A2A, nccl-tests' busbw factor otherwise."""
    if KINDS[test].size_per_count and per_count is not None and per_count > 1.5:
        return round(per_count)
    if test == "all_reduce" and ratio is not None and 0.9 <= ratio < 2.0:
        return max(2, round(2 / (2 - ratio)))
    if KINDS[test].size_per_count and ratio is not None and 0.4 <= ratio < 1.0:
        return max(2, round(1 / (1 - ratio)))
    return None


def parse_nccl_tests(text: str, source: str = "<text>", test: str | None = None,
                     num_ranks: int | None = None) -> NcclTestsTable:
    """Read the result table of one nccl-tests run.

    ``test`` (one of :data:`TESTS`) overrides detection; ``num_ranks`` is checked against what the table
    says and used when it says nothing.
    """
    if len(text) > MAX_FILE_BYTES:
        raise InputError(source, "", f"larger than {MAX_FILE_BYTES} characters")
    rows = _scan(text, source)
    if test:
        test = _normalize_test(test, source)
    elif rows.announced:
        test = _normalize_test(rows.announced, source)
    if rows.columns is None:
        raise InputError(source, "", "no nccl-tests result table (a '#  size  count  type ... time  algbw' "
                         "header, or rows in nccl-tests' column order) found")
    if not rows.samples:
        raise InputError(source, "", "the result table has no usable rows")
    listed = rows.ranks or None
    if test is None:
        test = _test_from_name(source) or _test_from_table(rows.ratio, rows.per_count, rows.redop, listed, source)
    shape = _ranks_from_shape(test, rows.ratio, rows.per_count)
    ranks = listed if listed and listed >= 2 else shape
    if num_ranks is not None:
        for seen, how in ((listed if listed and listed >= 2 else None, "'#  Rank' lines"),
                          (shape, "size/count and busbw/algbw columns")):
            if seen is not None and seen != num_ranks:
                raise InputError(source, "--ranks", f"is {num_ranks} but the table's {how} say {seen} ranks; "
                                 "drop --ranks or fit the right file")
        ranks = num_ranks
    if test != "sendrecv" and (ranks is None or ranks < 2):
        if listed == 1:
            raise InputError(source, "ranks", f"the file lists one '#  Rank' line: a 1-rank {test} moves nothing "
                             "between GPUs; if the file holds only part of the output, pass --ranks N")
        raise InputError(source, "ranks", "cannot tell the number of ranks (no '#  Rank' lines); pass --ranks")
    return NcclTestsTable(source, test, ranks, rows.samples, rows.skipped, len(rows.hosts) or None,
                          rows.ratio, rows.per_count)


def _row_samples(columns, tokens: list[str], size: int) -> list[Sample] | None:
    """The row's out-of-place and in-place samples, or None when the row reports wrong results."""
    out = []
    time_cols = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
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
    kind = KINDS[test]
    n = num_ranks or 2
    return float(kind.steps(n)), float(kind.busbw_factor(n))


def _bandwidth_means(test: str, nodes: int | None) -> str:
    if nodes and nodes > 1:
        return (f"bus bandwidth across {nodes} nodes (what nccl-tests' busbw tends to: the per-GPU share of the "
                "slowest hop, usually the network), not the bandwidth of one link")
    if test == "sendrecv":
        return "bandwidth of the link between the pair"
    return f"bandwidth of one link of NCCL's ring ({test} busbw at large sizes)"


def _span(sizes) -> str:
    sizes = sorted(set(sizes))
    if not sizes:
        return "no sizes"
    return f"{format_size(sizes[0])}..{format_size(sizes[-1])} ({len(sizes)} size{'s' * (len(sizes) > 1)})"


def _judge(fit: LinkFit, chosen: list[Sample]) -> tuple[str, ...]:
    warnings = []
    if fit.alpha_us > ALPHA_IMPLAUSIBLE_US:
        warnings.append(f"alpha {fit.alpha_us:.3g} us is implausible for one step (links take about 1-20 us): the "
                        "small sizes may be missing or launch-bound; fit a table that starts at a few bytes")
    steps, volume = _model_factors(fit.test, fit.num_ranks)
    best = max(volume * x.size_bytes / x.time_us / BYTES_PER_US_PER_GBPS for x in chosen)
    if best < BANDWIDTH_REACHED * fit.bw_GBps:
        warnings.append(f"the fitted bandwidth {fit.bw_GBps:.4g} GB/s is above every measured row (the best reaches "
                        f"{best:.4g} GB/s): the table never becomes bandwidth-bound, so the bandwidth is an "
                        "extrapolation; measure larger sizes")
    if fit.rel_rms_error > RESIDUAL_LARGE:
        warnings.append(f"relative RMS residual {100 * fit.rel_rms_error:.1f}% is large: the times do not follow "
                        "alpha + size/bw (NCCL switches protocols/algorithms across sizes); fit one size range with "
                        "--min-bytes/--max-bytes")
    for side, sizes in (("alpha", fit.alpha_sizes), ("the bandwidth", fit.bandwidth_sizes)):
        if len(set(sizes)) < 2:
            warnings.append(f"only {len(set(sizes))} size(s) fed {side}, so it is poorly determined; measure a wider "
                            "size range")
    return tuple(warnings)


def fit_table(table: NcclTestsTable, label: str | None = None, min_bytes: int = 0,
              max_bytes: int | None = None) -> LinkFit:
    """Fit one parsed table to its test's model; alpha in us, bandwidth in GB/s, with a quality report."""
    chosen = [x for x in table.samples if x.size_bytes >= min_bytes and (max_bytes is None or x.size_bytes <= max_bytes)]
    if table.test != "sendrecv" and not table.num_ranks:
        raise InputError(table.source, "ranks", "cannot tell the number of ranks (no '#  Rank' lines); pass --ranks")
    try:
        line = fit_line([x.size_bytes for x in chosen], [x.time_us for x in chosen])
    except ValueError as exc:
        raise InputError(table.source, "time", f"cannot fit alpha and bandwidth: {exc}") from None
    steps, volume = _model_factors(table.test, table.num_ranks)
    if volume <= 0:
        raise InputError(table.source, "ranks", f"{table.num_ranks} rank(s) move nothing between GPUs; pass --ranks")
    alpha = line.intercept_us / steps
    bw = volume / line.slope_us_per_byte / BYTES_PER_US_PER_GBPS
    latency_bound = [x.size_bytes for x in chosen if line.intercept_us >= line.slope_us_per_byte * x.size_bytes]
    bandwidth_bound = [x.size_bytes for x in chosen if line.intercept_us < line.slope_us_per_byte * x.size_bytes]
    fit = LinkFit(label or Path(table.source).stem, table.source, table.test, table.num_ranks, alpha, bw,
                  len(chosen), line.rel_rms_error, table.num_nodes, _bandwidth_means(table.test, table.num_nodes),
                  tuple(sorted(set(latency_bound))), tuple(sorted(set(bandwidth_bound))))
    return replace(fit, warnings=_judge(fit, chosen))


def describe_fit(fit: LinkFit) -> list[str]:
    """The fit-quality lines ``synth profile fit`` prints under a fit."""
    return [f"  bandwidth means: {fit.bandwidth_means}",
            f"  alpha fed by {_span(fit.alpha_sizes)}; bandwidth fed by {_span(fit.bandwidth_sizes)}; relative RMS "
            f"residual {100 * fit.rel_rms_error:.1f}%"]


def fit_nccl_tests(paths, test: str | None = None, num_ranks: int | None = None, min_bytes: int = 0,
                   max_bytes: int | None = None) -> list[LinkFit]:
    """Fit alpha (us) and bandwidth (GB/s) from nccl-tests output files, one :class:`LinkFit` per file.

    Each file is one link class (e.g. ``sendrecv_perf`` between two GPUs of a node for NVLink, between two
    nodes for the network); the label is the file's stem. ``test`` overrides what the files say;
    ``num_ranks`` is checked against it.

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
        table = parse_nccl_tests(_read(path), str(path), test, num_ranks)
        fits.append(fit_table(table, min_bytes=min_bytes, max_bytes=max_bytes))
    return fits
