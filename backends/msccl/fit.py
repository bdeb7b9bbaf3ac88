"""Will a schedule's MSCCL program fit the runtime, and lowered how? Answered from the lowered program's shape,
without rendering, parsing or executing it (DESIGN section 7 limits).

A program fits when every threadblock holds at most the target's steps (64 executor, 256 legacy), a GPU holds at
most its SM count of threadblocks, and channels, ``cnt`` and threadblocks per channel stay within the runtime's
limits (:mod:`backends.msccl.limits`). Two tools make a long schedule fit, and both cost something:

- more channels (:func:`~backends.msccl.lowering.lower_to_msccl` ``channels``): each connection's messages are cut
  into consecutive blocks on their own threadblocks, so a threadblock holds fewer steps; costs threadblocks (SMs);
- merged steps (:func:`~backends.msccl.merge.merge_contiguous` ``max_cnt``): consecutive chunks move as one
  message of up to ``max_cnt`` chunks; costs pipelining (a relay forwards a message once it has all of it).

:func:`fit_lowering` searches for the smallest ``max_cnt`` (the pipelining is what the plan was made for), then
the fewest channels, that fit; :func:`plan_fit` does it for both lowerings (fused chains and plain
send/receive) and says which fit, or the exact limit that rules the schedule out. The verified writer
(:mod:`backends.msccl.writer`) renders, judges and simulates only what fits; synthesis may call
:func:`plan_fit` to skip a hopeless candidate early and say why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from math import ceil
from typing import Iterable, Iterator

from backends.msccl.findings import Finding
from backends.msccl.fuse_flows import flow_choices, fuse_flows, merge_local_copies
from backends.msccl.ir import Gpu, MscclProgram, Threadblock
from backends.msccl.limits import (LIMIT_KINDS, MAX_CHANNELS, MAX_CNT, MAX_DEPID, MAX_STEPS_EXECUTOR,
                                   MAX_TBS_PER_CHANNEL_DIRECTION, MAX_XML_ELEMENTS, connection_findings, max_steps,
                                   nchannels_findings, ngpus_findings, step_limit_findings, tb_limit_findings,
                                   tbs_per_gpu_findings, xml_elements, xml_elements_findings)
from backends.msccl.lowering import DEFAULT_MAX_BYTES, OverBudget, PlannedOps, lower_to_msccl
from backends.msccl.merge import merge_contiguous
from backends.msccl.step_floor import element_floor_reason
from synth.errors import BackendError
from synth.model.topology import Topology
from synth.schedule.ir import BufferLayout, Schedule, buffer_layout

MAX_TRIALS = 12     # lowerings tried per mode before giving up (each is linear in the schedule)
WIDEN_MAX_STEPS = 40_000   # programs larger than this are not lowered again on more channels


@dataclass(frozen=True)
class Lowering:
    """How a schedule is lowered: fused ``rcs``/``rrs`` chains or plain sends and receives, the channels each
    connection is cut into, and the most chunks one merged step carries (1: no merging). ``balanced``: the
    channels cut each connection by its messages' positions, so they divide its steps evenly (the fit search's
    cuts: its arithmetic assumes that), rather than by chunk (:func:`~backends.msccl.lowering.spread_index`).
    ``in_link_order``: a connection's messages leave in the schedule's order across its channels
    (:func:`~backends.msccl.lowering._order_connections`). ``in_flight``: each connection takes the channels that
    keep its messages in flight past the runtime's FIFO, within the SMs
    (:func:`~backends.msccl.lowering._in_flight_spread`; plain lowerings). ``fused_flows``: a plain lowering too
    long for the XML reader with chosen flows fused on channels of their own (:func:`fused_flow_fits`)."""

    fuse: bool
    channels: int = 1
    max_cnt: int = 1
    strict_merge: bool = False
    per_message: bool = False
    balanced: bool = False
    in_link_order: bool = False
    in_flight: bool = False
    fused_flows: bool = False

    @property
    def label(self) -> str:
        extra = [f"{self.channels} channels"] if self.channels > 1 else []
        extra += [f"cnt <= {self.max_cnt}"] if self.max_cnt > 1 else []
        extra += ["whole messages"] if self.per_message else []
        extra += ["in link order"] if self.in_link_order else []
        extra += ["in flight"] if self.in_flight else []
        extra += ["fused flows"] if self.fused_flows else []
        return ("fused" if self.fuse else "plain") + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class Fit:
    """A lowered program and the runtime limits it breaks (none: it fits). ``program`` is None for a lowering
    stopped once it had more threadblocks than the GPU's SMs (:func:`fit_lowering`; ``steps_per_tb`` 0)."""

    lowering: Lowering
    program: MscclProgram | None
    tbs_per_gpu: int
    steps_per_tb: int
    broken: tuple[Finding, ...]

    @property
    def fits(self) -> bool:
        return not self.broken

    def reason(self, count: int = 3) -> str:
        """The limits broken, as the verdict words them (at most ``count``)."""
        return "; ".join(str(f) for f in self.broken[:count])


