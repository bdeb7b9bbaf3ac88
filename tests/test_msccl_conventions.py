"""The one table of MSCCL buffer conventions agrees with the collectives' own pre/postcondition tables."""

import pytest

from backends.msccl import conventions
from synth.model.collectives import COLLECTIVES, make_collective


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("ranks,chunks", [(2, 1), (4, 3), (8, 2)])
def test_table_matches_the_collective(name, ranks, chunks):
    coll = make_collective(name, ranks, chunks)
    loop = conventions.nchunksperloop(name, coll.input_chunks, ranks)
    assert loop == coll.loop_chunks
    sizes = conventions.buffer_chunks(name, loop, ranks)
    assert (sizes.input, sizes.output) == (coll.input_chunks, coll.output_chunks)
    assert conventions.size_chunks(name, loop, ranks) == coll.size_chunks
    assert [conventions.inplace_offsets(name, r, loop, ranks) for r in range(ranks)] == list(coll.inplace_offsets)


def test_both_spellings_of_reduce_scatter_and_custom():
    assert conventions.multiplier("reduce_scatter", 8) == conventions.multiplier("reducescatter", 8) == 8
    assert conventions.buffer_chunks("custom", 4, 8) is None
    assert conventions.inplace_offsets("custom", 3, 4, 8) == (0, 0)
    assert conventions.size_chunks("custom", 4, 8) == 4
