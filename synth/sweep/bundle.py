"""The algorithm bundle: one executed MSCCL XML per size range, a README, and the frontier document.

:func:`plan_bundle` picks the fastest algorithm per size (:mod:`synth.sweep.sizes`), tiles the size range and
lowers each range's algorithm to MSCCL XML through :func:`backends.msccl.writer.emit_verified_xml` (lowered with
the topology, read back and judged as ``synth check`` judges a file, timed). "Fastest" is the simulator's time
of the algorithm's written file (:class:`SimulatedTimes`: the runtime's FIFO depth and switch-port sharing;
DESIGN section 6), and that is the time the bundle reports; the replay stays as each timing's ``plan_us``. An
algorithm that cannot be emitted is excluded (with the reason) and the choice is made again without it, so
every file in the bundle has been executed.

Layout of an output directory (written by :func:`write_bundle`; every file atomically)::

    DIR/frontier.json      every point, option, status, time and version (frontier_document)
    DIR/README.txt         how to run the bundle with nccl-tests
    DIR/msccl/NN-*.xml     the bundle: point MSCCL_ALGO_DIR here (nothing else lives in it)

The README stays outside ``msccl/`` because the runtime tries to load every file in ``MSCCL_ALGO_DIR``.
"""

from __future__ import annotations

import json
import math
import platform
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

from backends.msccl.ir import safe_name
from backends.msccl.ir import MscclProgram
from backends.msccl.selection import size_range_attributes
from backends.msccl.simulate import simulate_program
from backends.msccl.writer import emit_verified_xml
from synth import __version__
from synth.errors import BackendError, VerificationError
from synth.fileio import OutputPlan, write_atomic
from synth.sweep.frontier import Frontier
from synth.sweep.sizes import Algorithm, SizeChoice, SizeRange, choose_per_size, tile_ranges
from synth.sweep.sources import SourceFailure
from synth.model.topology import Topology

BUNDLE_DIR = "msccl"
FORMAT = "synth-pareto/1"
_OUR_XML = re.compile(r"^\d\d-.*\.xml$")
_PERF_BINARY = {"allgather": "all_gather_perf", "reducescatter": "reduce_scatter_perf",
                "allreduce": "all_reduce_perf", "alltoall": "alltoall_perf", "broadcast": "broadcast_perf",
                "reduce": "reduce_perf", "gather": "gather_perf", "scatter": "scatter_perf"}


@dataclass(frozen=True)
class BundleFile:
    """One XML of the bundle: its file name, the algorithm, its inclusive size range (bytes) and the text.

    The top file also serves every larger size (``unbounded``); ``max_bytes_attribute`` is the ``maxBytes`` that
    says so in the target runtime's own terms (:func:`backends.msccl.selection.size_range_attributes`).
    """

    file_name: str
    key: str
    min_bytes: int
    max_bytes: int
    text: str
    fused: bool
    unbounded: bool = False
    max_bytes_attribute: int = 0


@dataclass(frozen=True)
class BundlePlan:
    """The per-size verdicts, the ranges, the emitted files, and algorithms excluded with the reason."""

    choices: tuple[SizeChoice, ...]
    ranges: tuple[SizeRange, ...]
    files: tuple[BundleFile, ...]
    excluded: tuple[tuple[str, str], ...]


class SimulatedTimes:
    """The per-size timer of the bundle: an algorithm is written once, when first timed
    (:func:`emit_verified_xml` at :meth:`written_at`, which also picks its lowering), and its program is
    simulated at every size asked (microseconds, cached). An algorithm the runtime refuses times as infinite and
    is in :attr:`refused` with the reason."""

    def __init__(self, topology: Topology, target: str, proto: str, reference_bytes: int):
        self.topology = topology
        self.target = target
        self.proto = proto
        self.reference_bytes = reference_bytes
        self.refused: dict[str, str] = {}
        self._programs: dict[str, MscclProgram] = {}
        self._times: dict[tuple[str, int], float] = {}

    def written_at(self, algorithm: Algorithm) -> int:
        """The size the algorithm's file is written (and its lowering chosen) at: its own, else the reference."""
        return algorithm.tuned_bytes or self.reference_bytes

    def __call__(self, algorithm: Algorithm, topology: Topology, size_bytes: int) -> float:
        key = algorithm.key
        if key in self.refused:
            return math.inf
        if key not in self._programs:
            try:
                emitted = emit_verified_xml(algorithm.schedule, self.topology, self.target, self.written_at(algorithm),
                                            proto=self.proto)
            except (BackendError, VerificationError) as exc:
                self.refused[key] = str(exc)
                return math.inf
            self._programs[key] = emitted.program
        if (key, size_bytes) not in self._times:
            self._times[(key, size_bytes)] = simulate_program(self._programs[key], topology, size_bytes).time_us
        return self._times[(key, size_bytes)]


