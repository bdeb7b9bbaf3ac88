"""Lower a Schedule to an MSCCL program and render it as MSCCL XML (DESIGN section 7).

Lowering, per rank:

* every transfer becomes a send on the source and a receive on the destination, in the order of the schedule's
  steps; partial sums of combining collectives accumulate in the chunk's output slot or in scratch, never in the
  user's input;
* a chunk that is received and then forwarded is one fused step (``rcs``, ``rrs`` or ``rrcs``) when the
  receiving and the sending can share a threadblock: fused forwards are grouped into chains (the transfers of
  one chunk linked by fusion), and each chain gets a channel on which, at every rank, a threadblock has one
  receive peer and one send peer; plain sends and receives go on channel 0 (or join the chain's threadblock);
* a step that reads data another threadblock wrote waits for it (``depid``/``deps``, the writer gets
  ``hasdep=1``); several dependencies become ``nop`` steps in front of the step.

``fuse=False`` gives the simplest program: one send threadblock per out-peer and one receive threadblock per
in-peer, which is deadlock-free even with zero-buffer (rendezvous) sends.

Rendering is a pure function through a jinja2 template. Files are written only through
:mod:`backends.msccl.writer`, which judges the rendered text before anything is written.
"""

from __future__ import annotations

import copy
import functools
import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from math import ceil

import jinja2

from synth.errors import BackendError
from synth.schedule.ir import REDUCE, BufferLayout, Schedule, Transfer, buffer_layout

from backends.msccl import conventions
from backends.msccl.interpret import DEFAULT_RUNTIME_FIFO_DEPTH, RUNTIME_FIFO_DEPTH
from backends.msccl.ir import COLL_SPELLING, Gpu, MscclProgram, Step, Threadblock, safe_name
from backends.msccl.gathered import finish_gathered
from backends.msccl.implied import drop_implied
from backends.msccl.limits import MAX_CHANNELS, MAX_DEPID, MAX_TBS_PER_CHANNEL_DIRECTION, max_steps

DEFAULT_MAX_BYTES = 1 << 40
TARGETS = ("executor", "legacy")


@dataclass(eq=False)
class _Op:
    """One step being built: a send, a receive, a fused receive+send, or a local copy. Ops are compared by
    identity (each stands for its own step)."""

    kind: str                      # s | r | rcs | rrs | rrc | rrcs | cpy
    recv: Transfer | None
    send: Transfer | None
    src: tuple[str, int]
    dst: tuple[str, int]
    position: tuple
    tb_key: tuple = ()
    deps: tuple = ()               # ops this one must wait for
    writes: bool = True


def _position(step: int, phase: int, chunk: int, peer: int) -> tuple:
    # Within a step, sends (phase 0) come before receives (phase 1): a threadblock never waits for data of a
    # step before it has sent what that step needs from it.
    return (step, phase, chunk, peer)


class _RankPlan:
    """Builds the ops of one rank from the transfers it takes part in."""

    def __init__(self, rank: int, schedule: Schedule, layout, indices: _ChunkIndices):
        self.rank = rank
        self.coll = schedule.collective
        self.layout = layout
        self.indices = indices
        self.ops: list[_Op] = []

    def home(self, chunk: int) -> tuple[str, int]:
        key = (self.rank, chunk)
        if key in self.layout.slot:
            return self.layout.slot[key]
        return ("o", self.output_index(chunk))

    def output_index(self, chunk: int) -> int | None:
        return self.indices.outputs[chunk].get(self.rank)


class _ChunkIndices:
    """Per chunk, rank -> input index and rank -> output index, built once (a Chunk builds a dict per lookup)."""

    def __init__(self, coll):
        self.inputs = [dict(c.initial) for c in coll.chunks]
        self.outputs = [dict(c.destinations) for c in coll.chunks]


class _TransferIndex:
    """What both lowering modes plan from: the buffer layout, each chunk's input and output index per rank, and per
    (rank, chunk) the receives and sends in the order their ops run (planned once per schedule)."""

    def __init__(self, schedule: Schedule):
        self.layout = buffer_layout(schedule)
        self.indices = _ChunkIndices(schedule.collective)
        self.recvs_at: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
        self.sends_at: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
        for t in schedule.ordered():
            self.recvs_at[(t.dst, t.chunk)].append(t)
            self.sends_at[(t.src, t.chunk)].append(t)
        for recvs in self.recvs_at.values():  # in the order their ops run (see _position), whatever the start times
            if len(recvs) > 1:
                recvs.sort(key=lambda t: (t.step, t.src))


