"""Test support shared by ``tests/`` and ``benchmarks/`` (never a test module itself).

- :mod:`support.instances`: instance tables with known answers (4-ring Allgather optimum, DGX-1 frontiers).
- :mod:`support.programs`: MSCCL programs the project writes itself (hand-built per collective, and ring,
  tree and all-pairs baselines lowered by our own backend), an invalid one, and both file formats.
- :mod:`support.mutants`: seeded faults for those programs.
- :mod:`support.shared`: where the optional third-party MSCCL files in ``../shared/data`` are, and the skip
  that names that folder when they are absent (the project may not copy them).

Tests import it as ``support`` (pytest puts ``tests/`` on ``sys.path``); benchmarks put ``tests/`` on
``sys.path`` themselves.
"""
