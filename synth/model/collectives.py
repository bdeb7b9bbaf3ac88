"""Collectives as pre/postcondition data (after msccl-tools' collectives, extended to every MSCCL collective).

A collective on ``num_ranks`` ranks with ``chunks_per_rank`` C is a set of *logical chunks*. Each chunk says
which ranks hold a piece of it at the start (``initial``: rank -> input-buffer index), where it must end
(``destinations``: rank -> output-buffer index) and what it must then contain (``expected``: the multiset of
input contributions ``(rank, input index)``). Non-combining collectives have one contribution per chunk;
combining ones (ReduceScatter, Allreduce, Reduce) sum the pieces of every contributor exactly once.

Encoders, the replay check and the XML executor read these tables and never branch on the collective's name.

Buffer sizes per rank follow MSCCL (``i_chunks``/``o_chunks``); "size" follows nccl-tests (DESIGN section 4):
the per-rank buffer nccl-tests prints, which holds ``size_chunks`` chunks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from synth.errors import InputError

COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
ALIASES = {"reduce_scatter": "reducescatter", "reduce-scatter": "reducescatter", "all_gather": "allgather",
           "all_reduce": "allreduce", "all_to_all": "alltoall", "alltoall": "alltoall", "bcast": "broadcast"}

# nccl-tests' bus-bandwidth factor as a function of the rank count n.
_BUSBW = {"allgather": lambda n: (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
          "alltoall": lambda n: (n - 1) / n, "allreduce": lambda n: 2 * (n - 1) / n,
          "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "gather": lambda n: (n - 1) / n,
          "scatter": lambda n: (n - 1) / n}


def busbw_factor(name: str, num_ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``name`` on ``num_ranks`` ranks (busbw = algbw x factor).

    >>> busbw_factor("allreduce", 8)
    1.75
    """
    return _BUSBW[name](num_ranks)


def data_pairs(name: str, num_ranks: int, root: int | None) -> list[tuple[int, int]]:
    """The (source, destination) rank pairs whose data must meet: the destination's output depends on the
    source's input (every ordered pair, or those from or to the root of a rooted collective).

    >>> data_pairs("reduce", 3, 0)
    [(1, 0), (2, 0)]
    """
    others = [r for r in range(num_ranks) if r != root]
    if name in ("broadcast", "scatter"):
        return [(root, d) for d in others]
    if name in ("reduce", "gather"):
        return [(s, root) for s in others]
    return [(s, d) for s in range(num_ranks) for d in range(num_ranks) if s != d]


def pair_bytes(name: str, size_bytes: float, num_ranks: int) -> float:
    """Bytes of one :func:`data_pairs` pair's data at nccl-tests' ``size_bytes``: the whole buffer for Allreduce,
    Broadcast and Reduce (an element carries one index's sum, so nothing shrinks it), a shard for the others.

    >>> pair_bytes("allreduce", 1024, 8), pair_bytes("allgather", 1024, 8)
    (1024, 128.0)
    """
    return size_bytes if name in ("allreduce", "broadcast", "reduce") else size_bytes / num_ranks


@dataclass(frozen=True)
class Chunk:
    """One logical chunk: where its pieces start, where it must end, and what it must then hold."""

    id: int
    initial: tuple[tuple[int, int], ...]        # (rank, input index)
    destinations: tuple[tuple[int, int], ...]   # (rank, output index)
    expected: tuple[tuple[tuple[int, int], int], ...]  # ((rank, input index), multiplicity), sorted

    @property
    def sources(self) -> frozenset[int]:
        return frozenset(r for r, _ in self.initial)

    @property
    def dest_ranks(self) -> frozenset[int]:
        return frozenset(r for r, _ in self.destinations)

    def input_index(self, rank: int) -> int | None:
        return dict(self.initial).get(rank)

    def output_index(self, rank: int) -> int | None:
        return dict(self.destinations).get(rank)


