"""Crafted hostile inputs (issue 14): each is refused with one exact ``Error:`` line and its exit code, before
any work (in well under a second), and no output file is written or replaced."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from click.testing import CliRunner

from synth.cli import main
from synth.errors import InputError
from synth.model.sketch import sketch_from_dict
from synth.model.taccl import taccl_sketch_to_dict
from synth.model.topology import load_topology
from synth.synthesis.baselines import build_baseline

ROOTS = "only broadcast, reduce, gather, scatter take one"
BASELINE = ["baseline", "ring", "allgather", "-t", "ring-4", "--size", "1KB"]


@pytest.fixture(scope="module")
def ring_schedule() -> dict:
    return json.loads(build_baseline("ring", "allgather", load_topology("ring-4"), 1, None).to_json())


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(argv: list[str]) -> tuple[int, str, float]:
    """Exit code, last stderr line, and CPU seconds of the run (CPU, not wall: "refused before any work" must not
    depend on how loaded the machine running the tests is)."""
    start = time.process_time()
    result = CliRunner().invoke(main, argv)
    seconds = time.process_time() - start
    assert isinstance(result.exception, SystemExit) or result.exception is None, result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.exit_code, lines[-1] if lines else "", seconds


def _schedule_file(raw: dict, name: str, change) -> str:
    doc = json.loads(json.dumps(raw))
    change(doc)
    with open(name, "w") as fh:
        json.dump(doc, fh)
    return name


SCHEDULE_CASES = [
    # (change, exact error after the file name)
    (lambda d: d["collective"].update(chunks_per_rank=10 ** 9),
     "collective.chunks_per_rank: must be an integer in 1..65536, got 1000000000"),
    (lambda d: d["collective"].update(num_ranks=10 ** 9),
     "collective.num_ranks: must be an integer in 2..4096, got 1000000000"),
    (lambda d: d["transfers"][0].update(op="xor"), "transfers[0].op: unknown op 'xor'; use copy or reduce"),
    (lambda d: d["transfers"][0].update(start_us=-1.0),
     "transfers[0].start_us: must be a finite time in us >= 0 (or null), got -1.0"),
    (lambda d: d.update(steps=0), "steps: must be an integer in 1..16777216, got 0"),
    (lambda d: d["transfers"].append(d["transfers"][0]),
     "transfers[12]: repeats chunk 0 0->1 at step 0; give each transfer once"),
    (lambda d: d["collective"].update(name="broadcast", root=99),
     "collective.root: must be an integer in 0..3, got 99"),
    (lambda d: d["collective"].update(root=1), "collective.root: allgather has no root; give null"),
    (lambda d: d["transfers"][0].update(chunk=4), "transfers[0].chunk: must be an integer in 0..3, got 4"),
    (lambda d: d["transfers"][0].update(src=7), "transfers[0].src: must be an integer in 0..3, got 7"),
    (lambda d: d["transfers"][0].update(dst=0, src=0), "transfers[0]: sends chunk 0 from rank 0 to itself"),
    (lambda d: d["transfers"][0].update(step=True), "transfers[0].step: must be an integer in 0..16777216, got True"),
    (lambda d: d["collective"].update(name=5), "collective.name: unknown collective 5; use one of allgather, "
     "reducescatter, allreduce, alltoall, broadcast, reduce, gather, scatter"),
    (lambda d: d["transfers"][0].update(end_us=0.0, start_us=1.0), "transfers[0].end_us: 0.0 is before start_us 1.0"),
    (lambda d: d["collective"].update(name="alltoall", num_ranks=1024),
     "collective: alltoall on 1024 ranks with 1 chunk(s) per rank has 1048576 chunks and 2097152 table entries, "
     "more than the 65536 and 2097152 a schedule file may describe"),
    (lambda d: d["collective"].update(num_ranks=8),
     "collective.num_ranks: the schedule is for 8 ranks but topology ring-4 has 4; give the topology it was made "
     "for"),
    (lambda d: d["transfers"][0].update(dst=2),
     "transfers[0]: sends 0->2, but topology ring-4 has no such link; give the topology it was made for"),
]


@pytest.mark.parametrize("command", ["simulate", "export"])
@pytest.mark.parametrize("change,message", SCHEDULE_CASES)
def test_schedule_files_are_refused_before_any_work(here, ring_schedule, command, change, message):
    path = _schedule_file(ring_schedule, "bad.json", change)
    argv = ["simulate", path, "-t", "ring-4"] if command == "simulate" else \
        ["export", "nccl-graph", path, "--topology", "ring-4", "-o", "graph.xml"]
    code, line, seconds = _run(argv)
    assert (code, line) == (1, f"Error: bad.json: {message}")
    assert seconds < 1.0
    assert not os.path.exists("graph.xml")


def test_infinite_times_in_a_schedule_are_refused(here, ring_schedule):
    path = _schedule_file(ring_schedule, "inf.json", lambda d: None)
    text = open(path).read().replace('"start_us": null', '"start_us": 1e999', 1)
    open(path, "w").write(text)
    code, line, _ = _run(["simulate", path, "-t", "ring-4"])
    assert (code, line) == (1, "Error: inf.json: transfers[0].start_us: must be a finite time in us >= 0 (or null), "
                               "got inf")


OPTION_CASES = [
    (["simulate", "x.json", "-t", "ring-4", "--reduce-us-per-byte", "nan"], 2,
     "Error: Invalid value for '--reduce-us-per-byte': 'nan' is not a finite number"),
    (["check", "x.xml", "--fifo-depth", "1000000000"], 2,
     "Error: Invalid value for '--fifo-depth': 1000000000 is not in the range 0<=x<=64."),
    (["pareto", "allgather", "-t", "ring-4", "--method", "bogus"], 2,
     "Error: Invalid value for '--method': 'bogus' is not one of 'auto', 'routed', 'timexp'."),
    (["pareto", "allgather", "-t", "ring-4", "--budget", "inf"], 2,
     "Error: Invalid value for '--budget': 'inf' is not a finite number"),
    (["pareto", "allgather", "-t", "ring-4", "--sizes", "0.4:1KB"], 1,
     "Error: --sizes: size '0.4' must be from 1 byte to 1024TB"),
    (["pareto", "allgather", "-t", "ring-4", "--sizes", "1KB:99999999TB"], 1,
     "Error: --sizes: size '99999999TB' must be from 1 byte to 1024TB"),
    (["pareto", "allgather", "-t", "ring-4", "--scheduler", "tcp://host:99999"], 1,
     "Error: --scheduler: cannot read address 'tcp://host:99999'; write e.g. tcp://host:8786"),
    (["pareto", "allgather", "-t", "ring-4", "--scheduler", "tcp://[::1"], 1,
     "Error: --scheduler: cannot read address 'tcp://[::1'; write e.g. tcp://host:8786"),
    (["bounds", "allgather", "-t", "ring-4", "--size", "1KB", "--root", "1"], 1,
     f"Error: --root: allgather has no root; drop --root ({ROOTS})"),
    (BASELINE + ["--root", "1"], 1, f"Error: --root: allgather has no root; drop --root ({ROOTS})"),
    (["pareto", "allreduce", "-t", "ring-4", "--root", "1"], 1,
     f"Error: --root: allreduce has no root; drop --root ({ROOTS})"),
    (["bounds", "allgather", "-t", "ring-4", "--size", "0.4"], 1,
     "Error: --size: size '0.4' must be from 1 byte to 1024TB"),
    (["bounds", "allgather", "-t", "ring-4", "--size", "1KB", "--chunks", "1000000000"], 2,
     "Error: Invalid value for '--chunks': 1000000000 is not in the range 1<=x<=1024."),
    (["bounds", "allgather", "-t", "fully-connected-128", "--size", "1MB"], 1,
     "Error: fully-connected-128: allgather bounds on 128 ranks and 16256 links need 2080768 units of flow and "
     "path search, more than the 1048576 this command does in about 10 s; use fewer ranks or a topology with "
     "fewer links"),
    (["profile", "run", "--nprocs", "2", "--sizes", ",".join(["1KB"] * 65), "-o", "t.json"], 1,
     "Error: --sizes: give 1..64 comma-separated sizes, got 65"),
]
NODES = "Error: Invalid value for '--nodes': 99999999999999999999 is not in the range 1<=x<=4096."
OPTION_CASES += [(argv + ["--nodes", "99999999999999999999"], 2, NODES) for argv in (
    ["simulate", "x.json", "-t", "ring-4"], ["topo", "show", "dgx1"],
    ["export", "nccl-graph", "x.json", "--topology", "dgx1"], ["bounds", "allgather", "-t", "dgx1", "--size", "1KB"],
    BASELINE, ["pareto", "allgather", "-t", "dgx1"])]


@pytest.mark.parametrize("argv,code,message", OPTION_CASES)
def test_options_are_finite_and_bounded_before_any_work(here, argv, code, message):
    got_code, line, seconds = _run(argv)
    assert (got_code, line) == (code, message)
    assert seconds < 1.0


def test_output_paths_are_checked_before_work_and_nothing_is_left(here):
    os.mkfifo("fifo")
    (here / "afile").write_text("kept")
    cases = [
        (BASELINE + ["-o", "nodir/a.xml"], "Error: -o: nodir/a.xml: directory 'nodir' does not exist (or is not a "
                                           "directory)"),
        (BASELINE + ["-o", "same", "--schedule-out", "same"],
         "Error: --schedule-out: same: is also given to -o; give each output its own file"),
        (BASELINE + ["-o", "fifo"], "Error: -o: fifo: exists and is not a regular file; refusing to replace it"),
        (BASELINE + ["-o", ""], "Error: -o: the output path is empty; give a file name"),
        (BASELINE + ["-o", "newdir/"], "Error: -o: newdir/: names a directory; give a file name inside it"),
        (BASELINE + ["-o", "good.xml", "--schedule-out", "nodir/s.json"],
         "Error: --schedule-out: nodir/s.json: directory 'nodir' does not exist (or is not a directory)"),
        (["topo", "import-nccl", "nothing.xml", "-o", "fifo"],
         "Error: -o: fifo: exists and is not a regular file; refusing to replace it"),
        (["export", "nccl-graph", "x.json", "--topology", "ring-4", "-o", "afile/g.xml"],
         "Error: -o: afile/g.xml: directory 'afile' does not exist (or is not a directory)"),
        (["simulate", "x.json", "-t", "ring-4", "--trace", "fifo"],
         "Error: --trace: fifo: exists and is not a regular file; refusing to replace it"),
        (["pareto", "allgather", "-t", "ring-4", "-o", "afile/sub"],
         f"Error: -o: afile/sub: {str(here / 'afile')!r} is not a directory"),
        (["profile", "run", "--nprocs", "2", "-o", "nodir/t.json"],
         "Error: -o: nodir/t.json: directory 'nodir' does not exist (or is not a directory)"),
    ]
    for argv, message in cases:
        code, line, seconds = _run(argv)
        assert (code, line) == (1, message), argv
        assert seconds < 1.0
    assert sorted(os.listdir(here)) == ["afile", "fifo"]
    assert (here / "afile").read_text() == "kept"


def test_pareto_refuses_a_bundle_entry_it_would_replace(here):
    (here / "out").mkdir()
    os.mkfifo(here / "out" / "frontier.json")
    code, line, _ = _run(["pareto", "allgather", "-t", "ring-4", "-o", "out", "--sizes", "none"])
    assert (code, line) == (1, "Error: -o: out/frontier.json: exists and is not a regular file; refusing to "
                               "replace it")


def test_baseline_commits_both_outputs_together(here):
    code, _, _ = _run(BASELINE + ["-o", "a.xml", "--schedule-out", "s.json"])
    assert code == 0
    assert sorted(os.listdir(here)) == ["a.xml", "s.json"]
    assert json.loads((here / "s.json").read_text())["format"] == "synth-schedule/1"


# ----------------------------------------------------------------------------------------------- sketches

@pytest.fixture(scope="module")
def ndv2():
    return load_topology("ndv2-2node-tecc")


SKETCH_CASES = [
    ({"internode": {"connections": {"¹": [0]}}}, "internode.connections.¹", "unknown GPU '¹'; local GPUs are 0..7"),
    ({"internode": {"relays": {"1": ["٣"]}}}, "internode.relays.1", "unknown GPU '٣'; local GPUs are 0..7"),
    ({"intranode": {"ring": [0, 1, 2, 3, 4, 5, 6, 7], "bidirectional": "no"}}, "intranode.bidirectional",
     "must be true or false, got 'no'"),
    ({"internode": {"own_chunks_first": 1}}, "internode.own_chunks_first", "must be true or false, got 1"),
    ({"hints": {"time_limit_s": float("inf")}}, "hints.time_limit_s",
     "must be a positive finite number up to 604800, got inf"),
    ({"hints": {"mip_gap": float("nan")}}, "hints.mip_gap", "must be a non-negative finite number up to 1, got nan"),
    ({"hints": {"pieces": 1.5}}, "hints.pieces", "must be a positive integer in 1..256, got 1.5"),
    ({"switch": {"strategy": ["uc-min"]}}, "switch.strategy", "unknown strategy ['uc-min']; use uc-max or uc-min"),
    ({"symmetry": [{"offset": 1, "group": [8]}]}, "symmetry[0].group", "must be an integer in 1..16, got [8]"),
    ({"symmetry": [{"permutation": [0.0] * 16}]}, "symmetry[0]", "permutation must list every rank 0..15 once"),
    ({"description": ["x"]}, "description", "must be a string, got ['x']"),
    ({"chunks_per_rank": True}, "chunks_per_rank", "must be a positive integer in 1..1024, got True"),
]


@pytest.mark.parametrize("fields,where,problem", SKETCH_CASES)
def test_sketch_fields_are_type_and_range_checked(ndv2, fields, where, problem):
    with pytest.raises(InputError) as info:
        sketch_from_dict({"format": "synth-sketch/1", "name": "s", **fields}, ndv2, "s.json")
    assert (info.value.source, info.value.field, info.value.problem) == ("s.json", where, problem)


TACCL_SKETCH = {"intranode_sketch": {"strategy": "switch", "switch_hyperedge_strategy": ["uc-min"]},
                "internode_sketch": {"internode_conn": {"1": [0]}, "gpus_to_sender_rev_map": {"1": list(range(8))},
                                     "enforce_ordering": True}, "symmetry_offsets": [[8, 16]]}


@pytest.mark.parametrize("change,where,problem", [
    ({"symmetry_offsets": [[8, [16]]]}, "symmetry[0].group", "must be an integer in 1..16, got [16]"),
    ({"hyperparameters": "fast"}, "hyperparameters", "must be an object like {\"input_chunkup\": 2}, got 'fast'"),
    ({"intranode_sketch": {"strategy": 3}}, "intranode_sketch.strategy", "must be a string, got 3"),
    ({"internode_sketch": {"internode_conn": ["fully-connected"]}}, "internode.connections",
     "must be an object {sender: [receivers]}, \"direct-map\" or \"all\""),
    ({"internode_sketch": {"enforce_ordering": "yes"}}, "internode_sketch.enforce_ordering",
     "must be true or false, got 'yes'"),
])
def test_taccl_sketches_refuse_type_confusion(ndv2, change, where, problem):
    with pytest.raises(InputError) as info:
        sketch_from_dict(taccl_sketch_to_dict({**TACCL_SKETCH, **change}, "t.json"), ndv2, "t.json")
    assert (info.value.field, info.value.problem) == (where, problem)


@pytest.mark.parametrize("change,message", [
    ({"betas": "fast"}, "betas: must be a 3 x 3 matrix of non-negative numbers (row = destination, column = "
                        "source, as TACCL indexes it)"),
    ({"links": [[0, 1e300, 1], [1, 0, 1], [1, 1, 0]]}, "links[0][1]: must be a whole lane count in 0..64, got 1e+300"),
    ({"alpha": "x"}, "alpha: must be a non-negative finite number, got 'x'"),
])
def test_taccl_profiles_refuse_type_confusion(here, change, message):
    profile = {"name": "Custom_1MB", "gpus_per_node": 3, "alpha": 1.0, "links": [[0, 1, 2], [1, 0, 1], [2, 1, 0]],
               "betas": [[0, 20, 10], [20, 0, 20], [10, 20, 0]], **change}
    (here / "p.json").write_text(json.dumps(profile))
    code, line, _ = _run(["topo", "show", "p.json"])
    assert (code, line) == (1, f"Error: p.json: {message}")


def test_pareto_refuses_a_fifo_inside_its_bundle_directory(here):
    (here / "out" / "msccl").mkdir(parents=True)
    os.mkfifo(here / "out" / "msccl" / "01-x.xml")
    code, line, seconds = _run(["pareto", "allgather", "-t", "ring-4", "-o", "out", "--sizes", "none"])
    assert (code, line) == (1, "Error: -o: out/msccl/01-x.xml: is not a regular file; move it out of the directory")
    assert stat.S_ISFIFO(os.lstat(here / "out" / "msccl" / "01-x.xml").st_mode)