@dataclass(frozen=True)
class FitPlan:
    """Per lowering mode (fused first), the best fit found or the closest miss."""

    target: str
    fits: tuple[Fit, ...]
    misses: tuple[Fit, ...]

    @property
    def ok(self) -> bool:
        return bool(self.fits)

    def reason(self) -> str:
        """Why nothing fits (empty when something does)."""
        if self.fits:
            return ""
        return " / ".join(f"{m.lowering.label} lowering: {m.reason()}" for m in self.misses)


def lower_fitted(schedule: Schedule, topology: Topology, target: str, lowering: Lowering, *, proto: str = "Simple",
                 name: str | None = None, min_bytes: int = 0, max_bytes: int = DEFAULT_MAX_BYTES,
                 planned: PlannedOps | None = None, tb_budget: int | None = None) -> MscclProgram | OverBudget:
    """The schedule lowered as ``lowering`` says (channels, then merged steps); ``planned`` keeps the per-rank ops
    between lowerings of the one schedule (:class:`~backends.msccl.lowering.PlannedOps`); ``tb_budget`` as in
    :func:`~backends.msccl.lowering.lower_to_msccl`."""
    program = lower_to_msccl(schedule, topology=topology, target=target, fuse=lowering.fuse,
                             channels=lowering.channels, group=lowering.max_cnt, proto=proto, name=name, min_bytes=min_bytes,
                             max_bytes=max_bytes, planned=planned, per_message=lowering.per_message,
                             balance=lowering.balanced, in_link_order=lowering.in_link_order, tb_budget=tb_budget,
                             in_flight=lowering.in_flight)
    if isinstance(program, OverBudget):
        return program
    return merge_contiguous(program, lowering.max_cnt, lowering.strict_merge)


def lowered_fit(schedule: Schedule, topology: Topology, target: str, lowering: Lowering,
                tb_budget: int | None = None, **program_options) -> Fit:
    """``schedule`` lowered as ``lowering`` says (:func:`lower_fitted`) and measured against ``target`` and the
    topology's SMs (:func:`measure`); a lowering stopped for its threadblocks (``tb_budget``) is a miss that says
    so."""
    sms = topology.sms_per_gpu
    program = lower_fitted(schedule, topology, target, lowering, tb_budget=tb_budget, **program_options)
    if isinstance(program, OverBudget):
        return _over_budget(program, lowering, sms)
    return measure(program, lowering, target, sms)


def _over_budget(over: OverBudget, lowering: Lowering, sms: int) -> Fit:
    """The fit of a lowering stopped for its threadblocks: the verdict's own words for the SM limit."""
    gpu = Gpu(over.gpu, 0, 0, 0, tuple(Threadblock(k, -1, -1, 0, ()) for k in range(over.threadblocks)))
    return Fit(lowering, None, over.threadblocks, 0, tuple(tbs_per_gpu_findings(gpu, sms)))