@dataclass(frozen=True)
class Collective:
    """A collective instance: the pre/postcondition tables plus MSCCL buffer facts."""

    name: str
    num_ranks: int
    chunks_per_rank: int
    root: int | None
    chunks: tuple[Chunk, ...]
    input_chunks: int      # per rank, MSCCL i_chunks
    output_chunks: int     # per rank, MSCCL o_chunks
    size_chunks: int       # chunks in the buffer nccl-tests calls "size"
    combining: bool
    inplace_offsets: tuple[tuple[int, int], ...] = field(repr=False)  # per rank (input offset, output offset)

    def chunk_bytes(self, size_bytes: float) -> float:
        """Bytes in one chunk when nccl-tests' size is ``size_bytes``."""
        return size_bytes / self.size_chunks

    @property
    def loop_chunks(self) -> int:
        """MSCCL's ``nchunksperloop``: chunks in count*multiplier elements (multiplier = ngpus for
        Allgather/ReduceScatter/Alltoall; Gather/Scatter count one rank's part)."""
        if self.name in ("allgather", "reducescatter", "alltoall", "allreduce"):
            return self.size_chunks
        return self.chunks_per_rank

    @property
    def runs_at_power_of_two_sizes(self) -> bool:
        """The MSCCL runtimes skip an algorithm unless the element count divides into ``nchunksperloop``
        chunks; for the power-of-two sizes everyone uses that needs a power-of-two ``nchunksperloop``."""
        return self.loop_chunks & (self.loop_chunks - 1) == 0

    def busbw_factor(self) -> float:
        return busbw_factor(self.name, self.num_ranks)

    def expected_outputs(self) -> dict[tuple[int, int], Counter]:
        """(rank, output index) -> the multiset of input contributions it must hold at the end."""
        return {(r, o): Counter(dict(c.expected)) for c in self.chunks for r, o in c.destinations}

    def unified_index(self, rank: int, buffer: str, index: int) -> int:
        """Index in the in-place unified buffer (MSCCL aliases ``i`` and ``o`` when in-place)."""
        in_off, out_off = self.inplace_offsets[rank]
        return index + (in_off if buffer == "i" else out_off)

    def spec(self) -> dict:
        return {"name": self.name, "num_ranks": self.num_ranks, "chunks_per_rank": self.chunks_per_rank,
                "root": self.root}


