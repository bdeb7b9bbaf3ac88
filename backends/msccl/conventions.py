"""MSCCL buffer conventions, per collective: the one table every MSCCL reader and writer uses (DESIGN section 7).

A call moves ``count`` elements per rank. The runtimes cut ``count * multiplier`` elements into
``nchunksperloop`` (L) chunks, so one chunk is ``S = count * multiplier / L`` elements, with multiplier = ngpus
for Allgather, ReduceScatter and Alltoall and 1 otherwise. The input buffer holds ``count * input_factor``
elements and the output ``count * output_factor`` (nccl-tests' conventions; Gather and Scatter count one
rank's part, as the collectives in :mod:`synth.model.collectives` do), hence in chunks::

    input  = L * input_factor / multiplier          output = L * output_factor / multiplier

on ``n`` ranks (a factor "n" means ngpus):

=============  ==========  ======  ======  =====================================
collective     multiplier  input   output  in-place aliasing (rank r)
=============  ==========  ======  ======  =====================================
allgather      n           1       n       input inside output at r * input
reducescatter  n           n       1       output inside input at r * output
alltoall       n           n       n       same buffer
allreduce      1           1       1       same buffer
broadcast      1           1       1       same buffer
reduce         1           1       1       same buffer
gather         1           1       n       input inside output at r * input
scatter        1           n       1       output inside input at r * output
=============  ==========  ======  ======  =====================================

nccl-tests' "size" is the larger of the two buffers. ``custom`` (and any unknown collective) has no
convention: only the declared ``i_chunks``/``o_chunks`` count, and in-place aliases at offset 0.

>>> buffer_chunks("allgather", 8, 4)
BufferChunks(input=Fraction(2, 1), output=Fraction(8, 1))
>>> inplace_offsets("reducescatter", 3, 8, 4)
(Fraction(0, 1), Fraction(6, 1))
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

N = "n"   # a factor equal to the number of ranks

INPUT_IN_OUTPUT, OUTPUT_IN_INPUT, SAME = "input-in-output", "output-in-input", "same"


@dataclass(frozen=True)
class Convention:
    """One collective's row of the table (see the module docstring)."""

    multiplier: int | str
    input_factor: int | str
    output_factor: int | str
    inplace: str


CONVENTIONS = {
    "allgather": Convention(N, 1, N, INPUT_IN_OUTPUT),
    "reducescatter": Convention(N, N, 1, OUTPUT_IN_INPUT),
    "alltoall": Convention(N, N, N, SAME),
    "allreduce": Convention(1, 1, 1, SAME),
    "broadcast": Convention(1, 1, 1, SAME),
    "reduce": Convention(1, 1, 1, SAME),
    "gather": Convention(1, 1, N, INPUT_IN_OUTPUT),
    "scatter": Convention(1, N, 1, OUTPUT_IN_INPUT),
}


@dataclass(frozen=True)
class BufferChunks:
    """Input and output buffer sizes of one rank, in chunks (a Fraction when L does not divide evenly)."""

    input: Fraction
    output: Fraction

    @property
    def size(self) -> Fraction:
        """Chunks in the buffer nccl-tests calls "size" (the larger one)."""
        return max(self.input, self.output)

    def of(self, buffer: str) -> Fraction:
        return self.input if buffer == "i" else self.output


def _value(factor: int | str, ngpus: int) -> int:
    return ngpus if factor == N else factor


def canonical(collective: str) -> str:
    """Both runtimes' spellings of reduce-scatter as ours; other names unchanged."""
    return "reducescatter" if collective in ("reduce_scatter", "reducescatter") else collective


def convention(collective: str) -> Convention | None:
    """The row for ``collective`` (either spelling), or None for ``custom`` and unknown names."""
    return CONVENTIONS.get(canonical(collective))


def multiplier(collective: str, ngpus: int) -> int:
    """Elements per loop are ``count * multiplier``; 1 for collectives without a convention."""
    row = convention(collective)
    return 1 if row is None else _value(row.multiplier, ngpus)


def buffer_chunks(collective: str, nchunksperloop: int, ngpus: int) -> BufferChunks | None:
    """Input and output chunks of one rank, or None without a convention (or with nchunksperloop < 1)."""
    row = convention(collective)
    if row is None or nchunksperloop < 1:
        return None
    m = _value(row.multiplier, ngpus)
    return BufferChunks(Fraction(nchunksperloop * _value(row.input_factor, ngpus), m),
                        Fraction(nchunksperloop * _value(row.output_factor, ngpus), m))


def inplace_offsets(collective: str, rank: int, nchunksperloop: int, ngpus: int) -> tuple[Fraction, Fraction]:
    """(input offset, output offset) of rank ``rank`` in the one buffer an in-place call uses."""
    sizes = buffer_chunks(collective, nchunksperloop, ngpus)
    row = convention(collective)
    if sizes is None or row.inplace == SAME:
        return Fraction(0), Fraction(0)
    if row.inplace == INPUT_IN_OUTPUT:
        return sizes.input * rank, Fraction(0)
    return Fraction(0), sizes.output * rank


def size_chunks(collective: str, nchunksperloop: int, ngpus: int) -> Fraction:
    """Chunks in nccl-tests' size; nchunksperloop itself for collectives without a convention."""
    sizes = buffer_chunks(collective, nchunksperloop, ngpus)
    return Fraction(max(nchunksperloop, 1)) if sizes is None else sizes.size


def nchunksperloop(collective: str, input_chunks: int, ngpus: int) -> int:
    """L for a rank whose input buffer holds ``input_chunks`` chunks (inverse of :func:`buffer_chunks`)."""
    row = convention(collective)
    if row is None:
        return input_chunks
    return input_chunks * _value(row.multiplier, ngpus) // _value(row.input_factor, ngpus)
