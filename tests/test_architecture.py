"""The layout's contracts: one-way dependencies between stages, one solver boundary, a light ``synth --help``.

Checked on the source (AST of every module), so a new import that breaks the pipeline's direction fails here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]

# Each stage may import only the stages listed (plus itself and the shared leaf modules).
SHARED = {"synth", "synth.errors", "synth.units", "synth.fileio", "synth.text_enum"}
ALLOWED = {
    "synth.model": set(),
    "synth.schedule": {"synth.model"},
    "synth.solver": set(),
    "synth.formulations": {"synth.model", "synth.schedule", "synth.solver"},
    "synth.bounds": {"synth.model", "synth.schedule", "synth.solver", "synth.formulations"},
    "backends.msccl": {"synth.model", "synth.schedule"},
    "backends.nccl": {"synth.model", "synth.schedule"},
    "synth.synthesis": {"synth.model", "synth.schedule", "synth.solver", "synth.formulations", "synth.bounds",
                        "backends.msccl"},
    "synth.sweep": {"synth.model", "synth.schedule", "synth.solver", "synth.formulations", "synth.bounds",
                    "synth.synthesis", "backends.msccl"},
    "synth.runtime": {"synth.model", "synth.schedule", "backends.msccl", "backends.nccl"},
}


def _stage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (parts[0] == "backends" and len(parts) == 2) else module


def _imports():
    """(importing module, imported module) for every import in synth/ and backends/."""
    for path in sorted((ROOT / "synth").rglob("*.py")) + sorted((ROOT / "backends").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield module, node.module
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield module, alias.name


IMPORTS = list(_imports())


def test_imports_are_absolute():
    relative = []
    for path in sorted((ROOT / "synth").rglob("*.py")) + sorted((ROOT / "backends").rglob("*.py")):
        relative += [f"{path.name}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert relative == []


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_stages_import_only_earlier_stages(stage):
    wrong = sorted({f"{src} imports {dst}" for src, dst in IMPORTS
                    if _stage(src) == stage and dst.split(".")[0] in ("synth", "backends")
                    and _stage(dst) not in ALLOWED[stage] | SHARED | {stage}})
    assert wrong == []


def test_no_cycle_between_stages():
    import networkx as nx

    graph = nx.DiGraph((_stage(s), _stage(d)) for s, d in IMPORTS
                       if d.split(".")[0] in ("synth", "backends") and _stage(s) != _stage(d)
                       and _stage(d) not in SHARED)
    assert list(nx.simple_cycles(graph)) == []


def test_only_the_solver_module_imports_highspy():
    assert sorted({src for src, dst in IMPORTS if dst.split(".")[0] == "highspy"}) == ["synth.solver.highs"]


def test_the_sweep_uses_the_one_set_of_executor_helpers():
    """Pools and Dask are defined once, below the sweep (``synth solve`` writes candidates with them too)."""
    from synth.sweep import workers
    from synth.synthesis import parallel

    defined = {n.name for n in ast.parse((ROOT / "synth/sweep/workers.py").read_text()).body
               if isinstance(n, ast.FunctionDef)}
    assert defined <= {"local_pool", "open_executor"}          # thin: the sweep's preload, nothing else
    assert workers.check_scheduler_address is parallel.check_scheduler_address
    assert workers.dask_cluster is parallel.dask_cluster and workers.default_workers is parallel.default_workers


def _heavy_modules_after(argv: list[str]) -> tuple[str, str]:
    code = ("import sys; from synth.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'networkx', 'highspy', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out, out.strip().splitlines()[-1]


def test_help_lists_every_command_without_loading_numpy_or_networkx():
    out, heavy = _heavy_modules_after(["--help"])
    assert heavy == "[]", out
    for name in COMMANDS:
        assert f"  {name} " in out


def test_solve_help_loads_no_numerics():
    assert _heavy_modules_after(["solve", "--help"])[1] == "[]"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name):
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and len(result.output.splitlines()) > 3


# ----------------------------------------------------------------------------------------------- signals, ranges

def test_sigterm_gives_one_line_and_its_exit_code(tmp_path):
    """SIGTERM during a run unwinds like Ctrl-C: one line, exit 143, no output file."""
    import os
    import signal
    import time

    out = tmp_path / "ar.xml"
    proc = subprocess.Popen([sys.executable, "-m", "synth", "solve", "alltoall", "--topology", "dgx2",
                             "--steps", "3", "--rounds", "40", "--chunks", "4", "-o", str(out)],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "Error: terminated (SIGTERM); no output was written"
    assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("args,message", [
    (["--time-limit", "nan"], "'nan' is not a finite number"),
    (["--time-limit", "inf"], "'inf' is not a finite number"),
    (["--mip-gap", "2"], "2 is not in the range 0..1"),
    (["--threads", "1000000"], "1000000 is not in the range 1<=x<=256"),
    (["--steps", "1000000000"], "1000000000 is not in the range 1<=x<=256"),
    (["--chunks", "1000000000"], "1000000000 is not in the range 1<=x<=1024"),
])
def test_numeric_options_are_range_checked_before_any_work(args, message):
    result = CliRunner().invoke(main, ["solve", "allgather", "--topology", "dgx1", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_absurd_node_counts_are_refused_with_the_range():
    result = CliRunner().invoke(main, ["topo", "show", "dgx-h100", "--nodes", "4000"])
    assert result.exit_code == 1
    assert "4000 x 8 GPUs is more than the 1024 ranks a composed cluster may have; use --nodes 1..128" \
        in result.output