def _plan_ops(schedule: Schedule, fuse: bool, index: _TransferIndex | None = None):
    """Per-rank op lists with read/write slots, fused where a received chunk is forwarded."""
    coll = schedule.collective
    index = index or _TransferIndex(schedule)
    layout, indices, recvs_at, sends_at = index.layout, index.indices, index.recvs_at, index.sends_at
    plans = [_RankPlan(r, schedule, layout, indices) for r in range(coll.num_ranks)]

    # Transfers are keyed by id() here and below: they are the schedule's own objects, and hashing a frozen
    # dataclass of seven fields on every lookup dominated lowering large schedules.
    fused_at = {}     # (rank, chunk) -> (id(its last receive), the send fused into that receive)
    if fuse:
        for key, sends in sends_at.items():
            recvs = recvs_at.get(key)
            if not recvs:
                continue
            last = recvs[-1]
            for first_after in sends:       # the first send after the last receive
                if first_after.step > last.step:
                    if first_after.op == last.op:
                        fused_at[key] = (id(last), first_after)
                    break
    touched_at = defaultdict(set)    # rank -> chunks it receives or sends
    for rank, chunk in recvs_at:
        touched_at[rank].add(chunk)
    for rank, chunk in sends_at:
        touched_at[rank].add(chunk)
    slot, inputs, outputs, combining = layout.slot, indices.inputs, indices.outputs, coll.combining
    for plan in plans:
        r = plan.rank
        ops = plan.ops
        for chunk in sorted(touched_at[r]):
            key = (r, chunk)
            recvs = recvs_at.get(key, ())
            sends = sends_at.get(key, ())
            out = outputs[chunk].get(r)
            home = slot.get(key)
            if home is None:
                home = ("o", out)
            own_index = inputs[chunk].get(r)
            own = None if own_index is None else ("i", own_index)
            fused_recv, fused_send = fused_at.get(key, (None, None))
            partial = own  # where this rank's current partial sum of a reduced chunk lives
            for t in recvs:
                send = fused_send if id(t) == fused_recv else None
                if t.op == REDUCE and partial is not None:
                    src = partial
                    if send:
                        reads_later = home[0] == "o"
                        if not reads_later:
                            for s in sends:
                                if s.step > t.step and s is not send:
                                    reads_later = True
                                    break
                        kind = "rrcs" if reads_later else "rrs"
                    else:
                        kind = "rrc"
                    if kind != "rrs":
                        partial = home
                else:
                    src = home
                    kind = "rcs" if send else "r"
                    partial = home
                ops.append(_Op(kind, t, send, src, home, (t.step, 1, chunk, t.src), (), (), kind != "rrs"))
            for s in sends:
                if s is fused_send:
                    continue
                if s.op == REDUCE:
                    received_reduced = False
                    for t in recvs:
                        if t.op == REDUCE and t.step < s.step:
                            received_reduced = True
                            break
                    src = home if received_reduced else (own or home)
                else:
                    # a rank's own chunk that it also outputs is sent from the output copy (made first by a
                    # cpy), so in-place runs never write the slot a send is reading
                    received = bool(recvs) and recvs[0].step < s.step    # (receives in step order)
                    src = home if received or own is None or out is not None else own
                ops.append(_Op("s", None, s, src, src, (s.step, 0, chunk, s.dst), (), (), False))
            # out-of-place: a rank's own data that it must also output is copied from input to output
            if own is not None and out is not None and not combining and not recvs:
                ops.append(_Op("cpy", None, None, own, ("o", out), (-1, 0, chunk, r)))
        if not combining:   # chunks a rank holds and outputs but never moves (e.g. a gather root's own)
            touched = touched_at[r]
            for c in coll.chunks:
                cid = c.id
                out = outputs[cid].get(r)
                if out is not None and cid not in touched:
                    own_index = inputs[cid].get(r)
                    if own_index is not None:
                        ops.append(_Op("cpy", None, None, ("i", own_index), ("o", out), (-1, 0, cid, r)))
    return plans, layout


def _assign_threadblocks(plans, spread: dict | None = None, replicas: int = 1, group: int = 1) -> list:
    """Give every op a threadblock key (chan, recv peer, send peer); returns fused ops that found no channel.

    ``spread`` maps transfers to the channel they travel on, to split long connections. ``replicas`` > 1 splits
    the fused chains by chunk (:func:`spread_index`) into that many sets on disjoint channels: each threadblock
    of a chain then holds about 1/``replicas`` of its steps.
    """
    # Chains of fused ops: follow each fused op's outgoing transfer to the op that receives it.
    recv_op = {}
    fused_ops = []
    for plan in plans:
        for op in plan.ops:
            if op.recv is not None:
                recv_op[id(op.recv)] = op
                if op.send is not None:
                    fused_ops.append(op)
    channel_of: dict[int, int] = {}
    unplaced: list[_Op] = []
    # on (rank, chan): the send peer of the threadblock receiving from a peer, and the receive peer of the one
    # sending to a peer (a channel holds one threadblock per peer and direction)
    partner_of_in: dict[tuple[int, int, int], int] = {}
    partner_of_out: dict[tuple[int, int, int], int] = {}
    fed_by_fused = {id(op.send) for op in fused_ops}
    heads = [op for op in fused_ops if id(op.recv) not in fed_by_fused]
    visited = set()
    chains = []
    for start in sorted(heads, key=lambda o: (o.position, o.recv.dst)):
        if id(start) in visited:
            continue
        chain = [start]
        in_chain = {id(start)}
        nxt = recv_op.get(id(start.send))
        while nxt is not None and nxt.send is not None and id(nxt) not in visited and id(nxt) not in in_chain:
            chain.append(nxt)
            in_chain.add(id(nxt))
            nxt = recv_op.get(id(nxt.send))
        visited.update(in_chain)
        chains.append(chain)
    replica_of_channel: dict[int, int] = {}
    # channel 0 carries plain steps, and chains only where every channel is asked for (one set per channel:
    # a relay of 2048 chunks fused is 32 channels of 64 steps, set k on channel k as the plan times it,
    # synth.schedule.list_scheduler's cut="fused"); then a set's channel goes to its chains forwarded the most
    # common way (a chunk forwarded otherwise first took it from its 63 others: 2 x dgx2 Broadcast 256 MB, whose
    # rail's sender sent one chunk across before round its node)
    every = replicas >= MAX_CHANNELS
    chain_channels = range(0 if every else 1, MAX_CHANNELS)
    if every:
        def ends_of(chain):
            return tuple((op.recv.dst, op.recv.src, op.send.dst) for op in chain)
        alike = Counter(ends_of(chain) for chain in chains)
        chains.sort(key=lambda chain: -alike[ends_of(chain)])    # (stable: in order among the alike)
    for chain in chains:
        replica = spread_index(chain[0].recv.chunk, replicas, group)
        ends = [(op.recv.dst, op.recv.src, op.send.dst) for op in chain]    # (rank, in peer, out peer)
        for ch in ((replica,) + tuple(c for c in chain_channels if c != replica)) if every else chain_channels:
            if replica_of_channel.setdefault(ch, replica) != replica:
                continue
            if all(partner_of_in.get((r, ch, u), w) == w and partner_of_out.get((r, ch, w), u) == u
                   for r, u, w in ends):
                for r, u, w in ends:
                    partner_of_in[(r, ch, u)] = w
                    partner_of_out[(r, ch, w)] = u
                for op in chain:
                    channel_of[id(op)] = ch
                break
        else:
            unplaced.extend(chain)   # no channel left: these are unfused by the caller
    # Fused ops no chain reached (a cycle of forwards with no head) are unfused like those without a channel.
    unplaced.extend(op for op in fused_ops if id(op) not in channel_of and id(op) not in visited)
    if unplaced:
        return unplaced
    # Transfers carried on a fused channel must use that channel at their other end too.
    on_fused: dict[int, int] = {}
    for op in fused_ops:
        ch = channel_of[id(op)]
        on_fused[id(op.recv)] = ch
        on_fused[id(op.send)] = ch
    spread = spread or {}
    # Where every channel is a set's, a plain transfer goes on its chunk's set's channel (by position, a chain's
    # chunks that start or end there fell on a few channels: 2 x dgx2 Reduce, 128 steps on one threadblock)
    channel_of_replica: dict[int, int] = {}
    if replicas >= MAX_CHANNELS:
        for ch in sorted(replica_of_channel):
            channel_of_replica.setdefault(replica_of_channel[ch], ch)

    def plain_channel(t: Transfer) -> int:
        ch = on_fused.get(id(t))
        if ch is None and channel_of_replica:
            ch = channel_of_replica.get(spread_index(t.chunk, replicas, group))
        return spread.get(id(t), 0) if ch is None else ch

    for plan in plans:
        r = plan.rank
        for op in plan.ops:
            recv, send = op.recv, op.send
            if recv is not None and send is not None:
                op.tb_key = (channel_of[id(op)], recv.src, send.dst)
            elif recv is not None:
                ch = plain_channel(recv)
                op.tb_key = (ch, recv.src, partner_of_in.get((r, ch, recv.src), -1))
            elif send is not None:
                ch = plain_channel(send)
                op.tb_key = (ch, partner_of_out.get((r, ch, send.dst), -1), send.dst)
            else:   # a local copy
                op.tb_key = (0, -1, -1)
    return unplaced


