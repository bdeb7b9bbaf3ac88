"""MSCCL programs the project writes itself: test input that needs nothing outside the repository.

Two kinds:

- hand-built, one small program per collective (:data:`BUILDERS`), written step by step with :func:`S`,
  :func:`T` and :func:`P` so a test can see every step;
- lowered by our own backend from the NCCL-style baselines (:func:`lowered_baseline`): a ring, a tree and
  all-pairs (:data:`LOWERED`), the kind of program a user feeds to ``synth check`` and ``synth simulate``.

:func:`reduced_twice_allreduce` is a deliberately invalid Allreduce (one contribution is added twice, the fault
of the third-party ``allreduce_a100_pcie_hierarchical`` file). :func:`legacy` turns a program into the legacy
file format (no ``minBytes``/``maxBytes``/``outofplace``), :func:`render` writes either format, and
:func:`write_program_files` puts a set of files on disk for CLI tests.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from backends.msccl.ir import COLL_SPELLING, Gpu, MscclProgram, Step, Threadblock

INVALID_FILE = "reduced_twice_allreduce.xml"   # the file write_program_files writes for reduced_twice_allreduce

# ----------------------------------------------------------------------------------------------- builders
# S("rcs", "o2", "o2") is a step; T(send, recv, chan, *steps) a tb; P(...) a program. Step and tb ids are
# assigned by position, so mutants stay well-formed where the mutation does not say otherwise.

def S(type_: str, src: str = "o0", dst: str = "o0", cnt: int = 1, dep: tuple[int, int] | None = None,
      hasdep: int = 0) -> Step:
    depid, deps = dep if dep is not None else (-1, -1)
    return Step(0, type_, src[0], int(src[1:]), dst[0], int(dst[1:]), cnt, depid, deps, hasdep)


def T(send: int, recv: int, chan: int, *steps: Step) -> Threadblock:
    return Threadblock(0, send, recv, chan, tuple(dataclasses.replace(s, s=k) for k, s in enumerate(steps)))


def P(coll: str, gpus: dict, nchunks: int, sizes: tuple[int, int, int], inplace: int = 0,
      proto: str = "Simple") -> MscclProgram:
    """``gpus`` maps rank -> list of tbs; ``sizes`` are (i_chunks, o_chunks, s_chunks) for every gpu."""
    out = []
    for rank in sorted(gpus):
        tbs = tuple(dataclasses.replace(tb, id=k) for k, tb in enumerate(gpus[rank]))
        out.append(Gpu(rank, *sizes, tbs))
    chans = 1 + max((tb.chan for g in out for tb in g.tbs), default=0)
    return MscclProgram(f"test_{coll}", proto, chans, nchunks, len(out), coll, inplace, 1 - inplace, 0, 1 << 30,
                        tuple(out))


def ring_allgather(n: int = 4, inplace: bool = True, proto: str = "Simple", channels: int = 1) -> MscclProgram:
    """One tb per gpu and channel: send own chunk, forward n-2, receive the last. Out of place: cpy i -> o first.

    Channel h moves piece h of every rank's data: rank r's output chunk ``r * channels + h``.
    """
    gpus = {}
    for r in range(n):
        tbs = []
        for h in range(channels):
            def o(rank: int, h: int = h) -> str:
                return f"o{rank * channels + h}"
            steps = [] if inplace else [S("cpy", f"i{h}", o(r))]
            steps.append(S("s", o(r), o(r)))
            steps += [S("rcs" if k < n - 1 else "r", o((r - k) % n), o((r - k) % n)) for k in range(1, n)]
            tbs.append(T((r + 1) % n, (r - 1) % n, h, *steps))
        gpus[r] = tbs
    return P("allgather", gpus, n * channels, (0 if inplace else channels, n * channels, 0), int(inplace), proto)


def ring_reducescatter(n: int = 4) -> MscclProgram:
    """Chunk c ends reduced on rank c: partial sums travel the ring, the last hop reduces into o0."""
    gpus = {}
    for r in range(n):
        steps = [S("s", f"i{(r - 1) % n}", f"i{(r - 1) % n}")]
        steps += [S("rrs", f"i{(r - k - 1) % n}", f"i{(r - k - 1) % n}") for k in range(1, n - 1)]
        steps.append(S("rrc", f"i{r}", "o0"))
        gpus[r] = [T((r + 1) % n, (r - 1) % n, 0, *steps)]
    return P("reducescatter", gpus, n, (n, 1, 0))


def ring_allreduce(n: int = 4, channels: int = 1) -> MscclProgram:
    """In-place ring Allreduce: s, rrs x (n-2), rrcs, rcs x (n-2), r; per channel h on chunks ``c * channels + h``."""
    gpus = {}
    types = ["s"] + ["rrs"] * (n - 2) + ["rrcs"] + ["rcs"] * (n - 2) + ["r"]
    for r in range(n):
        chunks = [(r - k) % n for k in range(n)] + [(r - j) % n for j in range(n - 1)]
        gpus[r] = [T((r + 1) % n, (r - 1) % n, h, *(S(ty, f"i{c * channels + h}", f"i{c * channels + h}")
                                                    for ty, c in zip(types, chunks))) for h in range(channels)]
    return P("allreduce", gpus, n * channels, (n * channels, 0, 0), inplace=1)


def direct_alltoall(n: int = 3) -> MscclProgram:
    """One tb per peer that sends i[peer] and receives o[peer]; a local cpy for the own block."""
    gpus = {}
    for r in range(n):
        tbs = [T(-1, -1, 0, S("cpy", f"i{r}", f"o{r}"))]
        tbs += [T(p, p, 0, S("s", f"i{p}", f"o{r}"), S("r", f"i{p}", f"o{p}")) for p in range(n) if p != r]
        gpus[r] = tbs
    return P("alltoall", gpus, n, (n, n, 0))


def chain_broadcast(n: int = 4) -> MscclProgram:
    """Root 0 copies its input out (hasdep) and sends it down the chain 0 -> 1 -> ... -> n-1."""
    gpus = {0: [T(-1, -1, 0, S("cpy", "i0", "o0", hasdep=1)), T(1, -1, 0, S("s", "o0", "o0", dep=(0, 0)))]}
    for r in range(1, n):
        kind = "rcs" if r < n - 1 else "r"
        gpus[r] = [T(r + 1 if r < n - 1 else -1, r - 1, 0, S(kind, "o0", "o0"))]
    return P("broadcast", gpus, 1, (1, 1, 0))


def chain_reduce(n: int = 4) -> MscclProgram:
    """Partial sums travel n-1 -> ... -> 1 -> 0; the root reduces into o0."""
    gpus = {n - 1: [T(n - 2, -1, 0, S("s", "i0", "i0"))]}
    for r in range(n - 2, 0, -1):
        gpus[r] = [T(r - 1, r + 1, 0, S("rrs", "i0", "i0"))]
    gpus[0] = [T(-1, 1, 0, S("rrc", "i0", "o0"))]
    return P("reduce", gpus, 1, (1, 1, 0))


def direct_gather(n: int = 3) -> MscclProgram:
    gpus = {0: [T(-1, -1, 0, S("cpy", "i0", "o0"))] + [T(-1, p, 0, S("r", "i0", f"o{p}")) for p in range(1, n)]}
    for r in range(1, n):
        gpus[r] = [T(0, -1, 0, S("s", "i0", f"o{r}"))]
    return P("gather", gpus, n, (1, n, 0))


def direct_scatter(n: int = 3) -> MscclProgram:
    gpus = {0: [T(-1, -1, 0, S("cpy", "i0", "o0"))] + [T(p, -1, 0, S("s", f"i{p}", "o0")) for p in range(1, n)]}
    for r in range(1, n):
        gpus[r] = [T(-1, 0, 0, S("r", f"i{r}", "o0"))]
    return P("scatter", gpus, n, (n, 1, 0))


BUILDERS = {"allgather": ring_allgather, "reducescatter": ring_reducescatter, "allreduce": ring_allreduce,
            "alltoall": direct_alltoall, "broadcast": chain_broadcast, "reduce": chain_reduce,
            "gather": direct_gather, "scatter": direct_scatter}



# ----------------------------------------------------------------------------------------------- lowered

@dataclass(frozen=True)
class LoweredCase:
    """A baseline lowered to MSCCL by our backend, with the topology it was built for."""

    baseline: str
    collective: str
    topology: str

    @property
    def file_name(self) -> str:
        return f"{self.baseline}_{self.collective}_{self.topology}.xml"


# a ring, a tree and all-pairs on 8 ranks: every one valid (the lowering verifies what it lowers)
LOWERED = {"ring": LoweredCase("ring", "allgather", "ring-8"),
           "tree": LoweredCase("double-binary-tree", "allreduce", "fully-connected-8"),
           "all-pairs": LoweredCase("all-pairs", "alltoall", "fully-connected-8")}


def lowered_baseline(case: LoweredCase, chunks_per_rank: int = 1, target: str = "executor") -> MscclProgram:
    """``case``'s baseline schedule lowered by :func:`backends.msccl.lowering.lower_to_msccl` (executor format)."""
    from backends.msccl.lowering import lower_to_msccl
    from synth.model.topology import load_topology
    from synth.synthesis.baselines import build_baseline
    topology = load_topology(case.topology)
    schedule = build_baseline(case.baseline, case.collective, topology, chunks_per_rank)
    return lower_to_msccl(schedule, topology, target=target, name=case.file_name[:-4])


