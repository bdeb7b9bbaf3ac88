"""Every module of synth and backends imports (so doctest collection works) without the optional extras."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("torch", "matplotlib", "distributed", "dask")

# runs in a fresh interpreter: imports of the extras fail as if they were not installed, then every module loads
PROBE = f"""
import importlib, importlib.util, pkgutil, sys
BLOCKED = {EXTRAS!r}
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
real_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] in BLOCKED else real_find_spec(name, package))
sys.meta_path.insert(0, Absent())
failed = []
for package in ("synth", "backends"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as error:
            failed.append(f"{{info.name}}: {{type(error).__name__}}: {{error}}")
print("\\n".join(failed))
"""


def test_every_module_imports_without_the_optional_extras():
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