def _unfuse(op: _Op, plan: _RankPlan) -> _Op:
    """Split a fused op back into its receive; the send becomes a separate op (returned)."""
    send = op.send
    op.send = None
    op.kind = {"rcs": "r", "rrcs": "rrc", "rrs": "rrc"}[op.kind]
    op.writes = True
    if op.dst[0] == "i":
        op.dst = plan.home(send.chunk)
    return _Op("s", None, send, op.dst, op.dst, _position(send.step, 0, send.chunk, send.dst), writes=False)


def _send_order(schedule: Schedule) -> list[Transfer] | None:
    """The transfers in the order in which each connection must send them (by step, chunk and source: the plan's
    order of a connection's messages, :func:`_connection_orders_agree`); None when two are alike in all of that and
    their destination (their order is then their ops' positions)."""
    order = sorted(schedule.transfers, key=lambda t: (t.step, t.chunk, t.src, t.dst))
    for a, b in zip(order, order[1:]):
        if a.step == b.step and a.chunk == b.chunk and a.src == b.src and a.dst == b.dst:
            return None
    return order


def _connection_orders_agree(plans, send_order: list[Transfer] | None = None) -> list:
    """Fused sends whose early position would reorder messages on their connection (to unfuse): on each connection
    and channel, taken in the schedule's order of its transfers (``send_order``, :func:`_send_order`), a send
    whose op runs before an earlier one's."""
    sends = [op for plan in plans for op in plan.ops if op.send is not None]
    if send_order is not None:
        op_of = {id(op.send): op for op in sends}
        ordered = [op_of[id(t)] for t in send_order]
    else:
        ordered = [sends[k] for k in sorted(range(len(sends)), key=lambda k: (
            sends[k].send.step, sends[k].send.chunk, sends[k].send.src, sends[k].position, k))]
    bad = []
    latest: dict[tuple[int, int, int], tuple] = {}     # (src, dst, chan) -> the latest position so far
    for op in ordered:
        send = op.send
        key = (send.src, send.dst, op.tb_key[0])
        last = latest.get(key)
        if last is not None and op.position < last:
            bad.append(op)
        else:
            latest[key] = op.position
    return bad


class PlannedOps:
    """The per-rank ops of one schedule on one topology, planned once per lowering mode (fused or plain): lowering
    the schedule again on other channels or with other merging starts from a fresh copy of them, not from the
    transfers. The programs lowered are kept too (a fused lowering that falls back to plain is the plain one), and
    the fit searches' misses (:attr:`misses`)."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self._planned: dict[bool, tuple[list, object]] = {}
        self.programs: dict[tuple, MscclProgram] = {}
        # lowerings measured that did not fit, without their programs (:func:`backends.msccl.fit.fit_lowering`:
        # a search for merged steps tries the unmerged lowerings of the search before it again)
        self.misses: dict[tuple, object] = {}
        self._spread: tuple[tuple, dict | None] | None = None

    @functools.cached_property
    def _index(self) -> _TransferIndex:
        return _TransferIndex(self.schedule)

    @property
    def layout(self) -> BufferLayout:
        """The schedule's :func:`~synth.schedule.ir.buffer_layout`."""
        return self._index.layout

    @functools.cached_property
    def buckets(self) -> dict[tuple[int, int], int]:
        """:func:`_peer_buckets` of the schedule."""
        return _peer_buckets(self.schedule)

    def spread(self, channels: int, group: int, steps_per_tb: int, balance: bool) -> dict | None:
        """:func:`_channels_of` the schedule; the last one asked for is kept (the fused and the plain lowering of a
        fit search cut the schedule alike; one at a time: at 1024 GPUs each holds millions of transfers)."""
        key = (channels, group, steps_per_tb, balance)
        if self._spread is None or self._spread[0] != key:
            self._spread = (key, _channels_of(self.schedule, self.buckets, channels, group, steps_per_tb, balance))
        return self._spread[1]

    @functools.cached_property
    def send_order(self) -> list[Transfer] | None:
        """:func:`_send_order` of the schedule."""
        return _send_order(self.schedule)

    def forget(self, keys) -> None:
        """Drop the programs lowered under ``keys`` (lowerings that did not fit: at 1024 GPUs each holds about a
        GB)."""
        for key in keys:
            self.programs.pop(key, None)

    def plans(self, fuse: bool) -> tuple[list[_RankPlan], object]:
        """Fresh rank plans (their ops are changed by threadblock assignment) and the buffer layout."""
        if fuse not in self._planned:
            self._planned[fuse] = _plan_ops(self.schedule, fuse, self._index)
        kept, layout = self._planned[fuse]
        plans = []
        for plan in kept:
            fresh = copy.copy(plan)
            fresh.ops = [_copy_op(op) for op in plan.ops]
            plans.append(fresh)
        return plans, layout