def plan_bundle(algorithms: Iterable[Algorithm], topology: Topology, sizes: tuple[int, ...], low: int, high: int,
                target: str = "executor", proto: str = "Simple",
                limit_us: Callable[[int], float | None] = lambda size: None) -> BundlePlan:
    """Choose per size by simulated time, tile ``low..high``, emit one XML per range (excluding algorithms that
    fail to emit, and choosing again without them).

    Each file's ``minBytes``/``maxBytes`` select exactly its range in the target runtime's terms (legacy's top is
    exclusive), and the top file has no upper limit (executor ``maxBytes="0"``, legacy the largest int64)."""
    algorithms = list(algorithms)
    simulated = SimulatedTimes(topology, target, proto, max(sizes))
    excluded: dict[str, str] = {}
    while True:
        usable = [a for a in algorithms if a.key not in excluded]
        choices = choose_per_size(usable, topology, sizes, limit_us, time_us=simulated)
        if any(key not in excluded for key in simulated.refused):
            excluded.update(simulated.refused)
            continue
        ranges = tile_ranges(choices, usable, topology, low, high, time_us=simulated)
        by_key = {a.key: a for a in usable}
        files, failed = [], None
        for i, r in enumerate(ranges):
            alg = by_key[r.key]
            computes = alg.schedule.computes
            name = safe_name(f"synth-{computes}-{r.key}-{r.min_bytes}-{r.max_bytes}")
            at = simulated.written_at(alg)     # the lowering its times were simulated with
            top = i == len(ranges) - 1
            min_attr, max_attr = size_range_attributes(target, r.min_bytes, None if top else r.max_bytes)
            try:
                emitted = emit_verified_xml(alg.schedule, topology, target, at, proto=proto, name=name,
                                            min_bytes=min_attr, max_bytes=max_attr)
            except (BackendError, VerificationError) as exc:
                failed = (r.key, str(exc))
                break
            files.append(BundleFile(f"{i:02d}-{computes}-{r.key}.xml", r.key, r.min_bytes, r.max_bytes,
                                    emitted.text, emitted.fused, top, max_attr))
        if failed is None:
            return BundlePlan(choices, ranges, tuple(files), tuple(sorted(excluded.items())))
        excluded[failed[0]] = failed[1]


def readme_text(plan: BundlePlan, algorithms: Iterable[Algorithm], collective: str, topology: Topology,
                target: str) -> str:
    """Plain-text instructions for running the bundle with nccl-tests."""
    labels = {a.key: a.label for a in algorithms}
    n, per_node = topology.num_ranks, topology.gpus_per_node
    binary = _PERF_BINARY[collective]
    lines = [f"synth pareto bundle: {collective} on {topology.name} ({n} ranks, {topology.num_nodes} node(s)), "
             f"MSCCL target {target}", "",
             f"{BUNDLE_DIR}/ holds one MSCCL XML algorithm per size range; the runtime picks the file whose",
             "size range (inclusive, in bytes of nccl-tests' buffer size) contains the call's size; the last one",
             "also serves every larger size:", ""]
    for f in plan.files:
        top = "and up" if f.unbounded else str(f.max_bytes)
        lines.append(f"  {f.file_name:44s} {f.min_bytes:>12d} .. {top:<12s} {labels.get(f.key, f.key)}")
    lines += ["", "Run with nccl-tests (https://github.com/NVIDIA/nccl-tests) built against NCCL with MSCCL:", ""]
    if target == "executor":
        lines += [f"  export MSCCL_ALGO_DIR=$PWD/{BUNDLE_DIR}",
                  "  (NCCL >= 2.23 with the MSCCL executor loads every file in MSCCL_ALGO_DIR; NCCL_ALGO=MSCCL",
                  "  is not needed: the executor selects by size range itself)"]
    else:
        files = ":".join(f"$PWD/{BUNDLE_DIR}/{f.file_name}" for f in plan.files[:4])
        lines += [f"  export MSCCL_XML_FILES={files}",
                  "  (the legacy MSCCL fork of NCCL 2.12 takes at most 4 files" +
                  (f"; this bundle has {len(plan.files)}, so only the first 4 ranges are listed)" if len(plan.files) > 4
                   else ")"),
                  "  (it selects a file only when the call's in-place-ness equals the file's inplace attribute, so",
                  "  calls of the other kind run NCCL's own algorithm; nccl-tests reports both columns)"]
    low = _nccl_tests_size(plan.ranges[0].min_bytes) if plan.ranges else "1K"
    high = _nccl_tests_size(plan.ranges[-1].max_bytes) if plan.ranges else "1G"
    if topology.num_nodes > 1:
        hosts = ",".join(f"<host{k + 1}>:{per_node}" for k in range(topology.num_nodes))
        launch = (f"  mpirun -np {n} -N {per_node} -H {hosts} "
                  f"-x {'MSCCL_ALGO_DIR' if target == 'executor' else 'MSCCL_XML_FILES'} \\\n"
                  f"      ./build/{binary} -b {low} -e {high} -f 2 -g 1")
    else:
        launch = f"  ./build/{binary} -b {low} -e {high} -f 2 -g {n}"
    lines += ["", launch, "",
              "Sizes outside the ranges, and sizes whose element count is not a multiple of an algorithm's",
              "nchunksperloop, silently run NCCL's own algorithms. Re-check any file before use:",
              f"  synth check {BUNDLE_DIR}/<file>.xml", ""]
    return "\n".join(lines)


