"""The frozen dataclasses made by the tens of thousands (schedule transfers, MSCCL steps) set their fields in a
hand-written ``__init__``: it must take exactly the dataclass's fields, in order, with their defaults, and the
instance must behave as the generated one would (frozen, equal, hashable, ``replace``)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from backends.msccl.ir import Step
from synth.schedule.ir import Transfer

CASES = [(Transfer, (3, 0, 1, 2)), (Step, (0, "rcs", "i", 1, "o", 2, 1))]


@pytest.mark.parametrize("cls, required", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_init_takes_exactly_the_fields(cls, required):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [inspect.Parameter.empty if f.default is dataclasses.MISSING
                                           else f.default for f in fields]
    made = cls(*required)
    assert list(vars(made)) == [f.name for f in fields]
    assert [getattr(made, f.name) for f in fields] == list(required) + [f.default for f in fields[len(required):]]


@pytest.mark.parametrize("cls, required", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_instances_behave_as_frozen_dataclasses(cls, required):
    made = cls(*required)
    assert made == cls(*required) and hash(made) == hash(cls(*required))
    assert pickle.loads(pickle.dumps(made)) == made
    first = dataclasses.fields(cls)[0].name
    changed = dataclasses.replace(made, **{first: 7})
    assert getattr(changed, first) == 7 and changed != made
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first, 7)