def _copy_op(op: _Op) -> _Op:
    """A shallow copy of an op (its fields are values or the schedule's transfers), a third of ``_Op(...)``'s
    cost."""
    fresh = object.__new__(_Op)
    fresh.__dict__ = op.__dict__.copy()
    return fresh


def lower_to_msccl(schedule: Schedule, topology=None, size_bytes: int | None = None, target: str = "executor",
                   proto: str = "Simple", name: str | None = None, min_bytes: int = 0,
                   max_bytes: int = DEFAULT_MAX_BYTES, fuse: bool = True, channels: int = 1,
                   group: int = 1, planned: PlannedOps | None = None, per_message: bool = False,
                   balance: bool = False, in_link_order: bool = False, tb_budget: int | None = None,
                   in_flight: bool = False) -> MscclProgram | OverBudget:
    """Lower a verified Schedule to an MSCCL program (threadblocks, channels, steps, dependencies).

    ``topology`` and ``size_bytes`` are accepted for a uniform backend signature; the program itself does not
    depend on them (MSCCL selects it by size range through ``min_bytes``/``max_bytes``). ``channels`` > 1 sends
    groups of ``group`` consecutive chunks round robin over that many channels (fused: over that many sets of
    channels), so each threadblock holds a share of a long connection's steps (the executor runs at most 64 per
    threadblock); :mod:`backends.msccl.merge` can then merge each group into one step. ``balance`` (without
    groups to merge) cuts every connection by its messages' positions instead, so that the channels divide its
    steps evenly whatever its chunks are (:func:`_spread_over_channels`). ``planned`` (for ``schedule``) keeps the
    per-rank ops between lowerings of one schedule. ``per_message``: dependencies between whole messages
    (:func:`_wait_per_message`), so that merging can make each message one step. ``in_link_order``: a send waits
    for the connection's message before it on another channel (:func:`_order_connections`). ``tb_budget``: when
    some GPU would hold more threadblocks than this (its SMs), :class:`OverBudget` says so as soon as the
    threadblocks are known, and no program is made. ``in_flight`` (plain, without groups to merge): each connection
    gets the channels that keep its messages in flight past the runtime's FIFO, as far as the topology's SMs allow
    (:func:`_in_flight_spread`), instead of ``balance`` or round robin by chunk.
    """
    if target not in TARGETS:
        raise BackendError(f"unknown target {target!r}; use executor or legacy")
    if schedule.gathered:     # the Allgather its transfers move, then each rank's local steps (backends.msccl.gathered)
        stage = lower_to_msccl(replace(schedule, gathered=""), topology, size_bytes, target, proto, None, min_bytes,
                               max_bytes, fuse, channels, group, planned, per_message, balance, in_link_order,
                               None if tb_budget is None else tb_budget - 1, in_flight)
        return stage if isinstance(stage, OverBudget) else finish_gathered(stage, schedule.gathered, name)
    key = (fuse, channels, group, balance, target, proto, name, min_bytes, max_bytes, per_message, in_link_order,
           in_flight)
    if planned is not None and key in planned.programs:
        return planned.programs[key]
    program = _lower(schedule, topology, size_bytes, target, proto, name, min_bytes, max_bytes, fuse, channels, group,
                     planned, per_message, balance, in_link_order, tb_budget, in_flight)
    if planned is not None and isinstance(program, MscclProgram):
        planned.programs[key] = program
    return program


@dataclass(frozen=True)
class OverBudget:
    """A lowering not made: GPU ``gpu`` would hold ``threadblocks``, more than the budget asked for (its SMs).
    Known once threadblocks are assigned, before the steps and dependencies that take most of the lowering's time
    are written (dgx1 tree packings: a fused lowering of 96 threadblocks for 80 SMs, 1.3 s of a 5 s solve); for a
    fused lowering far over the budget, as soon as its chains are first placed (:data:`OVER_BUDGET_MARGIN`: the
    count before the rounds that unfuse)."""

    threadblocks: int
    gpu: int


# Rounds of unfusing the fused sends that break a connection's order before a fused lowering falls back to plain
# sends and receives, and rounds in a row that may unfuse no fewer than the one before (no progress).
UNFUSE_ROUNDS = 8
UNFUSE_STALLED_ROUNDS = 3
# A fused lowering whose chains, all placed, take this many times its threadblock budget is given up before the
# rounds that unfuse what breaks a connection's order: they unfuse a few percent of the chains and rarely free a
# tenth of the threadblocks (dgx1 1 GB tree packings on 10 channels, 80 SMs: Allgather 115 -> 106 in 6 rounds,
# Allreduce 129 -> 116 and ReduceScatter 142 -> 139 in 8, then plain); those rounds were 1 s of a 6 s solve.
OVER_BUDGET_MARGIN = 1.25


