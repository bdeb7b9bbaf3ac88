"""Hostile-input fuzzing shared by the suite (tests/test_fuzz_*.py) and ``benchmarks/bench_fuzz.py``.

Every input surface is a :class:`Surface`: seed files the project writes itself (valid inputs), a file suffix,
and the ``synth`` command line that reads such a file. :func:`mutate` turns a seed into a hostile variant (byte
flips, truncation, spliced slices, and JSON values swapped for hostile ones: NaN, 1e999, huge or negative
counts, wrong types, superscript digits), and :func:`run_case` runs one command in-process with click's
CliRunner under a wall-clock limit and classifies the outcome:

- ``ok``: exit 0; ``error``: a non-zero exit with one ``Error:`` line or a click usage error;
- ``traceback``: any other exception escaped the command (or the error took more than one line);
- ``hang``: the command ran past the limit.
"""

from __future__ import annotations

import copy
import json
import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]

# JSON values an attacker or a careless user puts where a number, a string or a list belongs
HOSTILE_VALUES = [None, True, False, 0, -1, 1.5, 1024, 4096, 65536, 10 ** 9, 10 ** 20, -10 ** 9, 1e-300, 1e300,
                  "1e999", "NaN", "", "fast", "¹", "٣", "0x10", [], [[]], {}, {"a": 1}, [1, 2, 3], "a" * 300, -0.0]
HOSTILE_TEXT = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1", b"1000000000", b"\xff\xfe", b"\x00",
                b"[[[[[[[[", b"}}}}", b'"\\ud800"', b"true", b"null", b"\xc2\xb9", b"0.4", b"-0"]


@dataclass(frozen=True)
class Surface:
    """One input format and the command that reads it (``{path}`` is replaced by the file)."""

    name: str
    suffix: str
    seeds: Callable[[], list[bytes]]
    argv: tuple[str, ...]
    structured: bool = True      # JSON: also mutate values in the parsed document


def _topology_seeds() -> list[bytes]:
    return [(ROOT / "topologies" / f"{n}.json").read_bytes() for n in ("dgx1", "ndv2-2node-tecc", "dgx2")]


def _taccl_topology_seeds() -> list[bytes]:
    cube = {"name": "Cube_1MB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.5,
            "node_betas_list": [25, 50], "node_invbws_list": [25.5, 50.5],
            "remote_alpha": 3, "remote_beta": 100, "remote_invbw": 103}
    custom = {"name": "Custom_1MB", "gpus_per_node": 3, "alpha": 1.0,
              "links": [[0, 1, 2], [1, 0, 1], [2, 1, 0]], "betas": [[0, 20, 10], [20, 0, 20], [10, 20, 0]]}
    return [json.dumps(cube).encode(), json.dumps(custom).encode()]


def _sketch_seeds() -> list[bytes]:
    return [(ROOT / "sketches" / f"{n}.json").read_bytes() for n in ("ndv2-tecc-relay", "ndv2-nic-relay")]


def _taccl_sketch_seeds() -> list[bytes]:
    sketch = {"intranode_sketch": {"strategy": "switch", "switch_hyperedge_strategy": ["uc-min"]},
              "internode_sketch": {"strategy": "relay", "internode_conn": {"1": [0]},
                                   "gpus_to_sender_rev_map": {"1": [0, 1, 2, 3, 4, 5, 6, 7]},
                                   "enforce_ordering": True},
              "symmetry_offsets": [[8, 16]], "hyperparameters": {"input_chunkup": 2}}
    return [json.dumps(sketch).encode()]


def _schedule_seeds() -> list[bytes]:
    from synth.model.topology import load_topology
    from synth.synthesis.baselines import build_baseline

    ring = load_topology("ring-4")
    return [build_baseline("ring", c, ring, 1, None).to_json().encode() for c in ("allgather", "allreduce")]


def _nccl_dump_seeds() -> list[bytes]:
    return [(ROOT / "tests" / "data" / "nccl" / n).read_bytes() for n in ("dgx1_v100.xml", "pcie_4gpu.xml")]


