"""Orchestration: pick the formulation for a collective, solve, decode, and build combining collectives.

Non-combining collectives (Allgather, Alltoall, Broadcast, Gather, Scatter) are encoded directly; the others go
through the reductions of :mod:`synth.schedule.transforms`: ReduceScatter is the time reversal of an Allgather
schedule (copies become reductions), Reduce the reversal of a Broadcast, Allreduce is ReduceScatter followed by
Allgather with half the steps and rounds each. The schedule is returned unverified: callers run
:func:`synth.schedule.replay.verify` (``synth solve`` always does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.model.collectives import make_collective, normalize_name
from synth.formulations.steps import balanced_round_splits, decode_steps, encode_steps, min_steps, with_fixed_rounds
from synth.errors import InfeasibleError, InputError, NoSolutionError
from synth.schedule.ir import Schedule
from synth.schedule.transforms import CONCATENATION_PARTS, CollectiveProblem, Concatenation, Reversal, reduction_for
from synth.solver.highs import FEASIBLE, INFEASIBLE, OPTIMAL, SolverOptions, solve_model
from synth.model.topology import Topology, check_connected

# Seconds for each quick try of an even rounds split before the integer-rounds model (see balanced_round_splits).
QUICK_SPLIT_SECONDS = 0.2


@dataclass(frozen=True)
class SynthesisResult:
    """A solved schedule with the solver's honest account of how it was found."""

    schedule: Schedule
    status: str                  # optimal | feasible (time limit hit, gap below)
    solve_seconds: float
    gap: float | None
    symmetry_order: int          # size of the rank-permutation group used to shrink the model
    steps: int
    rounds: int
    chunks: int


def _solve_direct(topology, collective, steps, rounds, options, use_symmetry, label=None):
    """Solve one non-combining step model; prove infeasibility on the full model when the symmetric one fails."""
    enc = encode_steps(topology, collective, steps, rounds, use_symmetry)
    seconds = 0.0
    quick = replace(options, time_limit_s=min(QUICK_SPLIT_SECONDS, options.time_limit_s))
    for parts in balanced_round_splits(rounds, steps):
        res = solve_model(with_fixed_rounds(enc, parts).model, quick)
        seconds += res.seconds
        if res.status in (OPTIMAL, FEASIBLE):
            return decode_steps(enc, res), res, seconds, enc.symmetry.order
    res = solve_model(enc.model, options)
    seconds += res.seconds
    if res.status == INFEASIBLE and enc.symmetry.order > 1:
        enc = encode_steps(topology, collective, steps, rounds, use_symmetry=False)
        res = solve_model(enc.model, options)
        seconds += res.seconds
    if res.status == INFEASIBLE:
        label = label or f"{collective.name} schedule on {topology.name}"
        raise InfeasibleError(f"no {label} with {steps} steps, {rounds} "
                              f"rounds and {collective.chunks_per_rank} chunk(s) per rank (proven on the full "
                              "model); allow more steps or rounds")
    if res.status not in (OPTIMAL, FEASIBLE):
        raise NoSolutionError(f"the solver found no schedule within {options.time_limit_s:g} s; raise --time-limit "
                              "or ask for more rounds")
    return decode_steps(enc, res), res, seconds, enc.symmetry.order


def synthesize_steps(topology: Topology, collective_name: str, steps: int, rounds: int, chunks: int = 1,
                     root: int | None = None, options: SolverOptions = SolverOptions(),
                     use_symmetry: bool = True) -> SynthesisResult:
    """Solve the step formulation for any of the eight collectives.

    For Allreduce, ``steps``/``rounds`` are totals: ReduceScatter and Allgather get ``steps // 2`` and
    ``rounds // 2`` each, so ``steps`` must be even.

    >>> from synth.model.topology import load_topology
    >>> r = synthesize_steps(load_topology("ring-4"), "allgather", steps=2, rounds=2)
    >>> r.schedule.steps, len(r.schedule.transfers)
    (2, 12)
    """
    name = normalize_name(collective_name)
    check_connected(topology)
    coll = make_collective(name, topology.num_ranks, chunks, root)  # validates chunks and root
    problem = CollectiveProblem(topology, name, root, chunks)
    reduction = reduction_for(problem)
    if isinstance(reduction, Concatenation):
        parts = len(reduction.parts)
        if steps % parts or rounds < steps:
            raise InputError("--steps", "", "Allreduce is ReduceScatter + Allgather here: give an even number of "
                             "steps and rounds >= steps")
        solved = [synthesize_steps(topology, p.collective, steps // parts, rounds // parts, chunks, p.root, options,
                                   use_symmetry) for p in reduction.apply()]
        schedule = reduction.invert([r.schedule for r in solved])
        status = OPTIMAL if all(r.status == OPTIMAL for r in solved) else FEASIBLE
        return SynthesisResult(schedule, status, sum(r.solve_seconds for r in solved), None,
                               min(r.symmetry_order for r in solved), steps, schedule.rounds, chunks)
    if isinstance(reduction, Reversal):
        (dual,) = reduction.apply()
        dual_coll = make_collective(dual.collective, topology.num_ranks, chunks, root)
        forward, res, seconds, order = _solve_direct(
            dual.topology, dual_coll, steps, rounds, options, use_symmetry,
            f"{name} schedule on {topology.name} (solved as a reversed {dual.collective})")
        schedule = reduction.invert([forward])
    else:
        schedule, res, seconds, order = _solve_direct(topology, coll, steps, rounds, options, use_symmetry)
    return SynthesisResult(schedule, res.status, seconds, res.gap, order, steps, schedule.rounds, chunks)


def smallest_steps(topology: Topology, collective_name: str, chunks: int = 1, root: int | None = None) -> int:
    """Hop lower bound on steps for a collective: a reversal's is its dual's on the reversed topology; a
    concatenation gives every part the same number of steps, so its bound is the parts' largest times their count.

    >>> from synth.model.topology import load_topology
    >>> smallest_steps(load_topology("ring-4"), "allgather"), smallest_steps(load_topology("ring-4"), "allreduce")
    (2, 4)
    """
    name = normalize_name(collective_name)
    problem = CollectiveProblem(topology, name, root, chunks)
    reduction = reduction_for(problem)
    if isinstance(reduction, Concatenation):
        parts = reduction.apply()
        return len(parts) * max(smallest_steps(topology, p.collective, chunks, p.root) for p in parts)
    if isinstance(reduction, Reversal):
        (problem,) = reduction.apply()
    base = make_collective(problem.collective, topology.num_ranks, chunks, problem.root)
    return max(1, min_steps(problem.topology, base))


def steps_multiple(collective_name: str) -> int:
    """Step counts the step driver accepts are multiples of this: a concatenation splits steps evenly between
    its parts (Allreduce: 2)."""
    parts = CONCATENATION_PARTS.get(normalize_name(collective_name))
    return len(parts) if parts else 1