def _lower(schedule: Schedule, topology, size_bytes, target: str, proto: str, name: str | None, min_bytes: int,
           max_bytes: int, fuse: bool, channels: int, group: int, planned: PlannedOps | None,
           per_message: bool = False, balance: bool = False, in_link_order: bool = False,
           tb_budget: int | None = None, in_flight: bool = False) -> MscclProgram | OverBudget:
    """:func:`lower_to_msccl` without the memo."""
    plans, layout = planned.plans(fuse) if planned is not None else _plan_ops(schedule, fuse)
    spread = _in_flight_spread(schedule, channels, RUNTIME_FIFO_DEPTH.get(proto, DEFAULT_RUNTIME_FIFO_DEPTH),
                               topology, max_steps(target)) if in_flight and not fuse and group <= 1 else None
    if spread is None:
        spread = planned.spread(channels, group, max_steps(target), balance) if planned is not None else \
            _channels_of(schedule, _peer_buckets(schedule), channels, group, max_steps(target), balance)
    send_order = planned.send_order if planned is not None else _send_order(schedule)
    unfused = []       # ops unfused per round
    for _ in range(UNFUSE_ROUNDS):
        bad = _assign_threadblocks(plans, spread, channels if fuse else 1, group)
        if not bad and tb_budget is not None:
            # all placed and far over: given up whether or not the connections' orders agree (either way the
            # budget rules it out, see below)
            over = _most_threadblocks(plans)
            if over[0] > tb_budget * OVER_BUDGET_MARGIN:
                return OverBudget(*over)
        bad = bad or _connection_orders_agree(plans, send_order)
        if not bad:
            break
        unfused.append(len(bad))
        if len(unfused) >= UNFUSE_STALLED_ROUNDS and all(
                a <= b for a, b in zip(unfused[-UNFUSE_STALLED_ROUNDS:], unfused[-UNFUSE_STALLED_ROUNDS + 1:])):
            break      # as many bad each round: this ends unfused anyway
        bad_ids = {id(b) for b in bad}
        for plan in plans:
            extra = [_unfuse(op, plan) for op in plan.ops if id(op) in bad_ids and op.recv is not None]
            plan.ops.extend(extra)
    if bad:
        return lower_to_msccl(schedule, topology, size_bytes, target, proto, name, min_bytes, max_bytes, False,
                              channels, group, planned, per_message, balance, in_link_order, tb_budget, in_flight)
    if tb_budget is not None:
        over = _most_threadblocks(plans)
        if over[0] > tb_budget:
            return OverBudget(*over)
    coll = schedule.collective
    peers = _PeerSlots({id(op.send): op.src for plan in plans for op in plan.ops if op.send is not None},
                       {id(op.recv): op.dst for plan in plans for op in plan.ops if op.recv is not None})
    inplace = 0 if coll.name == "alltoall" else 1
    gpus = [_emit_gpu(plan, layout.scratch_chunks[plan.rank], coll, peers, topology, inplace, per_message,
                      in_link_order) for plan in plans]
    nchannels = 1 + max((tb.chan for g in gpus for tb in g.tbs), default=0)
    return MscclProgram(
        name=name or safe_name(f"synth_{coll.name}_{schedule.topology}_s{schedule.steps}_c{coll.chunks_per_rank}"),
        proto=proto, nchannels=nchannels, ngpus=coll.num_ranks,
        nchunksperloop=conventions.nchunksperloop(coll.name, coll.input_chunks, coll.num_ranks),
        coll=COLL_SPELLING[target] if coll.name == "reducescatter" else coll.name, inplace=inplace,
        outofplace=1, min_bytes=min_bytes, max_bytes=max_bytes, gpus=tuple(gpus))


def _most_threadblocks(plans) -> tuple[int, int]:
    """(threadblocks, rank) of the rank with the most threadblocks (the last such), once every op has its key."""
    return max(((len({op.tb_key for op in plan.ops}), plan.rank) for plan in plans), default=(0, 0))


def _order_shared_ports(ops: list[_Op], topology, per_message: bool = False) -> None:
    """Sends leaving through one switch egress port (an NVSwitch port, a NIC) follow the schedule's order.

    Sends to different peers live in different threadblocks, so nothing else in the XML says which goes first
    on the shared port; without this the runtime (and the simulator) serve them in whatever order they become
    ready, which can be far from the planned one. Fused ops (``rcs``/``rrs``) are not held back: their receive
    would wait for another threadblock's send, and with FIFO back-pressure relays of two rails then wait on each
    other in a cycle (a deadlock; 4 x dgx-h100 on rails, ring Allgather).

    ``per_message``: a step's sends take the port peer by peer (each peer's chunks together, as one message)
    rather than chunk by chunk over the peers, so that each message waits only for the message before it; the
    peers of a port take turns that start at a different peer for each sender, so that the ranks' first messages
    do not all queue at one receiver's port (dgx-h100 x2 direct-exchange Allreduce 1 KB: in peer order every GPU
    of one node sent to GPU 0 of the other first, 2.31 us; in turns 2.16 us).
    """
    previous = {}
    egress: dict[tuple[int, int], object] = {}     # (src, dst) -> the sender's egress port, or None
    sends = [o for o in ops if o.send is not None]
    for op in sends:
        pair = (op.send.src, op.send.dst)
        if pair not in egress:
            link = topology.link(*pair)
            egress[pair] = None if link is None else link.sender_port
    if all(port is None for port in egress.values()):
        return      # no send leaves through a shared port (direct links)
    order = (lambda o: o.position)
    if per_message:
        peers_of_port: dict = defaultdict(set)
        for (src, dst), port in egress.items():
            peers_of_port[port].add(dst)
        turn = {}
        for port, peers in peers_of_port.items():
            peers = sorted(peers)
            turn.update({(port, dst): k for k, dst in enumerate(peers)})
            sender = next(src for (src, _), p in egress.items() if p == port)
            # among its peers, the ones after the sender come first (a ring's turns); beyond them all (a NIC's
            # peers on another node), a turn by the sender's number
            first = sum(1 for dst in peers if dst < sender) if peers[0] < sender < peers[-1] else sender
            for dst in peers:
                turn[(port, dst)] = (turn[(port, dst)] - first) % len(peers)
        order = (lambda o: (o.position[0], o.position[1], turn[(egress[(o.send.src, o.send.dst)], o.send.dst)],
                            o.position[2]))
    for op in sorted(sends, key=order):
        port = egress[(op.send.src, op.send.dst)]
        if port is None:
            continue
        before = previous.get(port)
        # (the same connection on another channel shares the link itself, which serves its messages in turn)
        # a fused op's receive would wait too: with FIFO back-pressure that closes cycles through the relays
        if before is not None and before.tb_key != op.tb_key and before not in op.deps \
                and before.send.dst != op.send.dst and op.recv is None:
            op.deps = tuple(d for d in op.deps if d.tb_key != before.tb_key) + (before,)
        previous[port] = op


