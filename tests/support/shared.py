"""Third-party MSCCL files (msccl-tools' examples and SCCL output) kept in ``../shared/data``, never copied here.

The folder sits beside the repository (for a git worktree: beside the main checkout), or wherever the
environment variable ``SYNTH_SHARED_DATA`` points. Tests that read it skip with :data:`SKIP_REASON` when it is
absent, so a plain clone passes; every behaviour those files exercise is also exercised on programs the project
writes itself (:mod:`support.programs`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV_VAR = "SYNTH_SHARED_DATA"
REPO_ROOT = Path(__file__).resolve().parents[2]
SKIP_REASON = (f"needs the third-party MSCCL files in ../shared/data/msccl-xml (not part of the project; "
               f"put the folder beside the repository or set {ENV_VAR} to the data folder)")

# the files and the verdicts their README gives (valid: postcondition holds, no deadlock, no bad access)
VALID_FILES = ("allgather_ring_8gpu_1ch_1inst.xml", "simple_allgather_ring_4gpu.xml",
               "simple_allreduce_ring_8gpu_1inst.xml", "allreduce_a100_allpairs_8gpu_1inst.xml",
               "alltoall_allpairs_8gpu_1inst.xml", "hierarchical_allreduce_4gpu_2node_1inst.xml",
               "dgx1_allgather_s2_r3_c2.xml", "dgx1_reducescatter_s2_r3_c2.xml")
INVALID_FILE = "allreduce_a100_pcie_hierarchical_8gpu_1inst.xml"  # some contributions are reduced twice
ALL_FILES = tuple(sorted(VALID_FILES + (INVALID_FILE,)))


def _checkout_roots() -> list[Path]:
    """The repository root, and for a git worktree also the main checkout (``shared`` sits beside that)."""
    roots = [REPO_ROOT]
    dot_git = REPO_ROOT / ".git"
    if dot_git.is_file():  # a worktree: ".git" holds "gitdir: <main>/.git/worktrees/<name>"
        gitdir = Path(dot_git.read_text().partition("gitdir:")[2].strip())
        common = gitdir / "commondir"
        if common.is_file():
            roots.append((gitdir / common.read_text().strip()).resolve().parent)
    return roots


def _find_shared_data() -> Path | None:
    if os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR]).expanduser()
        return path if path.is_dir() else None
    for root in _checkout_roots():
        path = root.parent / "shared" / "data"
        if path.is_dir():
            return path
    return None


SHARED_DATA: Path | None = _find_shared_data()
SHARED_MSCCL_XML: Path | None = SHARED_DATA / "msccl-xml" if SHARED_DATA else None



def have_shared() -> bool:
    """Whether the third-party MSCCL files are at hand (benchmarks use them only then)."""
    return SHARED_MSCCL_XML is not None and SHARED_MSCCL_XML.is_dir()


needs_shared = pytest.mark.skipif(not have_shared(), reason=SKIP_REASON)


def shared_msccl_xml(name: str) -> Path:
    """The path of one third-party MSCCL file; skips the calling test (naming ../shared/data) when absent."""
    if not have_shared():
        pytest.skip(SKIP_REASON)
    return SHARED_MSCCL_XML / name


def load_shared(name: str):
    """The first ``<algo>`` of a third-party file as a :class:`backends.msccl.ir.MscclProgram` (skips if absent)."""
    from backends.msccl.parse import load_msccl_xml
    return load_msccl_xml(shared_msccl_xml(name))[0]
