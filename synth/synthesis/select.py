"""Choosing what ``synth solve`` hands back: the fastest verified schedule among the ways we can build one.

Candidates come from the step formulation (the given (S, R, C), or a small search for the fastest at the
size), the alpha-beta formulations (:mod:`synth.synthesis.alphabeta`, sketch-guided) and the NCCL-style baselines. Each
is replayed (:func:`synth.schedule.replay.verify`) before it counts. When the user leaves the choice open, only plans
the MSCCL runtimes will select at power-of-two sizes compete (a power-of-two ``nchunksperloop``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from synth.errors import BackendError, InfeasibleError, InputError, NoSolutionError, VerificationError
from synth.model.collectives import make_collective
from synth.model.symmetry import free_symmetry_group
from synth.schedule.replay import ReplayReport, verify
from synth.solver.highs import Status
from synth.synthesis.request import Method, SynthesisRequest
from synth.synthesis.steps import SynthesisResult, smallest_steps, steps_multiple, synthesize_steps

# The step search in `auto` is worth its time on single machines of up to this many ranks; across nodes (or with
# a sketch) the alpha-beta formulations and tree packing reach the limit faster (benchmarks/bench_alphabeta.py).
STEP_SEARCH_MAX_RANKS = 16
# Where the hierarchical decomposition applies, `auto` also runs the flat searches (alpha-beta, tree packing) on
# machines of up to this many ranks; beyond, they take minutes and do no better: on 2 x dgx-h100 the routed
# MILP returned the hierarchical baseline (96.4% of the limit) after 66 s, the hierarchy reaches 98.3% in
# seconds; from 4 nodes on their programs do not fit the runtime (benchmarks/bench_hierarchy.py).
FLAT_SEARCH_MAX_RANKS = 8

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    """The default progress sink: library code never prints."""


@dataclass(frozen=True)
class Candidate:
    """A verified candidate: where it came from, the solver's account, and its replayed time."""

    label: str
    result: SynthesisResult
    report: ReplayReport


def _search_rounds(request: SynthesisRequest, steps: int, chunks: int, max_rounds: int,
                   progress: Progress) -> SynthesisResult:
    """Fewest rounds for which a schedule exists, from ``steps`` or the rounds-per-chunk LP bound up (fewer are
    infeasible: dgx2 Alltoall with 4 chunks needs 60, probed one by one from 1 for 25 s); each probe is one
    small MILP."""
    last_error = None
    # the LP optimum is a float: a bound of exactly 15 must not become 16
    least = max(steps, math.ceil(chunks * request.rounds_per_chunk * (1 - ROUNDS_BOUND_SLACK)))
    for rounds in range(least, max_rounds + 1):
        progress(f"  trying steps={steps} rounds={rounds} chunks={chunks}")
        try:
            return synthesize_steps(request.topology, request.collective, steps, rounds, chunks, request.root,
                                    request.options)
        except InfeasibleError as exc:
            last_error = exc
    raise InfeasibleError(f"no schedule with {steps} steps, up to {max_rounds} rounds and {chunks} chunk(s) per "
                          f"rank ({last_error}); give --steps/--rounds explicitly")


ROUNDS_BOUND_SLACK = 1e-6


def step_candidates(request: SynthesisRequest, progress: Progress = _quiet) -> list[Candidate]:
    """The given (steps, rounds, chunks), or for each open chunk count the fewest rounds at the fewest steps."""
    topology, name, root = request.topology, request.collective, request.root
    if request.fixed_steps:
        result = synthesize_steps(topology, name, request.steps, request.rounds, request.chunks or 1, root,
                                  request.options)
        return [Candidate("steps", result, verify(result.schedule, topology, request.size_bytes))]
    found = []
    for c in ([request.chunks] if request.chunks else [1, 2, 4]):
        if not request.chunks and not make_collective(name, topology.num_ranks, c, root).runs_at_power_of_two_sizes:
            continue
        s = request.steps if request.steps is not None else smallest_steps(topology, name, c, root)
        s += -s % steps_multiple(name)   # a concatenation splits its steps evenly between its parts
        try:
            if request.rounds is not None:
                result = synthesize_steps(topology, name, s, request.rounds, c, root, request.options)
            else:
                result = _search_rounds(request, s, c, s + 2 * topology.num_ranks * c, progress)
        except InfeasibleError:
            if request.chunks:
                raise
            continue
        report = verify(result.schedule, topology, request.size_bytes)
        progress(f"  steps: S={result.steps} R={result.rounds} C={c}: {report.time_us:.2f} us")
        found.append(Candidate("steps", result, report))
    return found


