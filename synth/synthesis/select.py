"""Choosing what ``synth solve`` hands back: the fastest verified schedule among the ways we can build one.

Candidates come from the step formulation (the given (S, R, C), or a small search for the fastest at the
size), the alpha-beta formulations (:mod:`synth.synthesis.alphabeta`, sketch-guided) and the NCCL-style baselines. Each
is replayed (:func:`synth.schedule.replay.verify`) before it counts. When the user leaves the choice open, only plans
the MSCCL runtimes will select at power-of-two sizes compete (a power-of-two ``nchunksperloop``).
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.synthesis.baselines import best_baseline
from synth.model.collectives import make_collective
from synth.errors import InfeasibleError, InputError
from synth.schedule.replay import ReplayReport, verify
from synth.solver.highs import SolverOptions
from synth.synthesis.steps import SynthesisResult, smallest_steps, synthesize_steps
from synth.model.topology import Topology, check_connected

METHODS = ("auto", "steps", "routed", "timexp")
# The step search in `auto` is worth its time on single machines; beyond this many ranks (or with a sketch)
# the alpha-beta formulations reach the limit faster (benchmarks/bench_alphabeta.py).
STEP_SEARCH_MAX_RANKS = 16


@dataclass(frozen=True)
class Choice:
    """A verified candidate: where it came from, the solver's account, and its replayed time."""

    label: str
    result: SynthesisResult
    report: ReplayReport


def _search_rounds(topology, name, steps, chunks, root, options, max_rounds, progress) -> SynthesisResult:
    """Fewest rounds (from ``steps`` up) for which a schedule exists; each probe is one small MILP."""
    last_error = None
    for rounds in range(steps, max_rounds + 1):
        progress(f"  trying steps={steps} rounds={rounds} chunks={chunks}")
        try:
            return synthesize_steps(topology, name, steps, rounds, chunks, root, options)
        except InfeasibleError as exc:
            last_error = exc
    raise InfeasibleError(f"no schedule with {steps} steps, up to {max_rounds} rounds and {chunks} chunk(s) per "
                          f"rank ({last_error}); give --steps/--rounds explicitly")


def step_candidates(topology: Topology, name: str, size_bytes: int, steps, rounds, chunks, root,
                    options: SolverOptions, progress) -> list[Choice]:
    """The given (steps, rounds, chunks), or for each open chunk count the fewest rounds at the fewest steps."""
    if steps is not None and rounds is not None:
        result = synthesize_steps(topology, name, steps, rounds, chunks or 1, root, options)
        return [Choice("steps", result, verify(result.schedule, topology, size_bytes))]
    found = []
    for c in ([chunks] if chunks else [1, 2, 4]):
        if not chunks and not make_collective(name, topology.num_ranks, c, root).runs_at_power_of_two_sizes:
            continue
        s = steps if steps is not None else smallest_steps(topology, name, c, root)
        if name == "allreduce" and s % 2:
            s += 1
        try:
            if rounds is not None:
                result = synthesize_steps(topology, name, s, rounds, c, root, options)
            else:
                result = _search_rounds(topology, name, s, c, root, options, s + 2 * topology.num_ranks * c,
                                        progress)
        except InfeasibleError:
            if chunks:
                raise
            continue
        report = verify(result.schedule, topology, size_bytes)
        progress(f"  steps: S={result.steps} R={result.rounds} C={c}: {report.time_us:.2f} us")
        found.append(Choice("steps", result, report))
    return found


def alpha_beta_candidate(topology, name, size_bytes, method, sketch, chunks, root, options, progress) -> Choice:
    from synth.synthesis.alphabeta import synthesize_alpha_beta

    progress(f"  alpha-beta ({method}{', sketch ' + str(sketch) if sketch else ''})")
    result = synthesize_alpha_beta(topology, name, size_bytes, "auto" if method == "auto" else method, sketch,
                                   chunks, root, options)
    report = verify(result.schedule, topology, size_bytes)
    progress(f"  alpha-beta: {report.time_us:.2f} us")
    return Choice(result.schedule.method, result, report)


def baseline_candidate(topology, name, size_bytes, root, progress) -> Choice | None:
    try:
        base_name, schedule, report = best_baseline(name, topology, size_bytes, root=root, runnable_only=True)
    except InputError:
        return None
    progress(f"  baseline {base_name}: {report.time_us:.2f} us")
    result = SynthesisResult(schedule, "baseline", 0.0, None, 1, schedule.steps, schedule.rounds,
                             schedule.collective.chunks_per_rank)
    return Choice(f"baseline/{base_name}", result, report)


def candidates(topology: Topology, name: str, size_bytes: int, method: str = "auto", steps=None, rounds=None,
               chunks=None, root=None, sketch=None, options: SolverOptions = SolverOptions(),
               include_baselines: bool = True, progress=lambda message: None) -> list[Choice]:
    """Every verified candidate for the request, fastest first. Raises InfeasibleError when there is none."""
    if method not in METHODS:
        raise InputError("--method", "", f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    check_connected(topology)
    fixed_steps = steps is not None and rounds is not None
    if fixed_steps and method not in ("auto", "steps"):
        raise InputError("--steps", "", f"--steps/--rounds belong to the step formulation, not --method {method}")
    if sketch is not None and method == "steps":
        raise InputError("--sketch", "", "sketches guide the alpha-beta formulations; use --method auto|routed|timexp")
    found: list[Choice] = []
    errors = []
    use_steps = method == "steps" or fixed_steps or (
        method == "auto" and sketch is None and topology.num_ranks <= STEP_SEARCH_MAX_RANKS)
    if use_steps:
        try:
            found += step_candidates(topology, name, size_bytes, steps, rounds, chunks, root, options, progress)
        except InfeasibleError as exc:
            if method == "steps" or fixed_steps:
                raise
            errors.append(str(exc))
    if method in ("routed", "timexp") or (method == "auto" and not fixed_steps):
        found.append(alpha_beta_candidate(topology, name, size_bytes, method, sketch, chunks, root, options,
                                          progress))
    if include_baselines and method == "auto" and not fixed_steps and sketch is None:
        base = baseline_candidate(topology, name, size_bytes, root, progress)
        if base is not None:
            found.append(base)
    if method == "auto" and not fixed_steps:
        runnable = [c for c in found if c.result.schedule.collective.runs_at_power_of_two_sizes]
        if runnable:
            found = runnable
    if not found:
        raise InfeasibleError("no schedule found" + (f": {'; '.join(errors)}" if errors else ""))
    return sorted(found, key=lambda c: c.report.time_us)
