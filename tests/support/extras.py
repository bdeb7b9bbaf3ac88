"""Optional extras the tests need: PyTorch for ``synth run`` (CI installs the CPU build)."""

import importlib.util

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def need_torch() -> None:
    """Fail, on purpose, with the install hint when PyTorch is missing: ``synth run`` would go untested."""
    if not HAVE_TORCH:
        pytest.fail("PyTorch is not installed, so synth run cannot be tested: install the extra with "
                    "pip install -e '.[torch]'")
