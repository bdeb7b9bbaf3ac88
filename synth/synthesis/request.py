"""One synthesis request: what a command asks for, and what is computed once for it.

Every stage of ``synth solve`` (the step search, the alpha-beta drivers, the baselines, the comparison with the
physical limit) receives the same :class:`SynthesisRequest`. The physical limit and the baseline table are
derived from it on first use and kept, so a command builds each baseline and solves each bound LP once, however
many stages need them.

The request also carries the command's :class:`~synth.solver.deadline.Deadline`: its ``options`` hold the part
the search may use (:func:`~synth.solver.deadline.search_deadline`), so every HiGHS call of every phase gets at
most the time left, and the rest is kept for writing the chosen file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

from synth.bounds.physical import Bound, lower_bound
from synth.errors import InputError
from synth.model.collectives import check_collective, normalize_name
from synth.model.topology import Topology, check_connected
from synth.solver.deadline import UNBOUNDED, Deadline, search_deadline
from synth.solver.highs import SolverOptions
from synth.synthesis.baselines import BaselineTable, evaluate_baselines
from synth.synthesis.method import METHODS, Method


@dataclass(frozen=True)
class SynthesisRequest:
    """A collective on a topology at a size, with the user's constraints on how to search.

    ``size_bytes`` is nccl-tests' per-rank buffer (DESIGN section 4). ``steps``/``rounds``/``chunks`` fix the
    step formulation's S, R, C (None: searched). ``sketch`` is a sketch name or path (alpha-beta only).
    ``deadline`` bounds the whole command (default: none); ``options.deadline`` becomes its search part.

    >>> from synth.model.topology import load_topology
    >>> r = SynthesisRequest(load_topology("ring-4"), "all_gather", 1 << 20)
    >>> r.collective, r.method, r.baselines is r.baselines
    ('allgather', <Method.AUTO: 'auto'>, True)
    """

    topology: Topology
    collective: str
    size_bytes: int
    root: int | None = None
    method: Method = Method.AUTO
    sketch: str | None = None
    steps: int | None = None
    rounds: int | None = None
    chunks: int | None = None
    options: SolverOptions = SolverOptions()
    include_baselines: bool = True
    target: str = "executor"
    deadline: Deadline = UNBOUNDED
    _baseline_tables: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    sketch_refusals: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "collective", normalize_name(self.collective))
        try:
            object.__setattr__(self, "method", Method(self.method))
        except ValueError:
            raise InputError("--method", "", f"unknown method {self.method!r}; choose one of "
                             f"{', '.join(METHODS)}") from None
        if not (isinstance(self.size_bytes, int) and self.size_bytes > 0) and not (
                isinstance(self.size_bytes, float) and math.isfinite(self.size_bytes) and self.size_bytes > 0):
            raise InputError("--size", "", f"size must be a positive number of bytes, got {self.size_bytes!r}")
        if self.fixed_steps and self.method not in (Method.AUTO, Method.STEPS):
            raise InputError("--steps", "", f"--steps/--rounds belong to the step formulation, not --method "
                             f"{self.method}")
        if self.sketch is not None and self.method in (Method.STEPS, Method.TREES):
            raise InputError("--sketch", "", "sketches guide the alpha-beta formulations; use --method "
                             "auto|routed|timexp|hierarchy")
        if self.method == Method.TREES and self.collective == "alltoall":
            raise InputError("--method", "", "tree packing covers every collective but Alltoall; use --method "
                             "auto|routed|timexp|steps")
        if self.target not in ("executor", "legacy"):
            raise InputError("--target", "", f"unknown target {self.target!r}; choose executor or legacy")
        check_collective(self.collective, self.topology.num_ranks, self.chunks or 1, self.root)
        check_connected(self.topology)
        if self.deadline.bounded:
            object.__setattr__(self, "options", replace(self.options, deadline=search_deadline(self.deadline)))

    @property
    def search_deadline(self) -> Deadline:
        """When the search must stop so that the chosen file can still be written in time."""
        return self.options.deadline

    @property
    def fixed_steps(self) -> bool:
        """Whether the user fixed the step formulation's (S, R)."""
        return self.steps is not None and self.rounds is not None

    @property
    def open_choice(self) -> bool:
        """``auto`` with nothing fixed: every source competes, and only runnable plans are kept."""
        return self.method == Method.AUTO and not self.fixed_steps

    @cached_property
    def bound(self) -> Bound:
        """The physical limit at the request's size (computed once)."""
        return lower_bound(self.collective, self.topology, self.size_bytes, root=self.root)

    @cached_property
    def sketch_rules(self):
        """The request's sketch (:class:`~synth.model.sketch.Sketch`) resolved against its topology, read once;
        None without one. Every candidate must keep to it (:mod:`synth.synthesis.sketched`)."""
        from synth.model.sketch import Sketch, load_sketch

        if self.sketch is None or isinstance(self.sketch, Sketch):     # (library callers may pass one resolved)
            return self.sketch
        return load_sketch(self.sketch, self.topology)

    @cached_property
    def rounds_per_chunk(self) -> float:
        """The least rounds per chunk (R/C) of any step schedule (:func:`synth.bounds.rounds.rounds_per_chunk_bound`,
        an LP; computed once): the step search starts there."""
        from synth.bounds.rounds import rounds_per_chunk_bound

        return rounds_per_chunk_bound(self.topology, self.collective, self.root)

    @property
    def baselines(self) -> BaselineTable:
        """Every applicable baseline for the request's collective, built and replayed once."""
        return self.baselines_for(self.collective, self.topology)

    def baselines_for(self, collective: str, topology: Topology,
                      progress: Callable[[str], None] = lambda message: None) -> BaselineTable:
        """The baseline table of a sub-problem at the request's size and root (the dual of a reduction on the
        reversed topology, the halves of an Allreduce), built once per (collective, topology); ``progress``
        hears about each baseline as it is built.

        Baselines are candidates, so they are built within the search deadline: once it has passed, the table
        holds the baselines built so far (at least one, see
        :func:`~synth.synthesis.baselines.evaluate_baselines`) and says which were not built."""
        key = (normalize_name(collective), topology)
        if key not in self._baseline_tables:
            self._baseline_tables[key] = evaluate_baselines(key[0], topology, self.size_bytes, self.root,
                                                            progress=progress, deadline=self.search_deadline)
        return self._baseline_tables[key]
