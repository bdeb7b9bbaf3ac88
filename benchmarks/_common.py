"""Helpers shared by the benchmark scripts: repeat-and-take-the-median timing, a table printer, JSON output."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn, repeat: int = 3):
    """Run ``fn`` ``repeat`` times; return (median seconds, last result)."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))


def results_path(name: str) -> Path:
    """``results/{name}.json`` for a bare name; a name ending in ``.json`` is the file itself
    (``--out /tmp/q.json``)."""
    return Path(name) if name.endswith(".json") else RESULTS / f"{name}.json"


def write_json(name: str, rows: list[dict], **meta_extra) -> Path:
    """``results_path(name)``: the rows, and meta (Python, machine, date, and ``meta_extra``)."""
    path = results_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "when": time.strftime("%Y-%m-%d"),
            **meta_extra}
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return path