def normalize_name(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise InputError("COLLECTIVE", "", f"unknown collective {name!r}; choose one of {', '.join(COLLECTIVES)}")
    return key


def _mk(i, initial, destinations, expected) -> Chunk:
    if len(expected) == 1:       # most chunks have one contribution (an Alltoall on 1024 ranks has a million)
        return Chunk(i, tuple(initial), tuple(destinations), ((expected[0], 1),))
    return Chunk(i, tuple(initial), tuple(destinations), tuple(sorted(Counter(expected).items())))


def check_collective(name: str, num_ranks: int, chunks_per_rank: int = 1, root: int | None = None
                     ) -> tuple[str, int | None]:
    """The collective's canonical name and root (0 by default for rooted ones, None for the others), or an
    InputError for an unknown name, fewer than 2 ranks, no chunks or a root that is not a rank; without building
    the tables (:func:`make_collective`), which takes seconds for an Alltoall on a thousand ranks.

    >>> check_collective("bcast", 8)
    ('broadcast', 0)
    """
    name = normalize_name(name)
    if num_ranks < 2:
        raise InputError("COLLECTIVE", "ranks", "a collective needs at least 2 ranks")
    if chunks_per_rank < 1:
        raise InputError("--chunks", "", "must be at least 1")
    if name not in ROOTED:
        return name, None
    root = 0 if root is None else root
    if not 0 <= root < num_ranks:
        raise InputError("--root", "", f"root {root} is not a rank (0..{num_ranks - 1})")
    return name, root


@lru_cache(maxsize=4)
def make_collective(name: str, num_ranks: int, chunks_per_rank: int = 1, root: int | None = None) -> Collective:
    """Build the pre/postcondition tables of a collective.

    ``chunks_per_rank`` is C: Allgather/Gather have C chunks per rank's input, ReduceScatter/Scatter C per
    rank's output, Alltoall C per (source, destination) pair, Allreduce n*C in the buffer, Broadcast/Reduce C.
    The tables are immutable and kept for the last few arguments: a request, its bound and its encoders ask for
    the same one (an Alltoall on 1024 ranks took 10 s to build).

    >>> c = make_collective("allgather", 4)
    >>> len(c.chunks), c.output_chunks
    (4, 4)
    """
    name, root = check_collective(name, num_ranks, chunks_per_rank, root)
    n, C = num_ranks, chunks_per_rank
    R = range(n)
    chunks = []
    if name == "allgather":
        for r in R:
            for j in range(C):
                chunks.append(_mk(len(chunks), [(r, j)], [(d, r * C + j) for d in R], [(r, j)]))
        io, inplace, size = (C, n * C), [(r * C, 0) for r in R], n * C
    elif name == "reducescatter":
        for r in R:
            for j in range(C):
                k = r * C + j
                chunks.append(_mk(len(chunks), [(q, k) for q in R], [(r, j)], [(q, k) for q in R]))
        io, inplace, size = (n * C, C), [(0, r * C) for r in R], n * C
    elif name == "allreduce":
        for k in range(n * C):
            chunks.append(_mk(k, [(q, k) for q in R], [(q, k) for q in R], [(q, k) for q in R]))
        io, inplace, size = (n * C, n * C), [(0, 0)] * n, n * C
    elif name == "alltoall":
        for s in R:
            for d in R:
                for j in range(C):
                    chunks.append(_mk(len(chunks), [(s, d * C + j)], [(d, s * C + j)], [(s, d * C + j)]))
        io, inplace, size = (n * C, n * C), [(0, 0)] * n, n * C
    elif name == "broadcast":
        for j in range(C):
            chunks.append(_mk(j, [(root, j)], [(d, j) for d in R], [(root, j)]))
        io, inplace, size = (C, C), [(0, 0)] * n, C
    elif name == "reduce":
        for j in range(C):
            chunks.append(_mk(j, [(q, j) for q in R], [(root, j)], [(q, j) for q in R]))
        io, inplace, size = (C, C), [(0, 0)] * n, C
    elif name == "gather":
        for r in R:
            for j in range(C):
                chunks.append(_mk(len(chunks), [(r, j)], [(root, r * C + j)], [(r, j)]))
        io, inplace, size = (C, n * C), [(r * C, 0) for r in R], n * C
    else:  # scatter
        for r in R:
            for j in range(C):
                chunks.append(_mk(len(chunks), [(root, r * C + j)], [(r, j)], [(root, r * C + j)]))
        io, inplace, size = (n * C, C), [(0, r * C) for r in R], n * C
    combining = name in ("reducescatter", "allreduce", "reduce")
    return Collective(name, n, C, root, tuple(chunks), io[0], io[1], size, combining, tuple(inplace))


def collective_from_spec(spec: dict) -> Collective:
    return make_collective(spec["name"], spec["num_ranks"], spec.get("chunks_per_rank", 1), spec.get("root"))


def chunk_permutation(collective: Collective, perm) -> list[int] | None:
    """How a rank permutation maps chunk ids, or None if it does not preserve the collective.

    Chunks with the same (initial, destinations) signature up to relabelling are matched in id order.
    """
    def sig(initial_ranks, dest_ranks):
        return (frozenset(initial_ranks), frozenset(dest_ranks))

    groups: dict = {}
    for c in collective.chunks:
        groups.setdefault(sig(c.sources, c.dest_ranks), []).append(c.id)
    mapping = [0] * len(collective.chunks)
    for key, ids in groups.items():
        image = sig((perm[r] for r in key[0]), (perm[r] for r in key[1]))
        targets = groups.get(image)
        if targets is None or len(targets) != len(ids):
            return None
        for a, b in zip(ids, targets):
            mapping[a] = b
    return mapping