# ----------------------------------------------------------------------------------------------- invalid

def reduced_twice_allreduce(n: int = 4) -> MscclProgram:
    """The ring Allreduce of :func:`ring_allreduce`, but rank 0 adds its own i[0] to itself before sending it.

    Rank 0 copies i[0] to scratch s[0] and reduces s[0] back into i[0], so every rank ends with rank 0's i[0]
    counted twice in chunk 0: the "reduced twice" fault, on a program small enough to read.
    """
    base = ring_allreduce(n)
    gpus = list(base.gpus)
    (tb,) = gpus[0].tbs
    steps = (S("cpy", "i0", "s0"), S("re", "s0", "i0")) + tb.steps
    tb = dataclasses.replace(tb, steps=tuple(dataclasses.replace(s, s=k) for k, s in enumerate(steps)))
    gpus[0] = dataclasses.replace(gpus[0], s_chunks=1, tbs=(tb,))
    return dataclasses.replace(base, name="reduced_twice_allreduce", gpus=tuple(gpus))


# ----------------------------------------------------------------------------------------------- formats

_EXECUTOR_ONLY = re.compile(r' (outofplace|minBytes|maxBytes)="None"')


def legacy(program: MscclProgram) -> MscclProgram:
    """The program as the legacy format has it: no outofplace/minBytes/maxBytes, legacy collective spelling."""
    coll = COLL_SPELLING["legacy"] if program.collective == "reducescatter" else program.coll
    return dataclasses.replace(program, coll=coll, outofplace=None, min_bytes=None, max_bytes=None)