def _order_connections(ops: list[_Op]) -> None:
    """Each send of data the rank holds waits for the send before it (the schedule's order) on the same connection
    when that one is on another channel: the link then serves the connection's messages in the plan's order.

    A connection cut over channels has a threadblock per channel, and the link serves whichever is ready: sends of
    a rank's own data (ready at once) overtake the partial sums it relays, which wait for their receives, and the
    partial sums that the rank's in-tree parent needs next arrive late (dgx1 Reduce 1 GB: the root's inbound links
    started 43-85 us late, 98.2% of the limit; in order, 98.9%, as planned). Only sends that wait for nothing else
    wait (a second wait costs a ``nop`` step: every relay's, and dgx1 Reduce no longer fit 64 steps), and it is a
    variant the writer tries where the plan is faster than the file, not the rule (it slowed ReduceScatter).
    """
    previous: dict[tuple[int, int], _Op] = {}
    for op in sorted((o for o in ops if o.send is not None), key=lambda o: o.position):
        pair = (op.send.src, op.send.dst)
        before = previous.get(pair)
        previous[pair] = op
        if before is not None and before.tb_key != op.tb_key and op.recv is None and not op.deps:
            op.deps = (before,)


def _channels_of(schedule: Schedule, buckets: dict, channels: int, group: int, steps_per_tb: int,
                 balance: bool) -> dict | None:
    """The channel of every transfer (:func:`_spread_over_channels`), None where all go on one."""
    if channels <= 1 and not buckets:
        return None
    return _spread_over_channels(schedule, channels, group, buckets, steps_per_tb, balance)


def _spread_over_channels(schedule: Schedule, channels: int, group: int = 1,
                          buckets: dict[tuple[int, int], int] | None = None, steps_per_tb: int | None = None,
                          balance: bool = False) -> dict:
    """Channel of every transfer (by id; both ends of a connection agree), in the set of ``channels`` that
    ``buckets`` gives its connection (:func:`_peer_buckets`; none: set 0). When some connection has more messages
    than a threadblock holds (``steps_per_tb``), or when asked to ``balance``, and no groups of ``group`` chunks are
    to merge, channels bound the steps: a message goes by its position among its connection's messages modulo the
    connection's share of the channels (in proportion to its messages, so light connections take fewer
    threadblocks). Otherwise channels add
    parallelism: :func:`spread_index` of its chunk (a chunk takes one channel everywhere; ndv2 x2 Allreduce 1 KB
    on 8 channels: 4.2 us, by position 5.5 us).

    By position, the connection's threadblocks take its messages in turn, which is the schedule's order on the
    link (the link serves whichever threadblock is ready): by chunk, a tree packing whose link carries chunks 0, 8,
    16, ... of one tree and then of another put a tree's run on one threadblock and let the others overtake it
    (dgx1 ReduceScatter 1 GB on 8 channels: 0.8% slower than planned; 0.2% by position). By chunk, channels may
    also not divide a connection at all: on 64 x dgx-h100 on rails, every chunk crossing GPU 0's rail is a
    multiple of 8 apart, so 2, 4 and 8 channels left its 64 messages (and their 64 dependency ``nop`` steps) on
    one threadblock; the fit search therefore asks to ``balance``."""
    channel: dict[int, int] = {}
    per_connection: dict[tuple[int, int], list] = defaultdict(list)
    for t in schedule.transfers:
        per_connection[(t.src, t.dst)].append(t)
    longest = max((len(messages) for messages in per_connection.values()), default=0)
    if group <= 1 and (balance or steps_per_tb is None or longest > steps_per_tb):
        for messages in per_connection.values():
            # a connection with fewer messages needs fewer threadblocks for the same steps each
            share = max(1, ceil(channels * len(messages) / longest))
            for k, t in enumerate(sorted(messages, key=lambda t: (t.step, t.chunk))):
                channel[id(t)] = k % share
    buckets = buckets or {}
    if len(channel) == len(schedule.transfers) and not buckets:
        return channel
    return {id(t): (channel[id(t)] if id(t) in channel else spread_index(t.chunk, channels, group))
            + channels * buckets.get((t.src, t.dst), 0) for t in schedule.transfers}


