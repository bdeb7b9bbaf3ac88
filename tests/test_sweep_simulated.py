"""pareto chooses per size by the simulator: every size's winner is the algorithm whose written file simulates
fastest there, and the bundle reports those simulated times (the replay stays as the plan's time)."""

from __future__ import annotations

import pytest

from backends.msccl.parse import parse_msccl_xml
from backends.msccl.simulate import simulate_program
from synth.model.topology import load_topology
from synth.sweep.bundle import plan_bundle
from synth.sweep.sizes import BASELINE, STEPS, Algorithm, size_grid
from synth.synthesis.baselines import build_baseline
from synth.synthesis.steps import synthesize_steps


@pytest.fixture(scope="module")
def ring_plan():
    topo = load_topology("ring-4")
    algs = [Algorithm("steps-2-3-2", STEPS, "steps (2,3,2)", synthesize_steps(topo, "allgather", 2, 3, 2).schedule),
            Algorithm("steps-3-3-1", STEPS, "steps (3,3,1)", synthesize_steps(topo, "allgather", 3, 3, 1).schedule),
            Algorithm("baseline-ring-c4", BASELINE, "ring", build_baseline("ring", "allgather", topo, 4))]
    sizes = size_grid(1 << 10, 1 << 28, 16)
    return topo, algs, sizes, plan_bundle(algs, topo, sizes, sizes[0], sizes[-1])


def test_each_size_is_won_by_the_fastest_simulated_file(ring_plan):
    topo, algs, sizes, plan = ring_plan
    for choice in plan.choices:
        chosen = choice.timing(choice.chosen)
        assert chosen.timed and chosen.runnable
        assert chosen.time_us >= chosen.plan_us * (1 - 1e-9)          # simulated, never below the replay
        for t in choice.timings:
            if t.runnable:
                # a timed rival simulates slower; an untimed one's replay alone is already no faster
                assert t.time_us >= chosen.time_us * (1 - 1e-9), (choice.size_bytes, t.key)
                assert t.timed or t.plan_us >= chosen.time_us * (1 - 1e-9)


def test_the_bundle_reports_what_its_files_simulate(ring_plan):
    topo, algs, sizes, plan = ring_plan
    for f in plan.files:
        (program,) = parse_msccl_xml(f.text, f.file_name)
        for choice in plan.choices:
            if f.min_bytes <= choice.size_bytes <= f.max_bytes:
                simulated = simulate_program(program, topo, choice.size_bytes).time_us
                assert choice.timing(f.key).time_us == pytest.approx(simulated, rel=1e-9)