def alpha_beta_candidate(request: SynthesisRequest, progress: Progress = _quiet) -> Candidate:
    """The alpha-beta drivers' schedule (routed, or time-expanded; sketch-guided when a sketch is given)."""
    from synth.synthesis.alphabeta import synthesize_alpha_beta

    method = request.method
    progress(f"  alpha-beta ({method}{', sketch ' + str(request.sketch) if request.sketch else ''})")
    result = synthesize_alpha_beta(request.topology, request.collective, request.size_bytes,
                                   "auto" if method == Method.AUTO else method.value, request.sketch,
                                   request.chunks, request.root, request.options,
                                   baselines=request.baselines_for)
    report = verify(result.schedule, request.topology, request.size_bytes)
    progress(f"  alpha-beta: {report.time_us:.2f} us")
    return Candidate(result.schedule.method, result, report)


TREES_LABEL = "trees/"     # the start of every tree-packing candidate's label
PATHS_LABEL = "alltoall-paths/"     # and of every Alltoall path-flow candidate's

# Chunks per rank tried for tree packing besides its own pick: fewer chunks give programs that fit the
# executor's 64 steps per threadblock on direct-link machines (dgx1), at a small cost in pipelining, and at small
# sizes messages large enough for the runtime's FIFOs to cover the latency (dgx1 Scatter 1 MB: 64 chunks ran 8%
# behind their plan, 32 as planned at the same planned time).
TREE_CHUNK_OPTIONS = (256, 128, 64, 32, 16)
ONE_HALVING_FROM = 1024    # an own count of twice this or more falls back to its half first


# Under auto, a tree-packing plan that replays within this share of the physical limit ends the search: no other
# formulation can be more than that faster, and on single nodes at large sizes none was (the routed MILP ran its
# whole time limit on dgx2 Broadcast 1 GB, 250 s on 2 busy cores, for 38% of the limit, and left no time for trees).
# 2%: the runtimes' XML reader capped a branching tree's pipelining at 1024 chunks per rank (chains, forwarded
# fused, reach 2048, and trees too now, with a flow fused per relay), where dgx1 Broadcast and Reduce 1 GB planned
# at 98.6%, and the alpha-beta search (20 s there) and smaller packings found nothing faster.
TREES_AT_LIMIT = 0.02


def _at_the_limit(request: SynthesisRequest, found: list[Candidate]) -> bool:
    """Whether a runnable tree-packing, Alltoall path or rooted composition candidate replays within
    :data:`TREES_AT_LIMIT` of the physical limit."""
    labels = (TREES_LABEL, PATHS_LABEL)
    if _several_nodes(request):     # (no rooted composition on one node)
        from synth.synthesis.rooted import LABEL as ROOTED_LABEL
        labels += (ROOTED_LABEL,)
    limit = request.bound.search_limit_us
    return any(c.label.startswith(labels)
               and c.result.schedule.runs_at_power_of_two_sizes
               and c.report.time_us <= limit * (1 + TREES_AT_LIMIT) for c in found)


def tree_candidates(request: SynthesisRequest, progress: Progress = _quiet, fallbacks: bool = True
                    ) -> list[Candidate]:
    """Tree-packing schedules (:mod:`synth.synthesis.trees`): its own chunk count, and (``fallbacks``) fewer
    chunks that fit (:func:`tree_fallback_candidates`)."""
    if request.chunks:
        return [_tree_candidate(request, request.chunks, progress)]
    own = _tree_candidate(request, None, progress)    # its pipelining's count, halved until the runtime holds it
    return [own] + (tree_fallback_candidates(request, own, progress) if fallbacks else [])


