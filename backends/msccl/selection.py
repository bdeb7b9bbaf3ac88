"""When each MSCCL runtime selects an algorithm file for a call (DESIGN section 7, "Size ranges and selection").

- executor (and RCCL's MSCCL): ``nBytes >= minBytes && (maxBytes == 0 || nBytes <= maxBytes)``, for in-place
  calls when ``inplace=1`` and out-of-place calls when ``outofplace=1``;
- legacy: ``minBytes <= nBytes < maxBytes`` (the top is exclusive and there is no "no limit" value), and only
  when the call's in-place-ness equals the file's ``inplace``.

Both also need ``count * multiplier % nchunksperloop == 0`` (:mod:`backends.msccl.conventions`).

>>> size_range_attributes("executor", 1024, None), size_range_attributes("legacy", 1024, 4095)
((1024, 0), (1024, 4096))
"""

from __future__ import annotations

from fractions import Fraction

from backends.msccl import conventions
from backends.msccl.ir import MscclProgram

INT64_MAX = (1 << 63) - 1     # both loaders read minBytes/maxBytes as int64
DTYPE_BYTES = 4               # nccl-tests' default datatype (float)


def size_range_attributes(target: str, min_bytes: int, max_bytes: int | None) -> tuple[int, int]:
    """``(minBytes, maxBytes)`` that make ``target`` select exactly ``min_bytes..max_bytes`` (inclusive;
    ``max_bytes=None``: no upper limit)."""
    if target == "executor":
        return min_bytes, 0 if max_bytes is None else max_bytes
    return min_bytes, INT64_MAX if max_bytes is None else max_bytes + 1


def selects(program: MscclProgram, target: str, size_bytes: int, inplace: bool,
            dtype_bytes: int = DTYPE_BYTES) -> bool:
    """Whether ``target`` runs ``program`` for a call of nccl-tests' ``size_bytes`` (the runtime's nBytes)."""
    low = 0 if program.min_bytes is None else program.min_bytes
    high = program.max_bytes
    if target == "executor":
        in_range = size_bytes >= low and (not high or size_bytes <= high)
        mode = program.inplace == 1 if inplace else program.outofplace == 1
    else:
        in_range = high is None or low <= size_bytes < high
        mode = (program.inplace == 1) == inplace
    # count * multiplier % nchunksperloop == 0 means a whole number of elements per chunk, and nccl-tests'
    # buffer holds size_chunks chunks
    chunk_elements = Fraction(size_bytes, dtype_bytes) / conventions.size_chunks(
        program.collective, program.nchunksperloop, program.ngpus)
    return in_range and mode and size_bytes % dtype_bytes == 0 and chunk_elements.denominator == 1
