"""What the MSCCL runtimes' XML readers can hold (backends.msccl.limits: 1024 GPUs per algorithm): a machine
beyond it is refused before any search, with the reason."""

import json
import time

import pytest
from click.testing import CliRunner

from backends.msccl.writer import check_target_holds
from synth.cli import main
from synth.errors import BackendError


def test_more_gpus_than_an_algorithm_holds_are_refused():
    check_target_holds(1024, "executor")
    with pytest.raises(BackendError, match=r"^1025 GPUs: the legacy runtime's XML reader holds at most 1024 <gpu> "
                                           r"elements in an <algo> \(MAX_SUBS"):
        check_target_holds(1025, "legacy")


def test_solve_refuses_a_1100_gpu_ring_before_any_search(tmp_path):
    ranks = 1100
    links = [{"src": r, "dst": (r + 1) % ranks, "bidirectional": True} for r in range(ranks)]
    path = tmp_path / "ring-1100.json"
    path.write_text(json.dumps({"format": "synth-topology/1", "name": "ring-1100", "ranks": ranks,
                                "defaults": {"alpha_us": 1.0, "bw_GBps": 10.0}, "links": links}))
    start = time.process_time()
    result = CliRunner().invoke(main, ["solve", "allgather", "--topology", str(path), "--size", "1MB",
                                       "-o", str(tmp_path / "ag.xml")])
    assert time.process_time() - start < 20
    assert result.exit_code == 1, result.output
    assert "1100 GPUs: the executor runtime's XML reader holds at most 1024" in result.output
    assert not (tmp_path / "ag.xml").exists()
