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
SHARED = {"synth", "synth.errors", "synth.units", "synth.fileio"}
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


def test_help_lists_every_command_without_loading_numpy_or_networkx():
    code = ("import sys; from synth.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'networkx', 'highspy', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]"), out
    for name in COMMANDS:
        assert f"  {name} " in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name):
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and len(result.output.splitlines()) > 3