def tree_fallback_candidates(request: SynthesisRequest, own: Candidate, progress: Progress = _quiet
                             ) -> list[Candidate]:
    """Tree packings with fewer chunks per rank (:data:`TREE_CHUNK_OPTIONS`) than the ``own`` candidate's: the
    fallbacks for a program too long for the runtime."""
    own_chunks = own.result.chunks
    # from 2048 one halving first: a Broadcast whose fused flows did not fit falls back to 1024, not 256
    halved = {own_chunks // 2} if own_chunks >= 2 * ONE_HALVING_FROM else set()
    options = sorted(halved | set(TREE_CHUNK_OPTIONS), reverse=True)
    return [_tree_candidate(request, c, progress) for c in options if c < own_chunks]


def _tree_candidate(request: SynthesisRequest, chunks: int | None, progress: Progress) -> Candidate:
    from synth.synthesis.trees import synthesize_trees

    progress(f"  tree packing{'' if chunks is None else f' with {chunks} chunks per rank'} (packing LP, chunk "
             "MILP, list scheduling)")
    tree = synthesize_trees(request.topology, request.collective, request.size_bytes, request.root,
                            request.options, request.target, chunks)
    schedule = tree.schedule
    result = SynthesisResult(schedule, tree.status, tree.solve_seconds, tree.gap,
                             len(free_symmetry_group(request.topology)), schedule.steps, None, tree.chunks_per_rank)
    report = tree.replay     # verified by replay at the request's size
    progress(f"  trees C={tree.chunks_per_rank}: {report.time_us:.2f} us ({tree.num_trees} trees)")
    return Candidate(f"{TREES_LABEL}c{tree.chunks_per_rank}", result, report)


def hierarchy_applies(request: SynthesisRequest) -> bool:
    """Whether the hierarchical decomposition covers the request (several nodes joined rail by rail; Broadcast and
    Reduce by the rooted composition, :mod:`synth.synthesis.rooted`)."""
    if not _several_nodes(request):
        return False
    from synth.synthesis import rooted
    from synth.synthesis.hierarchy import check_applicable

    if rooted.applies(request.topology, request.collective) and request.collective in rooted.SEARCHED_ALONE:
        return True
    try:
        check_applicable(request.topology, request.collective)
    except InputError:
        return False
    return True


def hierarchy_candidates(request: SynthesisRequest, progress: Progress = _quiet) -> list[Candidate]:
    """Compositions of one rail and one node solution (:mod:`synth.synthesis.hierarchy`; Broadcast and Reduce:
    :mod:`synth.synthesis.rooted`), each replayed."""
    from synth.synthesis import rooted
    from synth.synthesis.hierarchy import synthesize_hierarchy

    if rooted.applies(request.topology, request.collective) and request.collective in rooted.SEARCHED_ALONE:
        return rooted_candidates(request, progress)
    found = []
    for c in synthesize_hierarchy(request.topology, request.collective, request.size_bytes, request.root,
                                  request.target, request.chunks, progress, deadline=request.search_deadline):
        schedule = c.schedule
        result = SynthesisResult(schedule, Status.FEASIBLE, c.seconds, None, c.symmetry_order, schedule.steps,
                                 None, schedule.collective.chunks_per_rank)
        found.append(Candidate(c.plan.label(request.collective), result, c.report))
    return found


def rooted_applies(request: SynthesisRequest) -> bool:
    """Whether the rooted composition (:mod:`synth.synthesis.rooted`) covers the request: across nodes, or on one
    NVSwitch node as the root's Latin square (Broadcast and Reduce where a chain's alphas outweigh its drain)."""
    if not _several_nodes(request) and request.collective not in ("broadcast", "reduce"):
        return False
    from synth.synthesis import rooted

    if not _several_nodes(request):
        return rooted.one_node_square(request.topology, request.collective, request.size_bytes,
                                      request.root or 0) is not None
    return rooted.applies(request.topology, request.collective)


def _several_nodes(request: SynthesisRequest) -> bool:
    """Whether the machine has several nodes, which the compositions (:mod:`synth.synthesis.hierarchy`,
    :mod:`synth.synthesis.rooted`) need: on one node their modules are not even imported (0.05 s)."""
    return request.topology.num_nodes >= 2


def rooted_candidates(request: SynthesisRequest, progress: Progress = _quiet) -> list[Candidate]:
    """Broadcast and Reduce across nodes composed from rails and node spreads (:mod:`synth.synthesis.rooted`)."""
    from synth.synthesis.rooted import synthesize_rooted

    found = []
    for c in synthesize_rooted(request.topology, request.collective, request.size_bytes, request.root,
                               request.target, request.chunks):
        schedule = c.schedule
        result = SynthesisResult(schedule, Status.FEASIBLE, c.seconds, None, 1, schedule.steps, None, c.chunks)
        progress(f"  {c.label}: {c.report.time_us:.2f} us ({len(schedule.transfers)} transfers)")
        found.append(Candidate(c.label, result, c.report))
    return found


def reversal_candidate(request: SynthesisRequest, progress: Progress = _quiet) -> Candidate | None:
    """A reduction (ReduceScatter, Reduce) as the time-reversal of the fastest runnable baseline of its dual
    (Allgather, Broadcast) on the reversed machine (:func:`synth.schedule.transforms.reverse_schedule`): partial
    sums travel the dual's routes backwards in its order, so it takes the dual's time; an Allreduce as that
    ReduceScatter followed by the fastest Allgather baseline itself. Where links are one-way or unequal the
    reductions' own baselines are not their duals' mirror images (TE-CCL's two DGX-2 nodes: the hierarchical
    Allgather at 98.4% of the limit, simulated, the hierarchical ReduceScatter 68.8%, and every search below 80%).
    None when the collective has no dual, no dual baseline applies, or (Allreduce) the reversed machine has no
    runnable mirror of the Allgather's baseline."""
    from synth.model.topology import reverse_topology
    from synth.schedule.transforms import REVERSAL_DUAL, concatenate_schedules, reverse_schedule

    name, topology, n = request.collective, request.topology, request.topology.num_ranks
    reduction = "reducescatter" if name == "allreduce" else name
    dual = REVERSAL_DUAL.get(reduction)
    if dual is None:
        return None
    try:
        mirrored = request.baselines_for(dual, reverse_topology(topology), progress)
        if name == "allreduce":
            forward = request.baselines_for(dual, topology, progress).best(runnable_only=True)
            run = next((r for r in mirrored.runs if r.runnable and (r.name, r.chunks_per_way) ==
                        (forward.name, forward.chunks_per_way)), None)
            if run is None:
                return None
        else:
            run = mirrored.best(runnable_only=True)
    except InputError:
        return None
    chunks = run.schedule.collective.chunks_per_rank
    schedule = reverse_schedule(run.schedule, make_collective(reduction, n, chunks, request.root), topology.name)
    if name == "allreduce":
        schedule = concatenate_schedules([schedule, forward.schedule], make_collective(name, n, chunks),
                                         topology.name)
    try:
        report = verify(schedule, topology, request.size_bytes)
    except VerificationError as exc:    # a bug of the transforms: the other candidates still compete
        progress(f"  reversal of the {dual} baseline {run.name} failed its replay (please report): {exc}")
        return None
    progress(f"  reversal of the {dual} baseline {run.name}: {report.time_us:.2f} us")
    result = SynthesisResult(schedule, Status.FEASIBLE, 0.0, None, 1, schedule.steps, schedule.rounds, chunks)
    return Candidate(f"reversal/{run.name}/c{run.chunks_per_way}", result, report)


GATHERED_LABEL = "gathered/"


def gathered_candidates(request: SynthesisRequest, progress: Progress = _quiet) -> list[Candidate]:
    """An Allreduce or Alltoall as every rank's whole input gathered untouched, then summed or picked from on each
    rank (:mod:`synth.synthesis.gathered`), one per Allgather baseline, fastest replay first; none where that is
    not offered. The simulator picks among them: ``synth solve`` writes the next only while its replay beats the
    files written."""
    from synth.synthesis.gathered import gathered_schedules

    found = gathered_schedules(request.topology, request.collective, request.size_bytes, request.search_deadline,
                               request.bound)
    if found:
        progress(f"  gathered {request.collective} over the allgather baseline {found[0].baseline}: "
                 f"{found[0].report.time_us:.2f} us ({len(found)} baseline(s))")
    return [Candidate(GATHERED_LABEL + each.baseline,
                      SynthesisResult(each.schedule, Status.FEASIBLE, 0.0, None, 1, each.schedule.steps,
                                      each.schedule.rounds, each.schedule.collective.chunks_per_rank), each.report)
            for each in found]


def exchange_candidates(request: SynthesisRequest, progress: Progress = _quiet) -> list[Candidate]:
    """Allreduce across nodes as a sharded exchange over the rails (:mod:`synth.synthesis.exchange`), one per
    count of :data:`~synth.synthesis.exchange.PIECES` (chunks per rank); none where it does not apply."""
    from synth.synthesis.exchange import PIECES, exchange_applies, sharded_exchange

    if not exchange_applies(request.topology, request.collective):
        return []
    found = []
    for pieces in ((request.chunks,) if request.chunks else PIECES):
        built = sharded_exchange(request.topology, request.size_bytes, pieces)
        if built is None:
            continue
        schedule, report = built.schedule, built.report
        progress(f"  sharded exchange over the rails, {pieces} chunk(s) per rank: {report.time_us:.2f} us")
        result = SynthesisResult(schedule, Status.FEASIBLE, 0.0, None, 1, schedule.steps, schedule.rounds, pieces)
        found.append(Candidate(built.label, result, report))
    return found


def baseline_candidate(request: SynthesisRequest, progress: Progress = _quiet) -> Candidate | None:
    """The fastest baseline the runtimes select at power-of-two sizes, or None when none applies."""
    try:
        run = request.baselines_for(request.collective, request.topology, progress).best(runnable_only=True)
    except InputError:
        return None
    progress(f"  baseline {run.name}: {run.report.time_us:.2f} us")
    schedule = run.schedule
    result = SynthesisResult(schedule, Status.BASELINE, 0.0, None, 1, schedule.steps, schedule.rounds,
                             schedule.collective.chunks_per_rank)
    return Candidate(f"baseline/{run.name}", result, run.report)


def keeping_to_sketch(request: SynthesisRequest, found: list[Candidate], progress: Progress = _quiet
                      ) -> list[Candidate]:
    """``found`` less the candidates that break the request's sketch (each said in ``progress`` and kept in
    ``request.sketch_refusals`` for the error when none is left); all of them without a sketch
    (:mod:`synth.synthesis.sketched`)."""
    sketch = request.sketch_rules
    if sketch is None:
        return found
    from synth.synthesis.sketched import sketch_violation

    kept = []
    for candidate in found:
        why = sketch_violation(sketch, request.topology, candidate.result.schedule)
        if why is None:
            kept.append(candidate)
        else:
            progress(f"  {candidate.label} does not keep to the sketch ({why}): left out")
            request.sketch_refusals.append(f"{candidate.label} does not keep to the sketch: {why}")
    return kept


def timed_phase(name: str, run: Callable[[], list[Candidate]], request: SynthesisRequest,
                progress: Progress = _quiet) -> list[Candidate]:
    """One source of candidates under the request's search deadline: skipped when the time is already up, and
    when the deadline cuts it before it found anything, the other sources' candidates still count. Under a
    sketch only the candidates that keep to it count (:func:`keeping_to_sketch`)."""
    deadline = request.search_deadline
    if deadline.expired:
        progress(f"  {name}: skipped (time limit reached)")
        return []
    try:
        return keeping_to_sketch(request, run(), progress)
    except (NoSolutionError, InfeasibleError) as exc:
        if not deadline.expired:
            raise
        progress(f"  {name}: cut by the time limit ({exc})")
        return []


def verified_candidates(request: SynthesisRequest, progress: Progress = _quiet, tree_fallbacks: bool = True
                        ) -> list[Candidate]:
    """Every verified candidate for the request, fastest first. Raises InfeasibleError when there is none.
    ``tree_fallbacks=False`` leaves out tree packings with fewer chunks than their own count
    (:func:`tree_fallback_candidates`; ``synth solve`` makes them only when it needs them).

    >>> from synth.model.topology import load_topology
    >>> found = verified_candidates(SynthesisRequest(load_topology("ring-4"), "allgather", 1 << 20))
    >>> found[0].report.time_us <= found[-1].report.time_us
    True
    """
    method, topology = request.method, request.topology
    found: list[Candidate] = []
    errors = []
    # a sketch is a rule every candidate keeps to (timed_phase drops the others), not a choice of source; but under
    # auto the sketch-guided alpha-beta search is what it asks for, so that one runs and nothing is refused early
    sketched = request.sketch_rules is not None     # read (and a bad sketch refused) before any search
    guided = sketched and request.open_choice
    use_steps = method == Method.STEPS or request.fixed_steps or (
        method == Method.AUTO and topology.num_nodes == 1 and topology.num_ranks <= STEP_SEARCH_MAX_RANKS)
    hierarchy = method == Method.HIERARCHY or (request.open_choice and hierarchy_applies(request))
    flat = request.open_choice and not (hierarchy and topology.num_ranks > FLAT_SEARCH_MAX_RANKS)
    if hierarchy and not flat and not sketched:     # the composition is all there is: its refusals come first
        from synth.synthesis.hierarchy import COLLECTIVES as COMPOSED, composable_plans
        if request.collective in COMPOSED:      # (Broadcast and Reduce go to the rooted composition)
            composable_plans(topology, request.collective, request.size_bytes, request.target, request.chunks)
    # Scatter and Gather across nodes composed first (2 x dgx2 Gather 1 GB: 97% of the limit in seconds, the
    # alpha-beta search 70% in two minutes); at the limit, the searches below are skipped
    composed: list[Candidate] = []
    if request.open_choice and not hierarchy and rooted_applies(request):
        composed = timed_phase("rooted composition", lambda: rooted_candidates(request, progress), request,
                               progress)
    # tree packing first: when it is already at the limit, the slower searches have nothing left to win (its
    # candidates still come after theirs, so that a tie goes to the smaller step or alpha-beta program)
    trees: list[Candidate] = []
    if _at_the_limit(request, composed):
        progress(f"  the rooted composition is within {TREES_AT_LIMIT:.0%} of the limit: other searches skipped")
        use_steps = hierarchy = flat = guided = False
    if method == Method.TREES or (flat and request.collective != "alltoall"):
        trees = timed_phase("tree packing", lambda: tree_candidates(request, progress, tree_fallbacks), request,
                            progress)
    # Alltoall's path flows likewise (dgx2 1 GB: at the limit in 0.5 s, the alpha-beta MILP took 3.5 s to tie)
    paths: list[Candidate] = []
    if flat and request.collective == "alltoall":
        from synth.synthesis.alltoall import alltoall_candidates
        paths = timed_phase("alltoall paths", lambda: alltoall_candidates(request, progress), request, progress)
    if request.open_choice and _at_the_limit(request, trees + paths):
        what = "trees are" if trees else "alltoall paths are"
        progress(f"  {what} within {TREES_AT_LIMIT:.0%} of the limit: step and alpha-beta searches skipped")
        use_steps = hierarchy = flat = guided = False
    if use_steps:
        try:
            found += timed_phase("step search", lambda: step_candidates(request, progress), request, progress)
        except (InfeasibleError, NoSolutionError) as exc:
            if method == Method.STEPS or request.fixed_steps:
                raise
            errors.append(str(exc))          # the other sources still compete
    if hierarchy:
        try:
            composed_here = timed_phase("hierarchy", lambda: hierarchy_candidates(request, progress), request,
                                        progress)
        except BackendError as exc:      # no composition can load: where the flat searches run, they still compete
            if not flat and not sketched:
                raise
            progress(f"  hierarchy: {exc}")
            errors.append(str(exc))
            composed_here = []
        found += composed_here
        if guided and not flat and _at_the_limit(request, composed_here):
            progress(f"  the composition is within {TREES_AT_LIMIT:.0%} of the limit: the sketch-guided search "
                     "skipped")
            guided = False
    # the reversal and the gathered schedules take a second where the alpha-beta search may take minutes: built
    # first, they are there to write when its time runs out (ndv2 x4 Allreduce 1 KB), listed after it for ties
    reversed_: list[Candidate] = []
    if flat:
        reversed_ = timed_phase("reversal", lambda: [c for c in [reversal_candidate(request, progress)]
                                                     if c is not None], request, progress)
    gathered: list[Candidate] = []
    if request.open_choice:
        gathered = timed_phase("gathered", lambda: gathered_candidates(request, progress), request, progress)
    if method in (Method.ROUTED, Method.TIMEXP) or flat or guided:
        found += timed_phase("alpha-beta", lambda: [alpha_beta_candidate(request, progress)], request, progress)
    found += trees + paths + composed + reversed_ + gathered
    if (request.open_choice or method == Method.HIERARCHY) and _several_nodes(request):
        found += timed_phase("sharded exchange", lambda: exchange_candidates(request, progress), request, progress)
    if request.include_baselines and request.open_choice and request.sketch is None:
        base = baseline_candidate(request, progress)
        if base is not None:
            found.append(base)
    if request.open_choice:
        runnable = [c for c in found if c.result.schedule.runs_at_power_of_two_sizes]
        if runnable:
            found = runnable
    if not found:
        errors += request.sketch_refusals[:3]
    if not found and request.search_deadline.expired:
        raise NoSolutionError("no verified schedule within the time limit" + (f" ({'; '.join(errors)})" if errors
                                                                                else "") + "; raise --time-limit")
    if not found:
        raise InfeasibleError("no schedule found" + (f": {'; '.join(errors)}" if errors else ""))
    return sorted(found, key=lambda c: c.report.time_us)
