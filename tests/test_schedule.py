"""Schedule IR: JSON round trip and buffer layout."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.model.collectives import make_collective
from synth.errors import InputError
from synth.schedule.ir import Schedule, Transfer, buffer_layout, load_schedule, schedule_from_dict
from synth.synthesis.steps import synthesize_steps


def test_round_trip_keeps_every_field(dgx1, tmp_path):
    sched = synthesize_steps(dgx1, "reducescatter", 2, 3, 2).schedule
    path = tmp_path / "s.json"
    path.write_text(sched.to_json())
    back = load_schedule(path)
    assert back.transfers == tuple(sched.ordered())
    assert (back.collective, back.steps, back.rounds, back.rounds_per_step) == \
        (sched.collective, sched.steps, sched.rounds, sched.rounds_per_step)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 5),
                          st.sampled_from(["copy", "reduce"]), st.one_of(st.none(), st.floats(0, 1e6))),
                max_size=20))
def test_round_trip_of_arbitrary_transfers(raw):
    coll = make_collective("allgather", 4)
    unique = {(c, s, d, step): (op, t) for c, s, d, step, op, t in raw if s != d}   # files refuse the rest
    transfers = tuple(Transfer(c, s, d, step, op, t, None if t is None else t + 1)
                      for (c, s, d, step), (op, t) in unique.items())
    sched = Schedule(coll, "ring-4", transfers, 6)
    back = schedule_from_dict(json.loads(sched.to_json()))
    assert sorted(back.transfers, key=repr) == sorted(transfers, key=repr)


@pytest.mark.parametrize("text,field", [('{"format": "nope"}', "format"),
                                        ('{"format": "synth-schedule/1", "collective": {}}', "transfers")])
def test_malformed_schedule_files_are_rejected(tmp_path, text, field):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=f"bad.json: {field}"):
        load_schedule(path)


def test_relay_chunks_go_to_scratch_and_outputs_to_their_index(ring4):
    coll = make_collective("gather", 4, root=0)
    # rank 2's chunk reaches the root through rank 1, which does not output it
    sched = Schedule(coll, "ring-4", (Transfer(2, 2, 1, 0), Transfer(2, 1, 0, 1)), 2)
    layout = buffer_layout(sched)
    assert layout.slot[(1, 2)] == ("s", 0) and layout.slot[(0, 2)] == ("o", 2) and layout.slot[(2, 2)] == ("i", 0)
    assert layout.scratch_chunks == (0, 1, 0, 0)