def _nccl_tests_size(size_bytes: int) -> str:
    """A size as nccl-tests' -b/-e read it (``1K``, ``64M``, ``1G``, else bytes)."""
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size_bytes >= factor and size_bytes % factor == 0:
            return f"{size_bytes // factor}{unit}"
    return str(size_bytes)


def versions() -> dict:
    """Versions of everything that can change a result."""
    out = {"synth": __version__, "python": platform.python_version()}
    for pkg in ("highspy", "numpy", "networkx", "distributed"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def frontier_document(frontier: Frontier, topology: Topology, stage: str, plan: BundlePlan | None = None,
                      algorithms: Iterable[Algorithm] = (), failures: Iterable[SourceFailure] = (),
                      extra: dict | None = None) -> dict:
    """The content of ``frontier.json``. ``stage`` is ``sweeping`` while the step search runs (the file is
    rewritten after every instance), ``sizes`` while candidates are timed, ``done`` at the end. Keys ending in
    ``_seconds`` are timings; everything else is the same whoever solved the instances (up to time limits)."""
    algorithms = list(algorithms)
    on_frontier = {p.instance for p in frontier.frontier}
    doc = {"format": FORMAT, "stage": stage, "collective": frontier.spec.collective, "topology": topology.name,
           "ranks": topology.num_ranks, "nodes": topology.num_nodes, "options": frontier.spec.to_dict(),
           "versions": versions(), "stop_reason": frontier.stop_reason, "complete": frontier.complete,
           "search_seconds": frontier.seconds,
           "frontier": [[p.steps, p.rounds, p.chunks] for p in frontier.frontier],
           "points": [dict(p.to_dict(), on_frontier=p.instance in on_frontier,
                           schedule=p.schedule.to_dict() if p.schedule is not None and p.instance in on_frontier
                           else None)
                      for p in frontier.points]}
    if extra:
        doc.update(extra)
    if algorithms:
        doc["algorithms"] = [{"key": a.key, "kind": a.kind.value, "label": a.label, "steps": a.schedule.steps,
                              "chunks_per_rank": a.schedule.collective.chunks_per_rank,
                              "nchunksperloop": a.nchunksperloop, "transfers": len(a.schedule.transfers)}
                             for a in algorithms]
    doc["failures"] = [f.to_dict() for f in failures]
    if plan is not None:
        doc["sizes"] = [{"size_bytes": c.size_bytes, "chosen": c.chosen, "best_baseline": c.best_baseline,
                         "limit_us": c.limit_us,
                         "timings": [{"key": t.key, "time_us": t.time_us, "plan_time_us": t.plan_us,
                                      "simulated": t.timed, "algbw_GBps": t.algbw_GBps, "busbw_GBps": t.busbw_GBps,
                                      "runnable": t.runnable} for t in c.timings]}
                        for c in plan.choices]
        doc["bundle"] = [{"file": f"{BUNDLE_DIR}/{f.file_name}", "key": f.key, "min_bytes": f.min_bytes,
                          "max_bytes": f.max_bytes, "unbounded": f.unbounded, "maxBytes": f.max_bytes_attribute,
                          "fused": f.fused} for f in plan.files]
        doc["excluded"] = [{"key": k, "reason": r} for k, r in plan.excluded]
    return doc


def write_document(out_dir: str | Path, doc: dict) -> Path:
    """Write ``frontier.json`` atomically (called after every point, so an interrupted sweep keeps its points)."""
    path = Path(out_dir) / "frontier.json"
    write_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def write_bundle(out_dir: str | Path, plan: BundlePlan, readme: str) -> list[Path]:
    """Write the XMLs into ``DIR/msccl`` and ``DIR/README.txt`` together (:class:`~synth.fileio.OutputPlan`:
    every temporary file first, then the renames), then remove our own stale ``NN-*.xml`` from an earlier run,
    so the directory never holds overlapping ranges."""
    out = Path(out_dir)
    bundle = out / BUNDLE_DIR
    bundle.mkdir(parents=True, exist_ok=True)
    outputs = OutputPlan()
    for f in plan.files:
        outputs.declare(f.file_name, bundle / f.file_name)
        outputs.stage(f.file_name, f.text)
    outputs.declare("README.txt", out / "README.txt")
    outputs.stage("README.txt", readme)
    written = outputs.commit()
    keep = {f.file_name for f in plan.files}
    for old in bundle.iterdir():
        if _OUR_XML.match(old.name) and old.name not in keep:
            old.unlink()
    return written
