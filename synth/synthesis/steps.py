"""Orchestration: pick the formulation for a collective, solve, decode, and build combining collectives.

Non-combining collectives (Allgather, Alltoall, Broadcast, Gather, Scatter) are encoded directly.
ReduceScatter is the time reversal of an Allgather schedule (copies become reductions), Reduce the reversal of
a Broadcast, Allreduce is ReduceScatter followed by Allgather. The schedule is returned unverified: callers run
:func:`synth.schedule.replay.verify` (``synth solve`` always does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.model.collectives import make_collective, normalize_name
from synth.formulations.steps import balanced_round_splits, decode_steps, encode_steps, min_steps, with_fixed_rounds
from synth.errors import InfeasibleError, InputError, NoSolutionError
from synth.schedule.ir import REDUCE, Schedule, Transfer
from synth.solver.highs import FEASIBLE, INFEASIBLE, OPTIMAL, SolverOptions, solve_model
from synth.model.topology import Topology, check_connected, reverse_topology

# Seconds for each quick try of an even rounds split before the integer-rounds model (see balanced_round_splits).
QUICK_SPLIT_SECONDS = 0.2

# The broadcast-type collective whose reversal gives each reduction.
_REVERSAL_OF = {"reducescatter": "allgather", "reduce": "broadcast"}


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
            return decode_steps(enc, res), res, seconds, len(enc.group)
    res = solve_model(enc.model, options)
    seconds += res.seconds
    if res.status == INFEASIBLE and len(enc.group) > 1:
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
    return decode_steps(enc, res), res, seconds, len(enc.group)


def _reverse(schedule: Schedule, collective) -> Schedule:
    """Time-reverse a broadcast-type schedule into a reduction: each copy u->v at step s becomes a reduce
    v->u at step S-1-s."""
    S = schedule.steps
    transfers = tuple(Transfer(t.chunk, t.dst, t.src, S - 1 - t.step, REDUCE) for t in schedule.transfers)
    rps = tuple(reversed(schedule.rounds_per_step)) if schedule.rounds_per_step else None
    return replace(schedule, collective=collective, transfers=transfers, rounds_per_step=rps)


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
    coll = make_collective(name, topology.num_ranks, chunks, root)
    if name == "allreduce":
        if steps % 2 or rounds < steps:
            raise InputError("--steps", "", "Allreduce is ReduceScatter + Allgather here: give an even number of "
                             "steps and rounds >= steps")
        rs = synthesize_steps(topology, "reducescatter", steps // 2, rounds // 2, chunks, None, options,
                              use_symmetry)
        ag = synthesize_steps(topology, "allgather", steps // 2, rounds // 2, chunks, None, options, use_symmetry)
        half = steps // 2
        transfers = rs.schedule.transfers + tuple(replace(t, step=t.step + half) for t in ag.schedule.transfers)
        rps = rs.schedule.rounds_per_step + ag.schedule.rounds_per_step
        schedule = Schedule(coll, topology.name, transfers, steps, sum(rps), rps, "steps")
        status = OPTIMAL if rs.status == ag.status == OPTIMAL else FEASIBLE
        return SynthesisResult(schedule, status, rs.solve_seconds + ag.solve_seconds, None,
                               min(rs.symmetry_order, ag.symmetry_order), steps, schedule.rounds, chunks)
    dual = _REVERSAL_OF.get(name)
    if dual:
        dual_coll = make_collective(dual, topology.num_ranks, chunks, root)
        forward, res, seconds, order = _solve_direct(
            reverse_topology(topology), dual_coll, steps, rounds, options, use_symmetry,
            f"{name} schedule on {topology.name} (solved as a reversed {dual})")
        schedule = replace(_reverse(forward, coll), topology=topology.name)
    else:
        schedule, res, seconds, order = _solve_direct(topology, coll, steps, rounds, options, use_symmetry)
    return SynthesisResult(schedule, res.status, seconds, res.gap, order, steps, schedule.rounds, chunks)


def smallest_steps(topology: Topology, collective_name: str, chunks: int = 1, root: int | None = None) -> int:
    """Hop lower bound on steps for a collective (twice the Allgather bound for Allreduce)."""
    name = normalize_name(collective_name)
    if name == "allreduce":
        return 2 * smallest_steps(topology, "allgather", chunks)
    dual = _REVERSAL_OF.get(name)
    base = make_collective(dual or name, topology.num_ranks, chunks, root)
    topo = reverse_topology(topology) if dual else topology
    return max(1, min_steps(topo, base))
