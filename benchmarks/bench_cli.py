"""How long ``synth --help`` takes next to ``python -c "import click"`` (target: at most 1.5x), in one run.

Each command is started ``REPEATS`` times as a fresh process; the median wall time is reported.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from _common import print_table, write_json

REPEATS = 15
COMMANDS = {
    "import click": [sys.executable, "-c", "import click"],
    "synth --help": [sys.executable, "-m", "synth", "--help"],
    "synth solve --help": [sys.executable, "-m", "synth", "solve", "--help"],
}


def median_seconds(argv: list[str]) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    rows = {name: median_seconds(argv) for name, argv in COMMANDS.items()}
    base = rows["import click"]
    table = [{"command": n, "median_seconds": round(s, 4), "ratio_to_import_click": round(s / base, 2)}
             for n, s in rows.items()]
    print_table(table, ["command", "median_seconds", "ratio_to_import_click"])
    print(f"wrote {write_json('cli', table)}")


if __name__ == "__main__":
    main()