def measure(program: MscclProgram, lowering: Lowering, target: str, sms: int | None) -> Fit:
    """The program's shape and the runtime limits it breaks on ``target`` (no rendering, no execution)."""
    found = nchannels_findings(program) + ngpus_findings(program)
    for gpu in program.gpus:   # the limit rules of limits.runtime_limits, without its per-step buffer checks
        found += connection_findings(gpu) + tbs_per_gpu_findings(gpu, sms) + xml_elements_findings(program, gpu)
        many = len(gpu.tbs) > MAX_DEPID + 1     # a step may then wait for a tb whose id its depid cannot hold
        for tb in gpu.tbs:
            found += tb_limit_findings(program, gpu, tb)
            if any(not 1 <= st.cnt <= MAX_CNT for st in tb.steps if st.type != "nop") or (
                    many and any(st.depid > MAX_DEPID for st in tb.steps)):
                found += [f for k, st in enumerate(tb.steps)
                          for f in step_limit_findings(st, {"gpu": gpu.id, "tb": tb.id, "step": k})]
    broken = tuple(f for f in found if (f.kind in LIMIT_KINDS or f.kind == "dependency") and f.severity == "error"
                   and target in f.runtimes)
    tbs = max((len(g.tbs) for g in program.gpus), default=0)
    steps = max((len(tb.steps) for g in program.gpus for tb in g.tbs), default=0)
    return Fit(lowering, program, tbs, steps, broken)


