"""A discrete-event simulation of a pdserve cluster (pure: seeded, no clock, no I/O).

Requests arrive at a router replica, which admits them by pdserve's own
``AdmissionController`` when a ``RouterTier`` is given (waiting for budget, or refused),
take the path pdserve's own policy gives them
(``router.disaggregation.choose_path``), are placed by the router's own rankings
(``rank_prefill``, ``rank_decode``) on load snapshots that are ``report_interval_s`` old
at most, as the replicas' reports are (each router replica with its own sends since and
its own ``OtherRouters``, from which it draws its first choice, unless
``shared_router_view``), and run on engines that schedule like vLLM v1:

- a step computes at most ``max_num_batched_tokens`` tokens: one for every running
  sequence first, then prompt chunks in arrival order (chunked prefill);
- at most ``max_num_seqs`` sequences run; a sequence is admitted when the KV of its prompt
  fits beside the running ones, and its answer's KV grows a token a step. On a decode
  engine, when the next step's tokens do not fit, the sequence admitted last is
  preempted: its KV freed (its prompt's blocks kept in the prefix cache) and it waits at
  the head of the queue to compute its prompt and its answer so far again (vLLM v1's
  recompute preemption);
- a step's time comes from the step cost model (tools/planner/cost_model.py);
- an engine keeps the KV blocks of finished sequences in its prefix cache (vLLM's: kept
  until their room is needed, least recently used out first), and a sequence it admits
  computes only the part of its prompt after the longest cached head.

A disaggregated request is prefilled on a prefill replica, its KV moves to a decode
replica (``Transfer``; only the blocks that replica's cache lacks), and its first token
comes from that replica's first step with it. A decode-local one is prefilled by its
decode engine, inside its steps. TTFT is the end of the step that made the first token;
each later token's gap is its step's time. A speculating decode engine (``speculation``,
tools/planner/speculation.py) also verifies each sequence's drafts in the step, at
their compute and KV cost; the drafts it accepts leave with the step's token, gaps of 0,
as a client sees a chunk of several tokens.

Prompts are not token lists here but chains of KV-block ids (``block_chain``): two
requests share a block exactly when they share the whole prefix up to it (a system
prompt of their group, the earlier turns of their conversation), as the router's block
hashes do. The router's beliefs about the caches are its own classes (``PrefixIndex``,
``DecodeCacheBelief``) fed those chains, so affinity and the cache-aware next turn
(router/disaggregation.py) are pdserve's policies too. A later turn of a conversation
arrives its think time after the turn before it finished (closed loop).

Each router replica of a ``RouterTier`` routes on what it alone knows, as pdserve's do:
the replicas' reports are the same for all of them, but the sends since those reports
(its ``PendingTally``), where it sent each prefix and what it believes each decode cache
holds are its own. Routers that cannot see each other's sends rank alike between two
reports, and can herd onto the same replica; a conversation's next turn may reach a
router that never saw its history.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig
from router.admission import AdmissionController, AdmissionPolicy
from router.disaggregation import PathChoice, choose_path_with_cache
from router.replica_choice import (
    DecodeCacheBelief,
    DecodePolicy,
    OtherRouters,
    PendingTally,
    PrefillPolicy,
    PrefixIndex,
    ReplicaLoad,
    rank_decode,
    rank_prefill,
)
from tools.bench.engine_work import PROMPT_SOURCES
from tools.planner.model import prefill_pairs
from tools.planner.speculation import Speculation

StepTime = Callable[[int, float, int], float]   # (new tokens, token pairs, context) -> s


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0      # of the prompt, in the prefix cache of whichever engine
    #                             prefills it (a hit rate assumed, not simulated)
    # Whom it shares KV blocks with (``block_chain``): its first ``group_tokens`` tokens
    # with the other requests of ``group`` (a system prompt), the rest with the other
    # turns of ``conversation``; -1: nobody.
    group: int = -1
    group_tokens: int = 0
    conversation: int = -1
    # Where the conversation's tokens changed ((first token, version) pairs, ascending):
    # a later turn repeats the turns before it token for token only up to the point where
    # its history stops matching (a re-tokenized answer), and its own tokens from there.
    # Empty: one version of the conversation (every turn repeats the others exactly).
    versions: tuple[tuple[int, int], ...] = ()
    # A later turn: it arrives ``think_s`` after request ``follows`` (an index into the
    # same list) finished; its ``arrival_s`` is not used.
    follows: int | None = None
    think_s: float = 0.0

    def next_versions(self, repeated_tokens: int) -> tuple[tuple[int, int], ...]:
        """The versions of the turn that follows this one and repeats its first
        ``repeated_tokens`` tokens (of its prompt and answer) exactly."""
        own = self.versions or ((0, 0),)
        kept = tuple(v for v in own if v[0] < repeated_tokens)
        return (*kept, (repeated_tokens, own[-1][1] + 1))


# How much of an answer the next turn repeats token for token: one share for every answer,
# or measured shares (tools/experiments/answer_reuse.py) of which each later turn draws one.
AnswerReuse = float | tuple[float, ...]


def check_answer_reuse(reuse: AnswerReuse) -> None:
    shares = reuse if isinstance(reuse, tuple) else (reuse,)
    if not shares or not all(0 <= share <= 1 for share in shares):
        raise ValueError(f"answer_reuse is a share in [0, 1] or some, not {reuse}")


def repeated_tokens(earlier: SimRequest, reuse: AnswerReuse, rng: random.Random) -> int:
    """The tokens of ``earlier``'s prompt and answer that the turn after it repeats
    exactly: its prompt and a share of its answer."""
    share = rng.choice(reuse) if isinstance(reuse, tuple) else reuse
    return earlier.prompt_tokens + int(earlier.output_tokens * share)


def block_chain(request: SimRequest, tokens: int, block_size: int) -> tuple[int, ...]:
    """Ids of the full KV blocks of the first ``tokens`` tokens of ``request``'s sequence
    (its prompt, then its answer). Each id names the whole prefix up to its block, as the
    router's block hashes do: a block of the group's head has the group's id at that
    place (``group * 2**24 + place``, not negative), a later one the conversation's
    version's (negative). A block holding a token of a later version is that version's.
    Empty for a request that shares nothing."""
    shared = request.group_tokens // block_size if request.group >= 0 else 0
    blocks = tokens // block_size
    if request.conversation < 0:
        blocks = min(blocks, shared)
    head = min(shared, blocks)
    group_base = request.group * _PLACES
    chain = tuple(range(group_base, group_base + head))
    versions = request.versions or ((0, 0),)
    for index, (start, version) in enumerate(versions):
        first = max(head, start // block_size)
        end = versions[index + 1][0] // block_size if index + 1 < len(versions) else blocks
        base = -1 - (request.conversation * _VERSIONS + version) * _PLACES
        chain += tuple(range(base - first, base - min(end, blocks), -1))
    return chain


_PLACES = 2**24      # blocks a sequence may have: 2**28 tokens in blocks of 16
_VERSIONS = 2**10    # turns a conversation may have


@dataclass(frozen=True)
class EngineLimits:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 10**9
    # Serve's max_ongoing_requests of the pool: a replica holding this many requests
    # turns the next away and the router tries its next choice (None: no limit)
    max_ongoing: int | None = None


@dataclass(frozen=True)
class RouterTier:
    """The router replicas in front of the engines. Each admits by pdserve's own
    ``AdmissionController`` (``admission`` is one replica's policy), and Serve's proxy
    sends a request to the one of two replicas drawn at random with fewer requests in it
    (its power-of-two-choices router). A request costs its prompt plus ``max_tokens``
    (None: its answer's length, a client that asks for what it gets)."""

    replicas: int
    admission: AdmissionPolicy
    max_tokens: int | None = None
    long_prompt_tokens: int | None = None      # the long lane's threshold (None: none)


@dataclass(frozen=True)
class ClusterSpec:
    prefill_replicas: int
    decode_replicas: int
    prefill_step: StepTime
    decode_step: StepTime
    transfer_s: Callable[[int], float]          # prompt tokens -> seconds
    prefill_limits: EngineLimits = EngineLimits()
    decode_limits: EngineLimits = EngineLimits()
    threshold_tokens: int = 0                   # router.disaggregation_threshold_tokens
    report_interval_s: float = 1.0              # replicas' load reports (0: always fresh)
    block_size: int = 16                        # engine.block_size
    # router.routing.{prefill,decode} (None: the config's defaults)
    prefill_routing: PrefillRoutingConfig | None = None
    decode_routing: DecodeRoutingConfig | None = None
    routers: RouterTier | None = None           # None: every request admitted at once
    # True: every router replica routes on one view (its tally, prefix index and cache
    # belief shared), as if each saw the others' sends: no herding, an optimistic bound
    shared_router_view: bool = False
    # the decode pool's speculative decoding (decode.speculative; None: off)
    speculation: Speculation | None = None


@dataclass
class Outcome:
    """One request's times (seconds after its arrival), or why it did not finish: its
    path is "refused" when admission turned it away (429 or, after waiting, 503)."""

    path: str
    ttft_s: float | None = None
    e2e_s: float | None = None
    prefill_done_s: float | None = None
    ready_s: float | None = None        # its prompt's KV reached (or its prompt reached)
    #                                     the decode pool
    decode_s: float | None = None       # admitted to a decode engine until finished
    decode_replica: str | None = None   # the decode engine that answered it


@dataclass
class SimResult:
    requests: list[SimRequest]
    outcomes: list[Outcome]
    # (step end, step seconds, sequences that got a token in it): the inter-token gaps
    token_gaps: list[tuple[float, float, int]]
    busy_s: dict[str, float]                    # pool -> engine-seconds busy until the
    #                                             last first-turn arrival
    last_arrival_s: float
    decode_concurrency_integral: float          # ∫ sequences in decode engines dt
    horizon_s: float
    arrivals: list[float] = field(default_factory=list)   # each request's, as it came
    # Prompt tokens per pool: computed by its engines, found in their prefix caches, and
    # (decode) pulled from the prefill pool; the engines' counters of `pdserve bench`
    # (tools/bench/engine_work.py)
    prompt_tokens: dict[str, dict[str, int]] = field(default_factory=dict)
    # What the replicas report, as each pool's mean over its replicas, at every refresh
    # of the router's snapshot (at most one a report interval, at routing instants):
    # (time, pool, queued prompt tokens, running sequences, KV-cache use 0..1)
    reports: list[tuple[float, str, float, float, float]] = field(default_factory=list)
    preemptions: int = 0                        # by the decode engines (recompute)

    def finished(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.e2e_s is not None]


# ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class _RouterView:
    """What one router replica knows beyond the replicas' reports: its own sends since
    them, where it sent each prefix, and what it believes the decode caches hold."""

    tally: PendingTally
    prefix_index: PrefixIndex
    belief: DecodeCacheBelief
    # what the other routers send each pool, from the reports (one router: nothing)
    others: dict = field(default_factory=lambda: {"prefill": OtherRouters(),
                                                  "decode": OtherRouters()})


@dataclass(eq=False)     # one sequence is itself only (and list.remove compares cheaply)
class _Seq:
    index: int
    prompt: int
    output: int
    computed: int = 0          # prompt tokens whose KV exists here
    generated: int = 0
    admitted_s: float = 0.0
    chain: tuple[int, ...] = ()  # its prompt's full blocks (block_chain)
    resumed: int = 0           # tokens it had generated when last preempted (recomputed)
    last_token_s: float = 0.0
    router: int = 0            # the router replica that routes it (its _RouterView)
    drafts: int = 0            # tokens its step in flight verifies beside its own
    # Tokens whose KV it computes before it decodes: its prompt, and after a preemption
    # its answer so far too (a field, not a property: read for every sequence every step)
    target: int = field(init=False)

    def __post_init__(self) -> None:
        self.target = self.prompt + self.resumed

    def preempted(self) -> None:
        """Its KV is gone: it computes its prompt and its answer so far again."""
        self.resumed, self.computed = self.generated, 0
        self.target = self.prompt + self.resumed

    @property
    def held(self) -> int:
        """KV tokens it holds once admitted (its answer's grow a token a step)."""
        return self.prompt + self.generated


class _PrefixCache:
    """An engine's prefix cache: the ids of blocks it holds, least recently used first.
    The blocks of running sequences are not counted in it; ``trim`` keeps it within the
    room they leave."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def hit(self, chain: tuple[int, ...]) -> int:
        """How many leading blocks of ``chain`` it holds (those are used again: fresh)."""
        held = 0
        for block in chain:
            if block not in self.blocks:
                break
            self.blocks.move_to_end(block)
            held += 1
        return held

    def keep(self, chain: tuple[int, ...]) -> None:
        for block in chain:
            self.blocks[block] = None
            self.blocks.move_to_end(block)

    def trim(self, room_blocks: int) -> None:
        while len(self.blocks) > max(0, room_blocks):
            self.blocks.popitem(last=False)


@dataclass
class _Engine:
    name: str
    limits: EngineLimits
    step_time: StepTime
    busy: bool = False
    waiting: deque = field(default_factory=deque)   # _Seq not yet admitted
    running: list = field(default_factory=list)      # _Seq admitted (prefilling or decoding)
    reserved: int = 0                                 # KV tokens held by running
    preemptions: int = 0
    busy_s: float = 0.0
    ongoing: int = 0                                  # requests its replica holds (Serve's)
    served: int = 0                                   # requests its replica is done with
    cache: _PrefixCache = field(default_factory=_PrefixCache)
    block_size: int = 16
    speculation: Speculation | None = None    # a speculating decode engine's
    draft_rng: random.Random | None = None     # whether each step drafts
    # prompt tokens taken in, by where their KV came from (engine_work's sources)
    prompt_tokens: dict = field(default_factory=lambda: dict.fromkeys(PROMPT_SOURCES, 0))

    def has_room(self) -> bool:
        """Whether its replica takes one more request (Serve's max_ongoing_requests)."""
        return self.limits.max_ongoing is None or self.ongoing < self.limits.max_ongoing

    def queued_prompt_tokens(self) -> int:
        return (sum(s.target - s.computed for s in self.waiting)
                + sum(s.target - s.computed for s in self.running if s.computed < s.target))

    def admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            need = self.waiting[0].held
            if self.running and self.reserved + need > self.limits.kv_capacity_tokens:
                return
            seq = self.waiting.popleft()
            seq.admitted_s = now
            self.reserved += need
            self.running.append(seq)
            self._look_up(seq)
        self.cache.trim(self.limits.kv_capacity_tokens // self.block_size
                        - -(-self.reserved // self.block_size))

    def _look_up(self, seq: _Seq) -> None:
        """A sequence that still has its prompt to compute starts after its cached head
        (the engine computes at least the last prompt token). A preempted one's second
        admission is not counted again."""
        if seq.computed >= seq.target:
            return
        held = min(self.cache.hit(seq.chain) * self.block_size, seq.prompt - 1)
        seq.computed = max(seq.computed, held)
        if not seq.resumed:
            self.prompt_tokens["cached"] += seq.computed
            self.prompt_tokens["computed"] += seq.prompt - seq.computed

    def make_room(self) -> None:
        """Preempt the latest admitted sequences until the next step's new KV fits (one
        token for each decoding sequence); one sequence alone is never preempted."""
        capacity = self.limits.kv_capacity_tokens
        per_seq = 1 + (self.speculation.draft_tokens if self.speculation else 0)   # slots
        if self.reserved + per_seq * len(self.running) <= capacity:   # the common case
            return
        while len(self.running) > 1 and self.reserved + sum(
                per_seq for s in self.running if s.computed >= s.target) > capacity:
            victim = self.running.pop()
            self.reserved -= victim.held
            self.cache.keep(victim.chain)
            victim.preempted()
            self.waiting.appendleft(victim)
            self.preemptions += 1

    def plan_step(self, decoding: bool) -> tuple[list, list, int, float, int]:
        """(sequences decoding, (seq, chunk) prefilling, new tokens, pairs, context). A
        decoding sequence computes its next token and, speculating, the drafts proposed
        after its last one (none before its first)."""
        budget = self.limits.max_num_batched_tokens
        decoders = [s for s in self.running if s.computed >= s.target] if decoding else []
        context = sum(s.prompt + s.generated for s in decoders)
        drafts, draft_pairs = self._draft(decoders) if self.speculation else (0, 0)
        budget -= len(decoders) + drafts
        chunks = []
        pairs = float(context + draft_pairs)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.computed < seq.target:
                chunk = min(budget, seq.target - seq.computed)
                chunks.append((seq, chunk))
                pairs += prefill_pairs(chunk, seq.computed)
                context += seq.computed
                budget -= chunk
        new = len(decoders) + drafts + sum(chunk for _, chunk in chunks)
        return decoders, chunks, new, pairs, context

    def _draft(self, decoders: list) -> tuple[int, int]:
        """Which decoding sequences verify drafts in the next step (none before its first
        token: drafts are proposed after a token), and (the drafts, their attention
        pairs: each draft attends over its sequence's context, as its token does)."""
        drafts = pairs = 0
        for seq in decoders:
            seq.drafts = self.speculation.drafts(self.draft_rng) if seq.generated else 0
            drafts += seq.drafts
            pairs += seq.drafts * (seq.prompt + seq.generated)
        return drafts, pairs


class Simulation:
    """One run of ``requests`` on the cluster ``spec``; ``rng`` breaks ranking ties."""

    def __init__(self, spec: ClusterSpec, requests: Sequence[SimRequest],
                 rng: random.Random | None = None):
        self.spec = spec
        self.requests = list(requests)
        self.rng = rng or random.Random(0)
        self.now = 0.0
        self._events: list = []
        self._order = itertools.count()
        self.prefill = [_Engine(f"p{i}", spec.prefill_limits, spec.prefill_step,
                                block_size=spec.block_size)
                        for i in range(spec.prefill_replicas)]
        self._draft_rng = random.Random(len(self.requests) + 1)   # speculation's draws
        self.decode = [_Engine(f"d{i}", spec.decode_limits, spec.decode_step,
                               block_size=spec.block_size, speculation=spec.speculation,
                               draft_rng=self._draft_rng)
                       for i in range(spec.decode_replicas)]
        self.arrivals = [r.arrival_s for r in self.requests]
        self._followers: dict[int, list[int]] = {}
        for index, request in enumerate(self.requests):
            if request.follows is not None:
                self._followers.setdefault(request.follows, []).append(index)
        self.outcomes = [Outcome("") for _ in self.requests]
        self.gaps: list[tuple[float, float, int]] = []
        self._decode_seqs = 0
        self._concurrency = 0.0
        self._last_change = 0.0
        self._snapshot: dict[str, ReplicaLoad] = {}
        self._snapshot_at = float("-inf")
        self._served: dict[str, int] = {}
        self.reports: list[tuple[float, str, float, float, float]] = []
        self._last_arrival = max((r.arrival_s for r in self.requests
                                  if r.follows is None), default=0.0)
        # The router's policies as configured; a load report is never too old to trust
        # here (no replica dies)
        prefill_routing = spec.prefill_routing or PrefillRoutingConfig()
        decode_routing = spec.decode_routing or DecodeRoutingConfig()
        self._prefill_policy = replace(PrefillPolicy.from_config(
            prefill_routing, spec.block_size), stale_after_s=float("inf"))
        self._decode_policy = replace(DecodePolicy.from_config(
            decode_routing, spec.decode_limits.max_num_seqs, spec.block_size),
            stale_after_s=float("inf"))
        self._cache_aware = decode_routing.cache_aware_path
        tier = spec.routers
        self._views = [_RouterView(
            PendingTally(), PrefixIndex(self._prefill_policy.index_capacity),
            DecodeCacheBelief(spec.block_size, self._decode_policy.max_blocks,
                              self._decode_policy.index_capacity))
            for _ in range(tier.replicas if tier and not spec.shared_router_view else 1)]
        self._admission = [AdmissionController(tier.admission)
                           for _ in range(tier.replicas)] if tier else []
        self._in_router = [0] * len(self._admission)     # requests each holds (any state)
        self._router_of: dict[int, int] = {}
        self._router_rng = random.Random(len(self.requests))  # not ``rng``: the rankings'
        #                                                       draws stay as without

    # -- the event loop ----------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def run(self) -> SimResult:
        for index, request in enumerate(self.requests):
            if request.follows is None:
                self._at(request.arrival_s, lambda i=index: self._arrive(i))
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()
        self._count_decode(0)
        return SimResult(self.requests, self.outcomes, self.gaps,
                         {"prefill": sum(e.busy_s for e in self.prefill),
                          "decode": sum(e.busy_s for e in self.decode)},
                         self._last_arrival,
                         self._concurrency, self.now, self.arrivals,
                         {"prefill": _summed(self.prefill), "decode": _summed(self.decode)},
                         self.reports, sum(e.preemptions for e in self.decode))

    # -- routing: pdserve's policies on load snapshots ---------------------------------

    def _loads(self, engines: list[_Engine], view: _RouterView) -> list[ReplicaLoad]:
        """The replicas' last reports (refreshed once a report interval), plus what this
        router sent since them."""
        interval = self.spec.report_interval_s
        if interval <= 0 or self.now - self._snapshot_at >= interval:
            self._snapshot_at = self.now
            self._snapshot = {e.name: ReplicaLoad(
                e.name, queued_prefill_tokens=e.queued_prompt_tokens(),
                running_seqs=len(e.running), waiting_seqs=len(e.waiting),
                kv_usage=e.reserved / e.limits.kv_capacity_tokens,
                max_num_seqs=e.limits.max_num_seqs) for e in self.prefill + self.decode}
            self._served = {e.name: e.served for e in self.prefill + self.decode}
            self._record_reports()
        others = view.others["prefill" if engines is self.prefill else "decode"]
        for engine in engines:      # as the router does on reading a report
            view.tally.observe_report(engine.name, self._snapshot_at)
            others.observe(engine.name, self._served[engine.name], self._snapshot_at)
        return [self._with_pending(self._snapshot[e.name], view.tally) for e in engines]

    def _record_reports(self) -> None:
        for pool, engines in (("prefill", self.prefill), ("decode", self.decode)):
            if engines:
                loads = [self._snapshot[e.name] for e in engines]
                self.reports.append((self.now, pool, *(
                    sum(getattr(load, name) for load in loads) / len(loads)
                    for name in ("queued_prefill_tokens", "running_seqs", "kv_usage"))))

    @staticmethod
    def _with_pending(load: ReplicaLoad, tally: PendingTally) -> ReplicaLoad:
        """The report plus what was sent since, less what it counted that completed since,
        as the router's ReplicaLoad has it (built, not ``dataclasses.replace``d: this runs
        for every replica at every routing)."""
        return ReplicaLoad(load.replica_id, load.queued_prefill_tokens, load.running_seqs,
                           load.waiting_seqs, load.kv_usage, load.max_num_seqs,
                           pending_tokens=tally.tokens(load.replica_id),
                           pending_requests=tally.requests(load.replica_id),
                           finished_tokens=tally.finished_tokens(load.replica_id),
                           finished_requests=tally.finished_requests(load.replica_id))

    def _view_of(self, index: int) -> int:
        """The view its router routes it on (one for all when they share one)."""
        return 0 if len(self._views) == 1 else self._router_of.get(index, 0)

    def _completed(self, seq: _Seq, engine: _Engine, key: str, pool: str) -> None:
        """As Serve calls the router's ``on_request_completed``."""
        view = self._views[seq.router]
        view.tally.complete(key, engine.name, self.now)
        view.others[pool].completed(engine.name, self.now)

    def _sent(self, seq: _Seq, engine: _Engine, key: str, tokens: int) -> None:
        self._views[seq.router].tally.add(key, engine.name, tokens, self.now)

    def _pick_prefill(self, seq: _Seq) -> _Engine:
        """The prefill router: its ranking, then its record of where the prefix went."""
        view = self._views[seq.router]
        chain = seq.chain[:self._prefill_policy.max_blocks]
        loads = self._loads(self.prefill, view)
        ranking = rank_prefill(seq.prompt, view.prefix_index.match(chain), loads,
                               self._prefill_policy, self.rng,
                               view.others["prefill"].per_period()).ranking
        engine = _first_with_room(ranking, self.prefill)
        engine.ongoing += 1             # its replica holds it until its prompt is computed
        view.prefix_index.record(chain, engine.name)
        return engine

    def _pick_decode(self, seq: _Seq, pinned: str | None = None) -> _Engine:
        """The decode router: its ranking (prefix affinity, the pinned holder), then its
        belief that the replica holds the prompt."""
        view = self._views[seq.router]
        matched = {}
        if self._decode_policy.affinity_slots > 0:
            matched = view.belief.match_chain(seq.chain)
        loads = self._loads(self.decode, view)
        ranking = rank_decode(loads, self._decode_policy, self.rng, matched, seq.prompt,
                              pinned=pinned,
                              others=view.others["decode"].per_period())
        engine = _first_with_room(ranking, self.decode)
        engine.ongoing += 1             # its replica holds it from the pull to the answer
        if seq.chain:   # only a request with blocks to share is told back when it ends
            view.belief.routed_chain(f"decode-{seq.index}", seq.chain, engine.name)
        return engine

    # -- requests ------------------------------------------------------------------------

    def _arrive(self, index: int) -> None:
        self.arrivals[index] = self.now
        if self._admission:
            self._admit(index)
        else:
            self._route(index)

    def _admit(self, index: int) -> None:
        """A router replica (the less busy of two drawn) admits, queues or refuses it."""
        tier = self.spec.routers
        request = self.requests[index]
        first, second = (self._router_rng.randrange(len(self._admission)) for _ in range(2))
        router = first if self._in_router[first] <= self._in_router[second] else second
        self._router_of[index] = router
        self._in_router[router] += 1
        cost = request.prompt_tokens + (tier.max_tokens or request.output_tokens)
        long = (tier.long_prompt_tokens is not None
                and request.prompt_tokens >= tier.long_prompt_tokens)
        action = self._admission[router].request(index, cost, self.now, long=long).action
        if action == "admit":
            self._route(index)
        elif action == "queue":
            deadline = self._admission[router].next_deadline()
            self._at(deadline, lambda: self._expire(router))
        else:
            self._refuse(index)

    def _expire(self, router: int) -> None:
        expiry = self._admission[router].expire(self.now)
        for index in expiry.refused:
            self._refuse(index)
        for index in expiry.admitted:
            self._route(index)

    def _refuse(self, index: int) -> None:
        """Turned away (its conversation ends here: the turns after it never come)."""
        self._in_router[self._router_of.pop(index)] -= 1
        self.outcomes[index].path = "refused"

    def _released(self, index: int) -> None:
        """Its answer is done: its router frees its budget and admits who now fits."""
        if not self._admission:
            return
        router = self._router_of.pop(index)
        self._in_router[router] -= 1
        for admitted in self._admission[router].release(index):
            # routed as an event of its own: this runs inside an engine's step, which
            # must finish before anything reaches that engine
            self._at(self.now, lambda i=admitted: self._route(i))

    def _route(self, index: int) -> None:
        request = self.requests[index]
        cached = min(request.cached_tokens, request.prompt_tokens - 1)  # it computes the last
        seq = _Seq(index, request.prompt_tokens, request.output_tokens, computed=cached,
                   chain=block_chain(request, request.prompt_tokens, self.spec.block_size),
                   router=self._view_of(index))
        choice = self._path(seq)
        self.outcomes[index].path = choice.route
        if choice.route == "decode_local":
            self._to_decode(seq, self._pick_decode(seq, choice.decode_replica))
            return
        engine = self._pick_prefill(seq)
        self._sent(seq, engine, f"prefill-{index}", request.prompt_tokens - cached)
        engine.waiting.append(seq)
        self._kick(engine, decoding=False)

    def _path(self, seq: _Seq) -> PathChoice:
        """The router's path choice (router/engine_client.py ``route``)."""
        if not self.prefill:
            return PathChoice("decode_local")
        threshold = self.spec.threshold_tokens
        holder, held = None, 0
        if self._cache_aware and seq.chain and seq.prompt >= threshold > 0:
            holder, held = self._views[seq.router].belief.holder_of_chain(seq.chain,
                                                                          seq.prompt)
        return choose_path_with_cache(seq.prompt, threshold, holder, held)

    def _prefilled(self, engine: _Engine, seq: _Seq) -> None:
        """Its prefill replica is done with it; its decode replica is chosen, which pulls
        the blocks its cache lacks."""
        engine.ongoing -= 1
        engine.served += 1
        self._completed(seq, engine, f"prefill-{seq.index}", "prefill")
        outcome = self.outcomes[seq.index]
        outcome.prefill_done_s = self.now - self.arrivals[seq.index]
        moved = _Seq(seq.index, seq.prompt, seq.output, computed=seq.prompt, chain=seq.chain,
                     router=seq.router)
        engine = self._pick_decode(moved)
        held = engine.cache.hit(moved.chain) * self.spec.block_size
        engine.prompt_tokens["cached"] += held
        engine.prompt_tokens["transferred"] += seq.prompt - held
        self._at(self.now + self.spec.transfer_s(seq.prompt - held),
                 lambda: self._to_decode(moved, engine))

    def _to_decode(self, seq: _Seq, engine: _Engine) -> None:
        self.outcomes[seq.index].ready_s = self.now - self.arrivals[seq.index]
        self.outcomes[seq.index].decode_replica = engine.name
        self._sent(seq, engine, f"decode-{seq.index}", seq.prompt - seq.computed)
        engine.waiting.append(seq)
        self._kick(engine, decoding=True)

    # -- engines -------------------------------------------------------------------------

    def _kick(self, engine: _Engine, decoding: bool) -> None:
        if engine.busy:
            return
        before = len(engine.running)
        engine.admit(self.now)
        if decoding:
            engine.make_room()
            self._count_decode(len(engine.running) - before)
        decoders, chunks, new, pairs, context = engine.plan_step(decoding)
        if new == 0:
            return
        took = engine.step_time(new, pairs, context)
        engine.busy = True
        if self.now <= self._last_arrival:   # utilization while traffic arrives, not the drain
            engine.busy_s += took
        self._at(self.now + took,
                 lambda: self._stepped(engine, decoding, decoders, chunks, took))

    def _stepped(self, engine: _Engine, decoding: bool, decoders: list, chunks: list,
                 took: float) -> None:
        engine.busy = False
        verified = len(decoders)       # decoding before the step (the rest: prompts ended)
        done, resumed = [], []
        for seq, chunk in chunks:
            seq.computed += chunk
            if seq.computed >= seq.target:
                if not decoding:
                    done.append(seq)
                elif seq.generated:          # recomputed after a preemption
                    resumed.append(seq)
                else:
                    decoders.append(seq)    # the step that ends its prompt samples a token
        now = self.now
        # a preempted sequence's next token comes after its wait and its recompute
        self.gaps.extend((now, now - seq.last_token_s, 1) for seq in resumed)
        later = 0                      # tokens after a sequence's first: each a gap
        together = 0                   # accepted drafts: out with the step's token, no gap
        gained = 0
        for position, seq in enumerate(decoders + resumed):
            if seq.generated:
                later += 1
            tokens = 1
            if position < verified and seq.drafts:
                tokens = min(self.spec.speculation.gained(self._draft_rng),
                             seq.output - seq.generated)
                together += tokens - 1
            gained += tokens
            seq.generated += tokens
            seq.last_token_s = now
            if seq.generated == 1:
                self.outcomes[seq.index].ttft_s = now - self.arrivals[seq.index]
            if seq.generated >= seq.output:
                outcome = self.outcomes[seq.index]
                outcome.e2e_s = now - self.arrivals[seq.index]
                outcome.decode_s = now - seq.admitted_s
                done.append(seq)
        later -= len(resumed)          # theirs are above
        if later:
            self.gaps.append((now, took, later))
        if together:
            self.gaps.append((now, 0.0, together))
        engine.reserved += gained
        for seq in done:
            engine.running.remove(seq)
            engine.reserved -= seq.held
            if decoding:
                self._answered(engine, seq)
            else:
                engine.cache.keep(seq.chain)
                self._prefilled(engine, seq)
        if decoding:
            self._count_decode(-sum(1 for s in done))
        self._kick(engine, decoding)

    def _answered(self, engine: _Engine, seq: _Seq) -> None:
        """Its engine caches the prompt and answer (less the last token, never fed back),
        the router's belief records them, and the conversation's next turn is due."""
        request = self.requests[seq.index]
        engine.ongoing -= 1
        engine.served += 1
        self._completed(seq, engine, f"decode-{seq.index}", "decode")
        self._released(seq.index)
        if seq.chain:
            whole = block_chain(request, seq.prompt + seq.output - 1, self.spec.block_size)
            engine.cache.keep(whole)
            self._views[seq.router].belief.finished_chain(f"decode-{seq.index}", whole)
        for later in self._followers.get(seq.index, ()):
            self._at(self.now + self.requests[later].think_s,
                     lambda i=later: self._arrive(i))

    def _count_decode(self, change: int) -> None:
        """Sequences held by decode engines over time (Little's law's L)."""
        self._concurrency += self._decode_seqs * (self.now - self._last_change)
        self._last_change = self.now
        self._decode_seqs += change


def _first_with_room(ranking: Sequence[str], engines: list[_Engine]) -> _Engine:
    """The first of the ranking whose replica takes the request, as Serve tries them in
    order; when all are full, the first (Serve would hold it in the router until one
    has room: here it waits in that engine's queue instead)."""
    by_name = {engine.name: engine for engine in engines}
    return next((by_name[name] for name in ranking if by_name[name].has_room()),
                by_name[ranking[0]])


def _summed(engines: list[_Engine]) -> dict[str, int]:
    return {source: sum(e.prompt_tokens[source] for e in engines)
            for source in PROMPT_SOURCES}