def _msccl_seeds() -> list[bytes]:
    from backends.msccl.writer import emit_verified_xml
    from synth.model.topology import load_topology
    from synth.synthesis.baselines import build_baseline

    ring = load_topology("ring-4")
    return [emit_verified_xml(build_baseline("ring", c, ring, 1, None), ring, "executor", 1 << 20).text.encode()
            for c in ("allgather", "allreduce")]


def _nccl_tests_seeds() -> list[bytes]:
    columns = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
               "busbw", "#wrong")
    rows = ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place", "# " + " ".join(f"{c:>8}" for c in columns),
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)"
            "  (GB/s)"]
    size = 1024
    for _ in range(12):
        t = 5.0 + size / 20e3
        rows.append(f"{size:12d} {size // 4:13d}     float    none      -1 {t:8.2f} {size / t / 1e3:7.2f} "
                    f"{size / t / 1e3:7.2f}      0 {t:8.2f} {size / t / 1e3:7.2f} {size / t / 1e3:7.2f}      0")
        size *= 4
    text = "# Collective test starting: sendrecv_perf\n" + "\n".join(rows) + "\n# Avg bus bandwidth    : 1.0\n"
    return [text.encode()]


SURFACES = {
    "topology": Surface("topology", ".json", _topology_seeds, ("topo", "show", "{path}")),
    "taccl-topology": Surface("taccl-topology", ".json", _taccl_topology_seeds, ("topo", "show", "{path}")),
    "sketch": Surface("sketch", ".json", _sketch_seeds,
                      ("solve", "allgather", "-t", "ndv2-2node-tecc", "--sketch", "{path}", "--method", "routed",
                       "--chunks", "1", "--no-baseline", "--time-limit", "2")),
    "taccl-sketch": Surface("taccl-sketch", ".json", _taccl_sketch_seeds,
                            ("solve", "allgather", "-t", "ndv2-2node-tecc", "--sketch", "{path}", "--method",
                             "routed", "--chunks", "1", "--no-baseline", "--time-limit", "2")),
    "schedule-simulate": Surface("schedule-simulate", ".json", _schedule_seeds,
                                 ("simulate", "{path}", "-t", "ring-4", "--size", "1MB")),
    "schedule-export": Surface("schedule-export", ".json", _schedule_seeds,
                               ("export", "nccl-graph", "{path}", "--topology", "ring-4")),
    "nccl-dump": Surface("nccl-dump", ".xml", _nccl_dump_seeds, ("topo", "import-nccl", "{path}"), False),
    "msccl-xml": Surface("msccl-xml", ".xml", _msccl_seeds, ("check", "{path}"), False),
    "nccl-tests": Surface("nccl-tests", ".txt", _nccl_tests_seeds, ("profile", "fit", "{path}"), False),
}


# ----------------------------------------------------------------------------------------------- mutation

def mutate(seed: bytes, rng: random.Random, structured: bool) -> bytes:
    """A hostile variant of ``seed``: one to three byte-level or (for JSON) value-level mutations."""
    data = seed
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if structured and rng.random() < 0.6:
            data = _mutate_json(data, rng)
        else:
            data = _mutate_bytes(data, rng)
    return data


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return rng.choice(HOSTILE_TEXT)
    i = rng.randrange(len(data))
    kind = rng.randrange(6)
    if kind == 0:                                   # flip a byte
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
    if kind == 1:                                   # truncate
        return data[:i]
    if kind == 2:                                   # insert a hostile token
        return data[:i] + rng.choice(HOSTILE_TEXT) + data[i:]
    if kind == 3:                                   # duplicate a slice
        j = min(len(data), i + rng.randint(1, 200))
        return data[:j] + data[i:j] + data[j:]
    if kind == 4:                                   # delete a slice
        return data[:i] + data[i + rng.randint(1, 50):]
    digits = [k for k, b in enumerate(data) if 0x30 <= b <= 0x39]   # replace a number's digit
    if not digits:
        return data
    k = rng.choice(digits)
    return data[:k] + rng.choice([b"9" * 12, b"-1", b"1e999", b"0", b"0.5", b"\xc2\xb9"]) + data[k + 1:]