def render(program: MscclProgram) -> str:
    """MSCCL XML text through our renderer; attributes a legacy program lacks are left out of the file."""
    from backends.msccl.lowering import render_msccl_xml
    return _EXECUTOR_ONLY.sub("", render_msccl_xml(program))


def write_program_files(folder: Path) -> dict[str, Path]:
    """Write the project's MSCCL files into ``folder``; returns file name -> path.

    ``<case>.xml`` for every :data:`LOWERED` case (executor format) and its ``legacy_<case>.xml`` twin, the
    hand-built in-place LL128 ring Allgather on 8 ranks (``ring_allgather_8_ll128.xml``, the twin of the
    third-party ``allgather_ring_8gpu_1ch_1inst.xml``) and the invalid ``reduced_twice_allreduce.xml`` (legacy).
    """
    folder.mkdir(parents=True, exist_ok=True)
    programs = {}
    for case in LOWERED.values():
        program = lowered_baseline(case)
        programs[case.file_name] = program
        programs["legacy_" + case.file_name] = legacy(program)
    programs["ring_allgather_8_ll128.xml"] = ring_allgather(8, proto="LL128")
    programs[INVALID_FILE] = legacy(reduced_twice_allreduce())
    paths = {}
    for name, program in programs.items():
        paths[name] = folder / name
        paths[name].write_text(render(program))
    return paths
