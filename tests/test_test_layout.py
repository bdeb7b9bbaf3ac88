"""The test tree's own rules: benchmarks and tests share code only through ``tests/support``."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def imports_of_test_modules(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0].startswith("test_") or n.split(".")[0] == "conftest")


@pytest.mark.parametrize("folder,pattern", [("benchmarks", "*.py"), ("tests/support", "*.py")])
def test_benchmarks_and_support_import_no_test_module(folder, pattern):
    offenders = {p.name: imports_of_test_modules(imported_modules(p)) for p in sorted((ROOT / folder).glob(pattern))}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_test_modules_import_no_other_test_module():
    # test_steps.py still reads its DGX-1 tables through conftest's re-export
    allowed = {"test_steps.py": ["conftest"]}
    offenders = {p.name: imports_of_test_modules(imported_modules(p)) for p in sorted((ROOT / "tests").glob("test_*.py"))}
    assert {name: mods for name, mods in offenders.items() if mods and mods != allowed.get(name)} == {}