def _mutate_json(data: bytes, rng: random.Random) -> bytes:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return _mutate_bytes(data, rng)
    paths = list(_paths(doc))
    if not paths:
        return _mutate_bytes(data, rng)
    path = rng.choice(paths)
    kind = rng.randrange(4)
    if kind == 0:
        value = rng.choice(HOSTILE_VALUES)
        value = float(value) if value in ("NaN", "1e999") and rng.random() < 0.5 else value
    elif kind == 1:                                  # a sibling's value (type confusion within the format)
        value = copy.deepcopy(_get(doc, rng.choice(paths)))
    elif kind == 2:                                  # delete
        parent = _get(doc, path[:-1])
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif isinstance(parent, list) and path[-1] < len(parent):
            del parent[path[-1]]
        return json.dumps(doc).encode()
    else:                                            # wrap in a list or an object
        value = rng.choice([[copy.deepcopy(_get(doc, path))], {"x": copy.deepcopy(_get(doc, path))}])
    doc = _set(doc, path, value)
    text = json.dumps(doc, allow_nan=True)
    if rng.random() < 0.2 and isinstance(_get(doc, path[:-1]) if path else None, dict):   # superscript key
        text = text.replace(json.dumps(str(path[-1])), json.dumps(str(path[-1]) + "¹"), 1)
    return text.encode()


def _paths(doc, prefix=()):
    if prefix:
        yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for k, value in enumerate(doc[:20]):
            yield from _paths(value, prefix + (k,))


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _set(doc, path, value):
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


# ----------------------------------------------------------------------------------------------- running

class Hang(BaseException):
    """Raised by the timer inside a command that runs past its limit (a BaseException: nothing catches it)."""


@dataclass(frozen=True)
class Outcome:
    kind: str            # ok, error, traceback, hang
    exit_code: int | None
    detail: str