def _in_flight_spread(schedule: Schedule, channels: int, fifo_depth: int, topology, steps_per_tb: int
                      ) -> dict[int, int] | None:
    """Channel of every transfer (by id) such that the messages of each connection queue behind the runtime's FIFO
    (``fifo_depth`` per connection and channel) as little as the GPUs' SMs allow: each connection takes its messages
    by position over its own number of channels (never more than ``channels``, nor more than its messages fill
    ``fifo_depth`` at a time), given first where draining the connection's queue costs the most (its alpha times
    the rounds of ``fifo_depth`` messages it still waits), as long as both ends keep a threadblock per SM (plain
    sends and receives: one threadblock per connection and channel, and one for local copies). None when some GPU
    has more peers than a channel holds (:func:`_peer_buckets`) or no connection queues.

    Round robin by chunk (:func:`spread_index`) knows nothing of the FIFO: TE-CCL's two NDv2 nodes relay an
    Alltoall's 64 blocks of a node over one link of alpha 1.3 us, and chunks ``src * 16 + dst`` fell on 16 of 32
    channels, four behind each FIFO of two (4.81 us for a plan of 4.20); here every one is in flight at once, and
    the light NVLink connections take only the channels their messages fill (4.20 us within 80 SMs).
    """
    if _peer_buckets(schedule):
        return None
    per_connection: dict[tuple[int, int], list] = defaultdict(list)
    for t in schedule.transfers:
        per_connection[(t.src, t.dst)].append(t)
    # a threadblock past MAX_DEPID cannot be waited for (depid is a signed byte): ring-8's bidirectional Alltoall
    # on 129 threadblocks failed its check, and the writer fell back to a file 0.5% slower
    budget = min(topology.sms_per_gpu if topology is not None and topology.sms_per_gpu is not None else float("inf"),
                 MAX_DEPID + 1)
    share = {c: max(1, ceil(len(messages) / steps_per_tb)) for c, messages in per_connection.items()}
    used: Counter = Counter()
    for (src, dst), k in share.items():
        used[src] += k
        used[dst] += k

    def rounds(c: tuple[int, int]) -> int:
        return ceil(len(per_connection[c]) / (share[c] * fifo_depth))

    alpha = {c: (topology.link(*c).alpha_us if topology is not None and topology.link(*c) is not None else 1.0)
             for c in per_connection}
    if all(rounds(c) <= 1 for c in per_connection):
        return None
    queue = [(-alpha[c] * rounds(c), c) for c in sorted(per_connection)]
    heapq.heapify(queue)
    while queue:
        _, c = heapq.heappop(queue)
        waits = rounds(c)
        if waits <= 1:
            continue
        wanted = min(channels, ceil(len(per_connection[c]) / (fifo_depth * (waits - 1))))   # one round fewer
        extra = wanted - share[c]
        if extra <= 0 or max(used[c[0]], used[c[1]]) + extra + 1 > budget:
            continue     # (one threadblock kept for local copies)
        share[c] = wanted
        used[c[0]] += extra
        used[c[1]] += extra
        heapq.heappush(queue, (-alpha[c] * rounds(c), c))
    return {id(t): k % share[c] for c, messages in per_connection.items()
            for k, t in enumerate(sorted(messages, key=lambda t: (t.step, t.chunk)))}