def fit_lowering(schedule: Schedule, topology: Topology, target: str = "executor", fuse: bool = True,
                 strict_merge: bool = False, most_cnt: int = MAX_CNT, **program_options) -> Fit:
    """The lowering of ``schedule`` with the smallest ``max_cnt`` (at most ``most_cnt``; 1: no merging), then the
    fewest channels, that fits ``target`` and the topology's SMs; when none does, the closest miss (its ``broken``
    says why).

    The search starts at the channels the longest connection needs unmerged; each trial lowers the schedule once
    (linear in its transfers); at most :data:`MAX_TRIALS` are tried.

    Examples
    --------
    A broadcast pipelined in 200 pieces down the chain 0 -> 1 -> 2 -> 3 of ``ring-4``: 200 messages per
    connection, 64 steps per threadblock on the executor. With SMs to spare the pieces go round robin over 4
    channels; on a GPU of 2 SMs (one send and one receive threadblock) they travel 4 to a step instead.

    >>> from dataclasses import replace
    >>> from synth.model.collectives import make_collective
    >>> from synth.model.topology import load_topology
    >>> from synth.schedule.ir import Schedule, Transfer
    >>> chain = tuple(Transfer(c, r, r + 1, step=c + r) for c in range(200) for r in range(3))
    >>> schedule = Schedule(make_collective("broadcast", 4, 200, 0), "ring-4", chain, 202)
    >>> fit_lowering(schedule, load_topology("ring-4")).lowering.label
    'fused (4 channels)'
    >>> small = replace(load_topology("ring-4"), sms_per_gpu=2)
    >>> fit = fit_lowering(schedule, small, fuse=False)
    >>> fit.lowering.label, fit.tbs_per_gpu, fit.steps_per_tb
    ('plain (cnt <= 4)', 2, 50)
    """
    limit = max_steps(target)
    sms = topology.sms_per_gpu
    program_options.setdefault("planned", PlannedOps(schedule))    # every trial lowers the same ops
    # a connection's messages need at least this many channels of ``limit`` steps (unmerged): start there
    longest = _longest_connection(schedule)
    channels, max_cnt = max(1, min(MAX_CHANNELS, ceil(longest / limit))), 1
    best: Fit | None = None
    planned = program_options["planned"]
    lowered: dict[int, list] = {}    # id(fit) -> the memo keys its trial added (forgotten when it is no longer best)
    tried = set()
    for _ in range(MAX_TRIALS):
        if (channels, max_cnt) in tried:
            break
        tried.add((channels, max_cnt))
        # cuts made to bound the steps divide them evenly (one channel: nothing to cut)
        lowering = Lowering(fuse, channels, max_cnt, strict_merge, balanced=channels > 1)
        memo = (lowering, target, sms, tuple(sorted((k, v) for k, v in program_options.items() if k != "planned")))
        fit = planned.misses.get(memo) if planned is not None else None
        if fit is None:
            before = set(planned.programs) if planned is not None else set()
            # a fused lowering stops once it has more threadblocks than SMs: steps and dependencies are not written
            fit = lowered_fit(schedule, topology, target, lowering, tb_budget=sms if fuse else None,
                              **program_options)
            if fit.fits:
                return fit
            if planned is not None:
                lowered[id(fit)] = [key for key in planned.programs if key not in before]
                if "tb-connection" not in {f.kind for f in fit.broken}:    # (the search reads that one's program)
                    planned.misses[memo] = replace(fit, program=None)
        if best is None or _closer(fit, best):
            best, missed = fit, best
        else:
            missed = fit
        if missed is not None and planned is not None:   # only the closest miss is kept: memory grows per trial
            planned.forget(lowered.pop(id(missed), ()))
        kinds = {f.kind for f in fit.broken}
        crowding = _most_on_a_channel(fit.program) / MAX_TBS_PER_CHANNEL_DIRECTION if "tb-connection" in kinds else 0
        # too many tbs or channels: more channels cannot help; too many peers on one channel: they can
        if kinds - {"steps-per-tb"} - ({"tb-connection"} if crowding > 1 else set()):
            if channels == 1 or max_cnt >= most_cnt:
                break
            channels = max(1, channels - max(1, channels // 4))
            max_cnt = min(most_cnt, max_cnt + max(1, max_cnt // 2))
            continue
        over = max(fit.steps_per_tb / limit, crowding)
        most = _most_channels(fit, channels, sms)
        wanted = max(channels + 1, ceil(channels * over))
        if wanted <= most:
            channels = wanted
        elif channels < most and ceil(channels * over) > most and kinds == {"steps-per-tb"}:
            # the steps shrink about as 1/channels (at 1024 GPUs 182 steps on 2 channels, 71 on 5, 62 on 6), so
            # ``most`` would miss too; and it is a low estimate (threadblocks grow less than linearly: 49 on 2
            # channels, 110 on 6): try what the steps want, and the SM rule of the next lowering says if it fits
            channels = min(wanted, MAX_CHANNELS)
        elif channels < most:
            channels = most          # every channel the SMs allow before any merging (merging costs pipelining)
        elif max_cnt < most_cnt:
            previous = channels
            channels = most
            max_cnt = min(most_cnt, max(max_cnt + 1, ceil(max_cnt * over * previous / most)))
        else:
            break
    assert best is not None
    return best


def has_multi_chunk_messages(schedule: Schedule) -> bool:
    """Whether some step moves several chunks over one connection (a message that merging can send whole)."""
    seen = set()
    for t in schedule.transfers:
        key = (t.src, t.dst, t.step)
        if key in seen:
            return True
        seen.add(key)
    return False


def whole_message_fit(schedule: Schedule, topology: Topology, target: str, fuse: bool, **program_options
                      ) -> Fit | None:
    """The schedule on one channel with each step's chunks between two peers sent as one message (dependencies per
    message, merged up to the runtime's largest ``cnt``), when it fits; None when it does not, when no step moves
    several chunks over a connection, or for schedules of more than :data:`WIDEN_MAX_STEPS` transfers (another
    whole lowering and simulation, where clusters' writes already take minutes).

    At small sizes a message costs its alpha: a whole-buffer message sent as one step per chunk pays it once per
    two chunks (the runtime keeps two messages in flight per connection), while the fit search's smallest
    ``max_cnt`` keeps the pipelining that large sizes want.
    """
    if len(schedule.transfers) > WIDEN_MAX_STEPS or not has_multi_chunk_messages(schedule):
        return None
    lowering = Lowering(fuse, 1, MAX_CNT, per_message=True)
    fit = lowered_fit(schedule, topology, target, lowering, **program_options)
    return fit if fit.fits else None


def wider_fits(schedule: Schedule, topology: Topology, target: str, fit: Fit, **program_options) -> list[Fit]:
    """``fit`` and, where the SMs and channels allow, the same lowering on 2, 4 and 8 times its channels: messages of
    one connection from several threadblocks often keep a link busier, so the simulator should choose. Skipped
    for programs of more than :data:`WIDEN_MAX_STEPS` steps (each variant is another lowering)."""
    return [fit, *iter_wider_fits(schedule, topology, target, fit, **program_options)]


def iter_wider_fits(schedule: Schedule, topology: Topology, target: str, fit: Fit, **program_options
                    ) -> Iterator[Fit]:
    """The wider spreads of :func:`wider_fits` (without ``fit`` itself), lowered only when asked for."""
    for channels in wider_channels(topology, fit):
        lowering = replace(fit.lowering, channels=channels)
        wider = lowered_fit(schedule, topology, target, lowering, **program_options)
        if wider.fits:
            yield wider


def measured_wider_fits(schedule: Schedule, topology: Topology, target: str, fit: Fit, **program_options
                        ) -> Iterator[Fit]:
    """``fit``'s lowering on 2, 4, 8, ... times its channels (cut evenly, without merged steps), each lowered and
    measured, until the GPU's SMs do not hold the threadblocks (the lowering stops as soon as they are counted) or
    the channels run out; whatever the program's size.

    :func:`wider_channels` guesses from the threadblocks growing linearly with the channels, and they grow less:
    16 x dgx-h100's PXN Alltoall takes 45 threadblocks on one channel, 59 on 2 and 117 on 4, where a connection's
    16 messages are finally in flight past the runtime's two-message FIFO (1 MB: 104.9 us on one channel, 22.2 on
    four, as planned). The writer asks for these only where the file is far behind its plan."""
    channels = fit.lowering.channels * 2
    while channels <= MAX_CHANNELS:
        lowering = replace(fit.lowering, channels=channels, balanced=fit.lowering.balanced or fit.lowering.max_cnt == 1)
        wider = lowered_fit(schedule, topology, target, lowering, tb_budget=topology.sms_per_gpu, **program_options)
        if wider.program is None:     # stopped for its threadblocks: more channels only add some
            return
        if wider.fits:
            yield wider
        channels *= 2


def in_flight_channels(schedule: Schedule, topology: Topology, fit: Fit, fifo_depth: int) -> int | None:
    """Channels on which every message of the busiest connection can be in flight at once (the runtime holds
    ``fifo_depth`` per connection and channel, at most :data:`MAX_CHANNELS`), when :func:`wider_channels` does not
    offer as many already; None otherwise. (Only connections with many messages take more channels, so the SMs'
    linear estimate of :func:`wider_channels` is not applied: measuring the lowering says whether it fits.)

    Where alphas dominate, a connection of more messages than its channels hold in flight pays its alpha once per
    ``fifo_depth`` messages: TE-CCL's two NDv2 nodes relay an Alltoall's 64 blocks of a node over one link (1.3 us),
    7.4 us on 8 channels and 4.8 us on 32."""
    wanted = all_in_flight_channels(schedule, fifo_depth)
    offered = wider_channels(topology, fit)
    return None if wanted <= max((fit.lowering.channels, *offered)) else wanted


def all_in_flight_channels(schedule: Schedule, fifo_depth: int) -> int:
    """The channels that hold every message of the busiest connection in flight at once (``fifo_depth`` per
    connection and channel), at most :data:`MAX_CHANNELS`."""
    return min(MAX_CHANNELS, ceil(_longest_connection(schedule) / fifo_depth))


def wider_channels(topology: Topology, fit: Fit) -> tuple[int, ...]:
    """The channel counts of ``fit``'s wider spreads (:func:`wider_fits`), known before any is lowered."""
    total = fit.program.num_steps
    if total > WIDEN_MAX_STEPS:
        return ()
    most = _most_channels(fit, fit.lowering.channels, topology.sms_per_gpu)
    return tuple(c for c in (fit.lowering.channels * factor for factor in (2, 4, 8)) if c <= most)


# Collectives whose plain lowerings fused_flow_fits fuses: one-root trees, whose relays receive a chunk from one peer
# (or sum it from several) and pass it on.
FUSED_FLOW_COLLECTIVES = ("broadcast", "reduce")


def fused_flow_fits(schedule: Schedule, topology: Topology, target: str, **program_options) -> Iterator[Fit]:
    """A Broadcast's or Reduce's plain lowering that holds more XML elements on some GPU than the runtimes' reader,
    with the chosen flows of each such GPU fused on channels of their own and its local copies merged
    (:mod:`backends.msccl.fuse_flows`): each choice that fits, likeliest to run as planned first. On the fewest
    channels that keep every connection within the target's steps per threadblock, cut evenly, each connection's
    messages leaving in the plan's order across them (in link order: without it, dgx1 Reduce in 2048 chunks ran
    0.6% behind its plan plain, and 25% and more with fused flows, whose sends went ahead of partial sums planned
    before them).

    dgx1 Broadcast and Reduce 1 GB in 2048 chunks: 4,171-4,175 elements on GPUs 5-7 plain; fusing 82-84 chunks of
    one flow each takes them to 4,093 and runs as planned (7217.7 us, 99.2% of the limit; 1024 chunks: 98.6%)."""
    if schedule.collective.name not in FUSED_FLOW_COLLECTIVES:
        return
    limit = max_steps(target)
    channels = max(1, min(MAX_CHANNELS, ceil(_longest_connection(schedule) / limit)))
    lowering = Lowering(False, channels, balanced=channels > 1, in_link_order=True)
    base = lowered_fit(schedule, topology, target, lowering, **program_options)
    if base.program is None or base.fits:
        return
    program = merge_local_copies(base.program, MAX_CNT)
    planned = program_options.get("planned")
    slot = (planned.layout if planned is not None else buffer_layout(schedule)).slot
    for flows in flow_choices(schedule, program, limit):
        try:
            fused = fuse_flows(program, flows, limit, slot)
        except BackendError:
            continue
        fit = measure(fused, replace(lowering, fused_flows=True), target, topology.sms_per_gpu)
        if fit.fits:
            yield fit


def unmerged_too_long(schedule: Schedule, target: str) -> bool:
    """Whether the connection with the most messages needs more channels of the target's steps per threadblock
    than the runtime has: then only merged steps can fit, and :func:`fit_lowering` without merging
    (``most_cnt=1``) would lower the schedule just to say so."""
    return ceil(_longest_connection(schedule) / max_steps(target)) > MAX_CHANNELS


def connection_elements(per_connection: Counter, num_ranks: int, forwards: Counter | None = None,
                        steps_per_tb: int = MAX_STEPS_EXECUTOR) -> int:
    """The XML elements the busiest rank's load counts at least (:func:`~backends.msccl.limits.xml_elements`), from
    the messages per connection ``(src, dst)``: plain, a step per message end and a threadblock per send or receive
    peer; with ``forwards`` (per rank, the chunks it receives and passes on down chains whose fused steps share
    their channels, :func:`synth.synthesis.trees.rank_elements`), the fewer of that and the fused count, a step
    fewer per forward and a threadblock per ``steps_per_tb`` steps.

    >>> connection_elements(Counter({(0, 1): 2048, (1, 2): 2048}), 3)       # rank 1: 4096 steps, 2 peers
    4101
    >>> connection_elements(Counter({(0, 1): 2048, (1, 2): 2048}), 3, Counter({1: 2048}))   # 32 tbs of rcs
    2084
    """
    ends, send_peers, receive_peers = Counter(), Counter(), Counter()
    for (src, dst), messages in per_connection.items():
        ends[src] += messages
        ends[dst] += messages
        send_peers[src] += 1
        receive_peers[dst] += 1

    def elements(r: int) -> int:
        peers = max(send_peers[r], receive_peers[r])
        plain = xml_elements(num_ranks, peers, ends[r])
        if forwards is None:
            return plain
        steps = ends[r] - forwards[r]
        return min(plain, xml_elements(num_ranks, max(peers, ceil(steps / steps_per_tb)), steps))

    return max(elements(r) for r in range(num_ranks))


def plain_too_long(schedule: Schedule) -> bool:
    """Whether the plain lowering without merged steps holds more XML elements on some rank than the runtimes'
    reader (:func:`connection_elements`): then plain sends and receives fit only merged (2 x dgx2 Reduce 1 GB as
    chains of 2048 chunks: its fused lowering fits, and the fit search for plain merged steps took 85 s to find
    nothing faster)."""
    per_connection = Counter((t.src, t.dst) for t in schedule.transfers)
    return connection_elements(per_connection, schedule.collective.num_ranks) > MAX_XML_ELEMENTS


def _longest_connection(schedule: Schedule) -> int:
    """The most messages on one connection (src, dst) of the schedule."""
    return max(Counter((t.src, t.dst) for t in schedule.transfers).values(), default=0)


def _most_channels(fit: Fit, channels: int, sms: int | None) -> int:
    """Channels the threadblock count allows, from the count at ``channels`` (threadblocks grow about linearly)."""
    most = MAX_CHANNELS
    per_channel = fit.tbs_per_gpu / channels
    if sms is not None:
        most = min(most, max(1, int(sms / per_channel)))
    return max(1, min(most, MAX_TBS_PER_CHANNEL_DIRECTION * MAX_CHANNELS))


def _most_on_a_channel(program: MscclProgram) -> int:
    """The most threadblocks of one GPU that send (or receive) on one channel; the runtime allows
    :data:`~backends.msccl.limits.MAX_TBS_PER_CHANNEL_DIRECTION`."""
    counts = Counter((gpu.id, tb.chan, direction) for gpu in program.gpus for tb in gpu.tbs
                     for direction, peer in (("send", tb.send), ("recv", tb.recv)) if peer >= 0)
    return max(counts.values(), default=0)


def _closer(a: Fit, b: Fit) -> bool:
    """Whether ``a`` misses the limits by less than ``b`` (fewer broken rules, then fewer steps)."""
    return (len({f.kind for f in a.broken}), a.steps_per_tb) < (len({f.kind for f in b.broken}), b.steps_per_tb)


def hopeless(schedule: Schedule, topology: Topology, target: str = "executor", ranks: Iterable[int] | None = None,
             layout: BufferLayout | None = None) -> str | None:
    """Why no lowering of ``schedule`` can load on ``target`` with the GPUs' SMs, from the schedule alone (linear,
    no lowering); None when one may.

    A rank needs a threadblock per peer it receives from and one per peer it sends to (a fused one can do one of
    each); merging and spreading only add threadblocks, so more peers in one direction than SMs never fit. Nor
    does a rank whose fewest steps already overflow the runtimes' XML reader or its SMs' threadblocks
    (:func:`~backends.msccl.step_floor.element_floor_reason`). ``ranks``: only these (default: all). ``layout``:
    the schedule's :func:`~synth.schedule.ir.buffer_layout` when the caller has it already.
    """
    return element_floor_reason(schedule, target, topology.sms_per_gpu, ranks, layout)


def plan_fit(schedule: Schedule, topology: Topology, target: str = "executor", **program_options) -> FitPlan:
    """Fit both lowerings (fused chains first, then plain sends and receives); see :func:`fit_lowering`.

    Raises :class:`~synth.errors.BackendError` at once when the schedule is :func:`hopeless`.
    """
    reason = hopeless(schedule, topology, target)
    if reason is not None:
        raise BackendError(f"no MSCCL lowering fits: {reason}")
    fits, misses = [], []
    program_options.setdefault("planned", PlannedOps(schedule))
    for fuse in (True, False):
        fit = fit_lowering(schedule, topology, target, fuse, **program_options)
        (fits if fit.fits else misses).append(fit)
    return FitPlan(target, tuple(fits), tuple(misses))