def run_case(argv: list[str], limit_s: float = 10.0) -> Outcome:
    """Run ``synth ARGV`` in-process under a wall-clock limit and classify it (module docstring)."""
    from click.testing import CliRunner

    from synth.cli import main

    def expire(signum, frame):
        raise Hang

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        result = CliRunner().invoke(main, argv, catch_exceptions=True)
    except Hang:
        return Outcome("hang", None, f"ran past {limit_s} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return classify(result)


def classify(result) -> Outcome:
    stderr = result.stderr if hasattr(result, "stderr") else result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        text = "".join(traceback.format_exception(result.exception))
        return Outcome("traceback", result.exit_code, text[-2000:])
    if result.exit_code == 0:
        return Outcome("ok", 0, "")
    if result.exception is not None and "INVALID:" in result.stdout:   # synth check's verdict on a bad program
        return Outcome("error", result.exit_code, result.stdout.strip().splitlines()[-1])
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    if result.exit_code == 2 and errors:               # click usage error: usage, hint, then one Error line
        return Outcome("error", 2, errors[-1])
    if len(errors) == 1 and lines[-1].startswith("Error:"):
        return Outcome("error", result.exit_code, errors[0])
    return Outcome("traceback", result.exit_code, "not one Error: line: " + stderr[-500:])


def argv_for(surface: Surface, path: Path) -> list[str]:
    return [str(path) if part == "{path}" else part for part in surface.argv]


# ----------------------------------------------------------------------------------------------- options, paths

# Values typed where a number, a size, a name or an address belongs (argv never holds a NUL byte).
OPTION_VALUES = ["nan", "inf", "-inf", "-1", "0", "0.4", "1e999", "99999999999999999999", "1KB", "1:2", "", "abc",
                 "¹", "0x10", "1e3", " 4 ", "-0", "4096", "4097", "1024TB", "1025TB", "0.4:1KB", "1KB:1GB", "1B:1B",
                 "tcp://x:1", "tcp://:x", "[::1]:99999", "2", "3", "1", "64KB", "1000000000", "ring-4", "dgx1",
                 "fully-connected-2000", "ring-1", "ring-99999999999"]
# (argv template, option slots): {v} slots are filled from OPTION_VALUES, {schedule}/{xml} with valid files
OPTION_COMMANDS = [
    ("bounds", "allgather", "-t", "ring-4", "--size", "{v}", "--chunks", "{v}"),
    ("bounds", "broadcast", "-t", "{v}", "--size", "1KB", "--nodes", "{v}", "--root", "{v}"),
    ("baseline", "ring", "allgather", "-t", "ring-4", "--size", "{v}", "--chunks", "{v}", "--root", "{v}"),
    ("simulate", "{schedule}", "-t", "ring-4", "--size", "{v}", "--reduce-us-per-byte", "{v}", "--nodes", "{v}"),
    ("check", "{xml}", "--fifo-depth", "{v}"),
    ("topo", "show", "{v}", "--nodes", "{v}"),
    ("export", "nccl-graph", "{schedule}", "--topology", "{v}", "--nodes", "{v}"),
    ("pareto", "allgather", "-t", "ring-4", "--sizes", "{v}", "--budget", "{v}", "--max-steps", "2", "--max-chunks",
     "1", "--workers", "1", "--time-limit", "2", "--no-alpha-beta", "--no-baselines", "-q"),
    ("pareto", "allgather", "-t", "ring-4", "--scheduler", "{v}", "--method", "{v}", "--root", "{v}", "--sizes",
     "none", "--max-steps", "2", "--max-chunks", "1", "-q"),
    ("profile", "fit", "{nccl_tests}", "--ranks", "{v}", "--min-bytes", "{v}", "--max-bytes", "{v}"),
]
# Output paths: names in a scratch directory holding a file, a FIFO and a directory
PATH_VALUES = ["", "/", ".", "dir", "dir/", "dir/new.out", "file", "file/x", "fifo", "/dev/null", "nodir/x",
               "a" * 300, "a" * 300 + "/b", "new.out", "new.out/", "dir/../new.out", "-", "~/x", "/proc/self/x"]
PATH_COMMANDS = [
    ("baseline", "ring", "allgather", "-t", "ring-4", "--size", "1KB", "-o", "{p}", "--schedule-out", "{p}"),
    ("export", "nccl-graph", "{schedule}", "--topology", "ring-4", "-o", "{p}"),
    ("simulate", "{schedule}", "-t", "ring-4", "--trace", "{p}"),
    ("topo", "import-nccl", "{dump}", "-o", "{p}"),
    ("pareto", "allgather", "-t", "ring-4", "-o", "{p}", "--sizes", "none", "--max-steps", "2", "--max-chunks", "1",
     "-q", "--workers", "1"),
]


def scratch_files(folder: Path) -> dict[str, str]:
    """Write the valid files option and path cases read (and the scratch entries paths point at)."""
    files = {key: folder / name for key, name in zip(("schedule", "xml", "dump", "nccl_tests"), INPUT_NAMES)}
    files["schedule"].write_bytes(_schedule_seeds()[0])
    files["xml"].write_bytes(_msccl_seeds()[0])
    files["dump"].write_bytes(_nccl_dump_seeds()[0])
    files["nccl_tests"].write_bytes(_nccl_tests_seeds()[0])
    return {key: str(path) for key, path in files.items()}


INPUT_NAMES = ("schedule.json", "program.xml", "dump.xml", "sendrecv.txt")


def reset_scratch(folder: Path) -> None:
    """The entries output-path cases point at: ``file`` (regular), ``fifo``, ``dir``; nothing else but the
    inputs of :func:`scratch_files` (and a mutated ``case.*``) is left over from an earlier case."""
    import os
    import shutil

    for path in folder.iterdir():
        if path.name in INPUT_NAMES or path.name.startswith("case."):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (folder / "dir").mkdir()
    (folder / "file").write_text("kept")
    os.mkfifo(folder / "fifo")


def option_case(rng: random.Random, files: dict[str, str]) -> list[str]:
    template = rng.choice(OPTION_COMMANDS)
    return [rng.choice(OPTION_VALUES) if part == "{v}" else files[part[1:-1]] if part[1:-1] in files else part
            for part in template]


def path_case(rng: random.Random, files: dict[str, str]) -> list[str]:
    template = rng.choice(PATH_COMMANDS)
    return [rng.choice(PATH_VALUES) if part == "{p}" else files[part[1:-1]] if part[1:-1] in files else part
            for part in template]