def _peer_buckets(schedule: Schedule) -> dict[tuple[int, int], int]:
    """The set of channels each connection (src, dst) goes on, for ranks with more peers in one direction than a
    channel holds (32 sending and 32 receiving threadblocks per GPU, one per peer in the plain lowering); empty
    when every rank fits one set.

    Whole connections are placed in order, each in the set where its sender's sends and its receiver's receives
    are fewest together, never over the limit; a set more is opened if that ever fails. (A hash of the peers
    cannot do it: at 32 x dgx-h100 on rails, GPU 0's 31 rail peers are all multiples of 8.)
    """
    peers: dict[tuple[int, int], set[int]] = defaultdict(set)
    for t in schedule.transfers:
        peers[(t.src, 0)].add(t.dst)
        peers[(t.dst, 1)].add(t.src)
    most = max((len(p) for p in peers.values()), default=0)
    if most <= MAX_TBS_PER_CHANNEL_DIRECTION:
        return {}
    connections = sorted({(src, dst) for (src, direction), dsts in peers.items() if direction == 0 for dst in dsts})
    count = -(-most // MAX_TBS_PER_CHANNEL_DIRECTION)
    while True:
        sends: dict[int, list[int]] = defaultdict(lambda: [0] * count)
        recvs: dict[int, list[int]] = defaultdict(lambda: [0] * count)
        bucket_of = {}
        for src, dst in connections:
            out, into = sends[src], recvs[dst]
            free = [b for b in range(count)
                    if out[b] < MAX_TBS_PER_CHANNEL_DIRECTION and into[b] < MAX_TBS_PER_CHANNEL_DIRECTION]
            if not free:
                break
            b = min(free, key=lambda b: (out[b] + into[b], b))
            out[b] += 1
            into[b] += 1
            bucket_of[(src, dst)] = b
        else:
            return bucket_of
        count += 1


def spread_index(chunk: int, channels: int, group: int = 1) -> int:
    """Which of ``channels`` a chunk travels on: groups of ``group`` consecutive chunks, round robin.

    Round robin keeps each channel's messages in the schedule's order (a pipelined schedule sends its chunks
    in order, so every channel progresses alike, as planned); groups of consecutive chunks stay on one channel,
    so they can merge into one step of ``cnt = group`` (:mod:`backends.msccl.merge` cuts at the same multiples).
    """
    return (chunk // max(1, group)) % channels


def _memory_key(slot: tuple[str, int], coll, rank: int) -> tuple[str, int]:
    """Where a slot lives when ``i`` and ``o`` alias (in-place), so aliased slots order like one."""
    buf, idx = slot
    return ("s", idx) if buf == "s" else ("io", coll.unified_index(rank, buf, idx))


def _add_dependencies(ops: list[_Op], key) -> None:
    """Each op waits for the last earlier writer of what it reads or writes (read/write-after-write) and, when
    it writes, for the earlier readers since that writer (write-after-read), wherever they are in another tb. A
    write that waits for readers does not also wait for the writer they read (each reader came after it): a
    second dependency costs a ``nop`` step, and the receives of an Allreduce's second half each had one."""
    last_writer: dict = {}
    readers_since: dict = {}
    for op in sorted(ops, key=_by_position):
        src, dst = key(op.src), key(op.dst)
        writes = op.writes
        readers = readers_since.get(dst) if writes else None
        deps = []
        for slot in {src, dst} if writes else (src,):
            # a write after reads waits for those readers, and each of them already came after the last writer
            if slot in last_writer and not (readers and slot == dst):
                deps.append(last_writer[slot])
        if readers:
            deps += readers
        if deps:
            tb = op.tb_key
            latest_per_tb = {}
            for d in deps:   # within one tb, waiting for its latest op covers the earlier ones
                other = d.tb_key
                if other != tb:
                    latest = latest_per_tb.get(other)
                    if latest is None or latest.position < d.position:
                        latest_per_tb[other] = d
            op.deps = tuple(latest_per_tb.values())
        else:
            op.deps = ()
        if writes:
            last_writer[dst] = op
            readers_since[dst] = []
        if src != dst or not writes:
            if src in readers_since:
                readers_since[src].append(op)
            else:
                readers_since[src] = [op]


def _by_position(op: _Op) -> tuple:
    return op.position


def _message_runs(ops: list[_Op]) -> list[list[_Op]]:
    """A threadblock's ops (in order) cut into messages: consecutive ops of one kind between the same peers in the
    same step, which :mod:`backends.msccl.merge` may join into one step of ``cnt > 1``."""
    runs: list[list[_Op]] = []
    last_key = None
    for op in ops:
        key = (op.kind, op.position[:2], op.recv.src if op.recv else None, op.send.dst if op.send else None,
               op.send.step if op.send else None, (op.recv or op.send).op if (op.recv or op.send) else None)
        if runs and key == last_key:
            runs[-1].append(op)
        else:
            runs.append([op])
        last_key = key
    return runs


def _wait_per_message(by_tb: dict) -> None:
    """Dependencies per message instead of per chunk: the first op of each message (:func:`_message_runs`) waits
    for the whole of every message any of its ops waited for (their last op), and its other ops wait for nothing.

    Per chunk, chunk k of a message waits for chunk k of another threadblock's message: each op then carries its own
    ``depid`` (or ``nop`` steps), and :mod:`backends.msccl.merge` cannot join them, so a whole-buffer message goes
    as one message per chunk, each paying the link's alpha with two in flight (the runtime's FIFO): dgx2 x2
    Allreduce 1 KB by direct exchange, 32 chunks per 2.6 us network message. Waiting for whole messages is what a
    merged step does anyway; the later ops of a message follow its first in their threadblock, so they wait too.
    """
    last_of: dict[int, _Op] = {}
    runs = [run for ops in by_tb.values() for run in _message_runs(ops)]
    for run in runs:
        for op in run:
            last_of[id(op)] = run[-1]
    for run in runs:
        latest_per_tb: dict = {}
        for op in run:
            for d in op.deps:
                d = last_of[id(d)]
                if d.tb_key not in latest_per_tb or latest_per_tb[d.tb_key].position < d.position:
                    latest_per_tb[d.tb_key] = d
        run[0].deps = tuple(latest_per_tb.values())
        for op in run[1:]:
            op.deps = ()


@dataclass(frozen=True)
class _PeerSlots:
    """Where each transfer (by id) is read at its sender and written at its receiver.

    A plain send's destination fields and a plain receive's source fields name nothing local; msccl-tools writes
    the other end's slot there, and checkers such as MSCCL-XML-Verifier match messages by them (the runtimes do
    not read them)."""

    sent_from: dict
    received_into: dict


def _emit_gpu(plan: _RankPlan, scratch: int, coll, peers: _PeerSlots, topology=None, inplace: int = 1,
              per_message: bool = False, in_link_order: bool = False) -> Gpu:
    by_tb = defaultdict(list)
    for op in plan.ops:
        by_tb[op.tb_key].append(op)
    keys = sorted(by_tb)
    for k in keys:
        by_tb[k].sort(key=_by_position)
    # Dependencies: an op reading or writing a slot waits for the last earlier writer of that slot in another tb.
    # only an in-place program's i and o alias (an out-of-place one waiting for them only stalls)
    _add_dependencies(plan.ops, functools.cache(lambda slot: _memory_key(slot, coll, plan.rank)) if inplace
                      else (lambda slot: slot))
    if topology is not None:
        _order_shared_ports(plan.ops, topology, per_message)
    if in_link_order:
        _order_connections(plan.ops)
    if per_message:
        _wait_per_message(by_tb)
    drop_implied(by_tb, keys)
    # where each op lands: its threadblock and its step there (each dependency but the last is a nop before it)
    tb_of: dict[int, int] = {}
    index_of: dict[int, int] = {}
    published = set()
    for tb, k in enumerate(keys):
        i = 0
        for op in by_tb[k]:
            tb_of[id(op)] = tb
            deps = op.deps
            if deps:
                i += len(deps) - 1
                published.update(map(id, deps))
            index_of[id(op)] = i
            i += 1
    sent_from, received_into = peers.sent_from, peers.received_into
    out_tbs = []
    for tb, k in enumerate(keys):
        chan, recv, send = k
        emitted = []
        for op in by_tb[k]:
            for d in op.deps[:-1]:
                emitted.append(Step(len(emitted), "nop", "i", 0, "o", 0, 1, tb_of[id(d)], index_of[id(d)], 0))
            if op.deps:
                last = op.deps[-1]
                depid, deps = tb_of[id(last)], index_of[id(last)]
            else:
                depid, deps = -1, -1
            kind = op.kind     # a plain send names the receiver's slot, a plain receive the sender's (_PeerSlots)
            if kind == "s":
                (sb, so), (db, do) = op.src, received_into.get(id(op.send), op.dst)
            elif kind == "r":
                (sb, so), (db, do) = sent_from.get(id(op.recv), op.src), op.dst
            else:
                (sb, so), (db, do) = op.src, op.dst
            emitted.append(Step(len(emitted), kind, sb, so, db, do, 1, depid, deps, 1 if id(op) in published else 0))
        out_tbs.append(Threadblock(tb, send, recv, chan, tuple(emitted)))
    return Gpu(plan.rank, coll.input_chunks, coll.output_chunks, scratch, tuple(out_tbs))


# ----------------------------------------------------------------------------------------------- render

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("backends.msccl", "templates"), undefined=jinja2.StrictUndefined,
                          autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render_msccl_xml(program: MscclProgram) -> str:
    """The program as MSCCL XML text (no prolog, two-space indentation, each element on one line)."""
    return _ENV.get_template("msccl.xml.j2").render(algo=program)
