"""Fixtures for every test module; the data behind them lives in ``tests/support`` (benchmarks use it too)."""

import pytest

from synth.model.topology import load_topology
# re-exported for modules that still import the tables from conftest; new code imports support.instances
from support.instances import DGX1_EVERY_COLLECTIVE, DGX1_FEASIBLE, DGX1_INFEASIBLE  # noqa: F401
from support.programs import write_program_files


@pytest.fixture(scope="session")
def dgx1():
    return load_topology("dgx1")


@pytest.fixture(scope="session")
def ring4():
    return load_topology("ring-4")


@pytest.fixture(scope="session")
def msccl_files(tmp_path_factory):
    """The project's own MSCCL files (support.programs.write_program_files): file name -> path."""
    return write_program_files(tmp_path_factory.mktemp("msccl"))
