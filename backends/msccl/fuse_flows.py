"""Fusing chosen flows of a plain program onto channels of their own: fewer steps on a relay, nothing reordered.

A relay of a finely pipelined Broadcast (or Reduce) receives every chunk and sends as many: dgx1 Broadcast 1 GB in 2048 chunks
holds some 4,100 plain steps on GPUs 5-7, over the 4,095 XML elements the runtimes' reader holds per rank. A
fused step (``rcs``) receives and forwards a chunk in one, but the fused lowering chains every forward and its
threadblocks wait on each other (69% of the limit there). This pass fuses only the chunks of one flow (received
from ``p``, forwarded to ``q``) on a relay, and gives them channels of their own at all three GPUs: ``p``'s sends
of those chunks, the relay's ``rcs`` steps and ``q``'s receives move, in the link's order, to a new threadblock
per GPU on each new channel (at most the target's steps per threadblock on each). Each relay saves a step per
fused chunk; a fused threadblock only waits for its own flow, so the program runs as before.

Every dependency is carried over: waits on a moved step follow it (a wait on the relay's receive or forward now
waits on its ``rcs``), the fused step waits for all its two steps waited for but the forward's wait on the
receive, and steps keep their ``nop`` chains. :func:`fuse_flows` returns a new program; callers judge it as every
program is judged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from math import ceil
from typing import Iterator

from backends.msccl.ir import Gpu, MscclProgram, Step, Threadblock
from backends.msccl.limits import MAX_XML_ELEMENTS, gpu_xml_elements
from synth.errors import BackendError
from synth.schedule.ir import Schedule


@dataclass(frozen=True)
class Flow:
    """Chunks (buffer indices, the same on the three GPUs) that ``relay`` receives from ``src`` and forwards to
    ``dst``, in the order the link ``src -> relay`` carries them."""

    src: int
    relay: int
    dst: int
    chunks: tuple[int, ...]


@dataclass
class _Entry:
    """A step with the ``nop`` steps that carry its other dependencies, and where it stood."""

    step: Step
    nops: list[Step]
    tb: int
    index: int


def _entries(tb: Threadblock) -> list[_Entry]:
    out, pending = [], []
    for k, st in enumerate(tb.steps):
        if st.type == "nop":
            pending.append(st)
            continue
        out.append(_Entry(st, pending, tb.id, k))
        pending = []
    if pending:
        raise BackendError(f"tb {tb.id} ends with a nop: no step to carry its dependency")
    return out


RECEIVES = {"r": "rcs", "rrc": "rrcs"}     # a plain receive and the fused step that also forwards it


def _find(entries_of: dict[int, list[_Entry]], tbs: dict[int, Threadblock], kinds, peer_field: str, peer: int,
          own_field: str, chunk_at: dict[tuple[str, int], int], chunks: set[int]) -> dict[int, _Entry]:
    """The entries of a type in ``kinds`` in threadblocks whose ``peer_field`` is ``peer``, by the chunk whose slot
    on this GPU (``chunk_at``) their ``own_field`` names (``cnt`` 1): a send's source, a receive's destination."""
    found = {}
    for tb_id, entries in entries_of.items():
        if getattr(tbs[tb_id], peer_field) != peer:
            continue
        for e in entries:
            st = e.step
            if st.type not in kinds or st.cnt != 1:
                continue
            chunk = chunk_at.get((st.dstbuf, st.dstoff) if own_field == "dst" else (st.srcbuf, st.srcoff))
            if chunk in chunks:
                if chunk in found:
                    raise BackendError(f"chunk {chunk} has two {st.type} steps with GPU {peer}")
                found[chunk] = e
    return found


def fuse_flows(program: MscclProgram, flows: list[Flow], steps_per_tb: int,
               slot: dict[tuple[int, int], tuple[str, int]] | None = None) -> MscclProgram:
    """``program`` (a plain lowering: ``s``, ``r`` and ``rrc`` steps) with every flow fused on channels of its own
    (module docstring); a flow's chunks fill ``steps_per_tb`` per channel, on channels after the program's.
    ``slot[(gpu, chunk)]`` is where each GPU keeps a chunk (:func:`synth.schedule.ir.buffer_layout`; default: the
    output buffer at the chunk's index, a Broadcast's). The relay's receive and forward become one ``rcs`` (a
    copy) or ``rrcs`` (a partial sum: reduced, kept, and sent on). Raises BackendError when a flow's chunk has no
    plain receive and send at the relay or no matching steps at its ends."""
    gpus = {g.id: g for g in program.gpus}
    entries = {g.id: {tb.id: _entries(tb) for tb in g.tbs} for g in program.gpus}
    tbs = {g.id: {tb.id: tb for tb in g.tbs} for g in program.gpus}
    chunk_at: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    for flow in flows:
        for gpu in (flow.src, flow.relay, flow.dst):
            for c in flow.chunks:
                chunk_at[gpu][slot[(gpu, c)] if slot is not None else ("o", c)] = c
    added: dict[int, list[tuple[Threadblock, list[_Entry]]]] = defaultdict(list)   # gpu -> new tbs
    moved: dict[int, set[int]] = defaultdict(set)        # gpu -> id() of entries taken out of their tbs
    rename: dict[int, dict[tuple[int, int], _Entry]] = defaultdict(dict)  # gpu -> (tb, index) -> entry now waited on
    channel = program.nchannels
    for flow in flows:
        want = set(flow.chunks)
        sends = _find(entries[flow.src], tbs[flow.src], ("s",), "send", flow.relay, "src", chunk_at[flow.src], want)
        receives = _find(entries[flow.relay], tbs[flow.relay], RECEIVES, "recv", flow.src, "dst",
                         chunk_at[flow.relay], want)
        forwards = _find(entries[flow.relay], tbs[flow.relay], ("s",), "send", flow.dst, "src", chunk_at[flow.relay],
                         want)
        arrivals = _find(entries[flow.dst], tbs[flow.dst], RECEIVES, "recv", flow.relay, "dst", chunk_at[flow.dst],
                         want)
        missing = [c for c in flow.chunks if not (c in sends and c in receives and c in forwards and c in arrivals)]
        twice = [c for c in flow.chunks if any(id(e[c]) in moved[g] for e, g in (
            (sends, flow.src), (receives, flow.relay), (forwards, flow.relay), (arrivals, flow.dst)) if c in e)]
        if twice:
            raise BackendError(f"flow {flow.src}->{flow.relay}->{flow.dst}: chunk {twice[0]} moves a step another "
                               "flow moved")
        if missing:
            raise BackendError(f"flow {flow.src}->{flow.relay}->{flow.dst}: chunk {missing[0]} is not sent, "
                               "received and forwarded by plain steps")
        for start in range(0, len(flow.chunks), steps_per_tb):
            part = flow.chunks[start:start + steps_per_tb]
            for gpu, peers, picked in ((flow.src, (-1, flow.relay), [sends[c] for c in part]),
                                       (flow.dst, (flow.relay, -1), [arrivals[c] for c in part])):
                for e in picked:
                    moved[gpu].add(id(e))
                added[gpu].append((Threadblock(-1, peers[1], peers[0], channel, ()), picked))
            fused = []
            for c in part:
                receive, forward = receives[c], forwards[c]
                moved[flow.relay].update((id(receive), id(forward)))
                rcs = _fused_step(receive, forward)
                # waits on either (the forward's: a later send on its connection, in link order) wait on it
                rename[flow.relay][(receive.tb, receive.index)] = rcs
                rename[flow.relay][(forward.tb, forward.index)] = rcs
                fused.append(rcs)
            added[flow.relay].append((Threadblock(-1, flow.dst, flow.src, channel, ()), fused))
            channel += 1
    return replace(program, nchannels=channel,
                   gpus=tuple(_rebuilt(gpus[g], entries[g], tbs[g], added[g], moved[g], rename[g])
                              for g in sorted(gpus)), line=0)


def _fused_step(receive: _Entry, forward: _Entry) -> _Entry:
    """The relay's receive and forward as one step, waiting for everything the two waited for (but the forward's
    wait on the receive): the last wait its own, the others ``nop`` steps before it."""
    waits = [(n.depid, n.deps) for n in receive.nops] + [(receive.step.depid, receive.step.deps)]
    waits += [(n.depid, n.deps) for n in forward.nops] + [(forward.step.depid, forward.step.deps)]
    waits = [w for w in waits if w[0] >= 0 and w != (receive.tb, receive.index)]
    depid, deps = waits.pop() if waits else (-1, -1)
    st = receive.step
    src = (st.srcbuf, st.srcoff) if st.type != "r" else (st.dstbuf, st.dstoff)    # (a plain receive names the sender's)
    step = Step(0, RECEIVES[st.type], src[0], src[1], st.dstbuf, st.dstoff, 1, depid, deps)
    return _Entry(step, [Step(0, "nop", "i", 0, "o", 0, 1, d, k, 0) for d, k in waits], -1, -1)


def _rebuilt(gpu: Gpu, entries: dict[int, list[_Entry]], tbs: dict[int, Threadblock],
             added: list[tuple[Threadblock, list[_Entry]]], moved: set[int],
             rename: dict[tuple[int, int], _Entry]) -> Gpu:
    """The GPU's threadblocks without the moved entries, plus the new ones, every wait pointed at where its step
    now stands (threadblocks renumbered, steps renumbered)."""
    layout: list[tuple[Threadblock, list[_Entry]]] = []
    for tb_id in sorted(entries):
        kept = [e for e in entries[tb_id] if id(e) not in moved]
        if kept:
            layout.append((tbs[tb_id], kept))
    layout += added
    by_old = {(e.tb, e.index): e for _, es in layout for e in es if e.tb >= 0}
    by_old.update(rename)
    where: dict[int, tuple[int, int]] = {}          # id(entry) -> (new tb, new index of its step)
    for new_tb, (_, es) in enumerate(layout):
        k = 0
        for e in es:
            k += len(e.nops)
            where[id(e)] = (new_tb, k)
            k += 1
    published = set()

    def target(depid: int, deps: int) -> tuple[int, int]:
        if depid < 0:
            return depid, deps
        e = by_old.get((depid, deps))
        if e is None:
            raise BackendError(f"GPU {gpu.id}: a wait on tb {depid} step {deps}, which is not a step")
        published.add(id(e))
        return where[id(e)]

    waits = {}
    for _, es in layout:
        for e in es:
            waits[id(e)] = ([target(n.depid, n.deps) for n in e.nops], target(e.step.depid, e.step.deps))
    out = []
    for new_tb, (tb, es) in enumerate(layout):
        steps = []
        for e in es:
            nop_waits, own = waits[id(e)]
            for d, s in nop_waits:
                steps.append(Step(len(steps), "nop", "i", 0, "o", 0, 1, d, s, 0))
            st = e.step
            hasdep = 1 if id(e) in published else 0
            steps.append(Step(len(steps), st.type, st.srcbuf, st.srcoff, st.dstbuf, st.dstoff, st.cnt, own[0],
                              own[1], hasdep))
        out.append(Threadblock(new_tb, tb.send, tb.recv, tb.chan, tuple(steps)))
    return replace(gpu, tbs=tuple(out), line=0)


def merge_local_copies(program: MscclProgram, max_cnt: int) -> MscclProgram:
    """``program`` with each run of local copies (``cpy``, no ``nop`` between, contiguous at both ends, the same
    buffers) made one step of up to ``max_cnt`` chunks: a Broadcast root's copy of its input to its output, one
    step per chunk in a plain lowering (2,048 on dgx1 at 1 GB), takes 29. Waits on any copy of a run wait on its
    step."""
    gpus = []
    for gpu in program.gpus:
        entries = {tb.id: _entries(tb) for tb in gpu.tbs}
        tbs = {tb.id: tb for tb in gpu.tbs}
        moved: set[int] = set()
        rename: dict[tuple[int, int], _Entry] = {}
        for tb_id, es in entries.items():
            head = None
            for e in es:
                st = e.step
                run = head.step if head is not None else None
                if run is not None and st.type == "cpy" and not e.nops and st.depid < 0 and run.cnt < max_cnt \
                        and (st.srcbuf, st.dstbuf) == (run.srcbuf, run.dstbuf) \
                        and (st.srcoff, st.dstoff) == (run.srcoff + run.cnt, run.dstoff + run.cnt):
                    head.step = replace(head.step, cnt=head.step.cnt + 1)
                    moved.add(id(e))
                    rename[(e.tb, e.index)] = head
                    continue
                head = e if st.type == "cpy" else None
        gpus.append(_rebuilt(gpu, entries, tbs, [], moved, rename))
    return replace(program, gpus=tuple(gpus), line=0)


# Flow sets tried per program (:func:`flow_choices`): each is fused and simulated by the writer.
MAX_FLOW_CHOICES = 4
ELEMENT_MARGIN = 2        # elements kept free below the reader's limit on a rank that fuses


def _flows_at(schedule: Schedule) -> dict[int, dict[tuple[int, int], list[int]]]:
    """Per relay, its fusable chunks by (source, destination), in the order the source's link carries them: a
    chunk's last receive on the relay (a copy's only one, the last partial sum of a reduction) with its earliest
    send after it (a later send to another child waits for the fused step, which ends once its own send is on the
    link, so fusing with a later one would hold the earlier back by a whole message)."""
    received: dict[tuple[int, int], list] = defaultdict(list)
    sent: dict[tuple[int, int], list] = defaultdict(list)
    for t in schedule.transfers:
        received[(t.dst, t.chunk)].append(t)
        sent[(t.src, t.chunk)].append(t)
    flows: dict[int, dict[tuple[int, int], list]] = defaultdict(lambda: defaultdict(list))
    for (relay, chunk), sends in sent.items():
        ins = received.get((relay, chunk))
        if not ins:
            continue
        last = max(ins, key=lambda t: (t.step, t.end_us or 0.0, t.src))
        first = min(sends, key=lambda t: (t.step, t.start_us or 0.0, t.dst))
        if first.step > last.step:
            flows[relay][(last.src, first.dst)].append(last)
    return {relay: {key: [t.chunk for t in sorted(ts, key=lambda t: (t.step, t.start_us or 0.0, t.chunk))]
                    for key, ts in by_key.items()} for relay, by_key in flows.items()}


def flow_choices(schedule: Schedule, program: MscclProgram, steps_per_tb: int) -> Iterator[list[Flow]]:
    """Sets of flows that take every GPU of ``program`` (a plain lowering of ``schedule``) within
    the XML reader's elements once fused, the likeliest to run as before first (at most :data:`MAX_FLOW_CHOICES`).

    Each GPU over the limit fuses the first chunks of one of its flows, as many as bring it under the limit with
    its new threadblocks. Flows are preferred whose destination is not over the limit itself (a receive moved onto
    a busy GPU's new channel cost dgx1 Broadcast 1 GB 10 us), then those with the most chunks; the alternatives
    change one GPU's flow at a time."""
    over = {gpu.id: count - MAX_XML_ELEMENTS for gpu in program.gpus
            if (count := gpu_xml_elements(program, gpu)) > MAX_XML_ELEMENTS}
    if not over:
        return
    flows_at = _flows_at(schedule)
    options: dict[int, list[tuple[int, int]]] = {}
    for relay in over:
        keys = list(flows_at.get(relay, {}))
        keys.sort(key=lambda k: (k[1] in over, -len(flows_at[relay][k]), k))
        if not keys:
            return
        options[relay] = keys
    picks = [{relay: keys[0] for relay, keys in options.items()}]
    for relay, keys in options.items():
        picks += [{**picks[0], relay: key} for key in keys[1:]]
    made = 0
    for pick in picks:
        flows = _sized(pick, flows_at, over, steps_per_tb)
        if flows is not None:
            yield flows
            made += 1
            if made >= MAX_FLOW_CHOICES:
                return


def _sized(pick: dict[int, tuple[int, int]], flows_at, over: dict[int, int], steps_per_tb: int
           ) -> list[Flow] | None:
    """The picked flows with as many chunks each as its relay must save, counting the threadblocks every fused flow
    adds at its relay, source and destination; None where a flow has too few chunks."""
    added = defaultdict(int)          # threadblocks each GPU gains
    counts = {relay: 0 for relay in pick}
    for _ in range(4):                # the threadblocks added at one GPU raise what another must save
        for relay, (src, dst) in pick.items():
            need = over[relay] + ELEMENT_MARGIN + added[relay] - ceil(counts[relay] / steps_per_tb)
            n = need
            while n - ceil(n / steps_per_tb) < need:
                n += 1
            counts[relay] = n
        added = defaultdict(int)
        for relay, (src, dst) in pick.items():
            parts = ceil(counts[relay] / steps_per_tb)
            for gpu in (relay, src, dst):
                added[gpu] += parts
    flows, taken = [], set()
    for relay, (src, dst) in pick.items():
        # no chunk in two flows: a Reduce's 4 -> 5 -> 7 and 5 -> 7 -> 3 would both move its message 5 -> 7
        chunks = [c for c in flows_at[relay][(src, dst)] if c not in taken][:counts[relay]]
        if len(chunks) < counts[relay]:
            return None
        taken.update(chunks)
        flows.append(Flow(src, relay, dst, tuple(chunks)))
    return flows
