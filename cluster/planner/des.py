"""A discrete-event simulation of a pdserve cluster (pure: seeded, no clock, no I/O).

Requests arrive, take the path pdserve's own policy gives them
(``router.disaggregation.choose_path``), are placed by the router's own rankings
(``rank_prefill``, ``rank_decode``) on load snapshots that are ``report_interval_s`` old
at most, as the replicas' reports are, and run on engines that schedule like vLLM v1:

- a step computes at most ``max_num_batched_tokens`` tokens: one for every running
  sequence first, then prompt chunks in arrival order (chunked prefill);
- at most ``max_num_seqs`` sequences run, and a sequence is admitted only when the KV of
  its prompt and its whole answer fits beside the running ones (no preemption: pdserve's
  admission reserves the same);
- a step's time comes from the step cost model (cluster/planner/cost_model.py).

A disaggregated request is prefilled on a prefill replica, its KV moves to a decode
replica (``Transfer``), and its first token comes from that replica's first step with it.
A decode-local one is prefilled by its decode engine, inside its steps. TTFT is the end of
the step that made the first token; each later token's gap is its step's time.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cluster.planner.model import prefill_pairs
from router.disaggregation import choose_path
from router.replica_choice import (
    DecodePolicy,
    PendingTally,
    PrefillPolicy,
    ReplicaLoad,
    rank_decode,
    rank_prefill,
)

StepTime = Callable[[int, float, int], float]   # (new tokens, token pairs, context) -> s


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0      # of the prompt, in the prefix cache of the engine that
    #                             prefills it (a shared system prompt, an earlier turn)


@dataclass(frozen=True)
class EngineLimits:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 10**9


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


@dataclass
class Outcome:
    """One request's times (seconds after its arrival), or why it did not finish."""

    path: str
    ttft_s: float | None = None
    e2e_s: float | None = None
    prefill_done_s: float | None = None
    ready_s: float | None = None        # its prompt's KV reached (or its prompt reached)
    #                                     the decode pool
    decode_s: float | None = None       # admitted to a decode engine until finished


@dataclass
class SimResult:
    requests: list[SimRequest]
    outcomes: list[Outcome]
    # (step end, step seconds, sequences that got a token in it): the inter-token gaps
    token_gaps: list[tuple[float, float, int]]
    busy_s: dict[str, float]                    # pool -> engine-seconds busy until the
    #                                             last arrival
    last_arrival_s: float
    decode_concurrency_integral: float          # ∫ sequences in decode engines dt
    horizon_s: float

    def finished(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.e2e_s is not None]


# ---------------------------------------------------------------------------------------


@dataclass
class _Seq:
    index: int
    prompt: int
    output: int
    computed: int = 0          # prompt tokens whose KV exists here
    generated: int = 0
    admitted_s: float = 0.0


@dataclass
class _Engine:
    name: str
    limits: EngineLimits
    step_time: StepTime
    busy: bool = False
    waiting: deque = field(default_factory=deque)   # _Seq not yet admitted
    running: list = field(default_factory=list)      # _Seq admitted (prefilling or decoding)
    reserved: int = 0                                 # KV tokens reserved by running
    busy_s: float = 0.0

    def queued_prompt_tokens(self) -> int:
        return (sum(s.prompt - s.computed for s in self.waiting)
                + sum(s.prompt - s.computed for s in self.running if s.computed < s.prompt))

    def admit(self, reserve: Callable[[_Seq], int], now: float) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            need = reserve(self.waiting[0])
            if self.running and self.reserved + need > self.limits.kv_capacity_tokens:
                return
            seq = self.waiting.popleft()
            seq.admitted_s = now
            self.reserved += need
            self.running.append(seq)

    def plan_step(self, decoding: bool) -> tuple[list, list, int, float, int]:
        """(sequences decoding, (seq, chunk) prefilling, new tokens, pairs, context)."""
        budget = self.limits.max_num_batched_tokens
        decoders = [s for s in self.running if s.computed >= s.prompt] if decoding else []
        budget -= len(decoders)
        chunks = []
        pairs = float(sum(s.prompt + s.generated for s in decoders))
        context = sum(s.prompt + s.generated for s in decoders)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.computed < seq.prompt:
                chunk = min(budget, seq.prompt - seq.computed)
                chunks.append((seq, chunk))
                pairs += prefill_pairs(chunk, seq.computed)
                context += seq.computed
                budget -= chunk
        new = len(decoders) + sum(chunk for _, chunk in chunks)
        return decoders, chunks, new, pairs, context


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
        self.prefill = [_Engine(f"p{i}", spec.prefill_limits, spec.prefill_step)
                        for i in range(spec.prefill_replicas)]
        self.decode = [_Engine(f"d{i}", spec.decode_limits, spec.decode_step)
                       for i in range(spec.decode_replicas)]
        self.outcomes = [Outcome("") for _ in self.requests]
        self.gaps: list[tuple[float, float, int]] = []
        self._decode_seqs = 0
        self._concurrency = 0.0
        self._last_change = 0.0
        self._snapshot: dict[str, ReplicaLoad] = {}
        self._snapshot_at = float("-inf")
        self._tally = PendingTally()     # the router's own: sends since the last report
        self._last_arrival = max((r.arrival_s for r in self.requests), default=0.0)
        self._prefill_policy = PrefillPolicy(block_size=16, max_blocks=0,
                                             max_imbalance_tokens=0, index_capacity=1,
                                             stale_after_s=float("inf"))
        self._decode_policy = DecodePolicy(kv_weight=1.0, kv_high_water=0.95,
                                           default_max_num_seqs=spec.decode_limits.max_num_seqs,
                                           stale_after_s=float("inf"))

    # -- the event loop ----------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def run(self) -> SimResult:
        for index, request in enumerate(self.requests):
            self._at(request.arrival_s, lambda i=index: self._arrive(i))
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()
        self._count_decode(0)
        return SimResult(self.requests, self.outcomes, self.gaps,
                         {"prefill": sum(e.busy_s for e in self.prefill),
                          "decode": sum(e.busy_s for e in self.decode)},
                         self._last_arrival,
                         self._concurrency, self.now)

    # -- routing: pdserve's policies on load snapshots ---------------------------------

    def _loads(self, engines: list[_Engine]) -> list[ReplicaLoad]:
        interval = self.spec.report_interval_s
        if interval <= 0 or self.now - self._snapshot_at >= interval:
            self._snapshot_at = self.now
            self._snapshot = {e.name: ReplicaLoad(
                e.name, queued_prefill_tokens=e.queued_prompt_tokens(),
                running_seqs=len(e.running), waiting_seqs=len(e.waiting),
                kv_usage=e.reserved / e.limits.kv_capacity_tokens,
                max_num_seqs=e.limits.max_num_seqs) for e in self.prefill + self.decode}
            for name in self._snapshot:
                self._tally.observe_report(name, self.now)
        return [self._with_pending(self._snapshot[e.name]) for e in engines]

    def _with_pending(self, load: ReplicaLoad) -> ReplicaLoad:
        """The report plus what was sent since, as the router's ReplicaLoad has it (built,
        not ``dataclasses.replace``d: this runs for every replica at every routing)."""
        return ReplicaLoad(load.replica_id, load.queued_prefill_tokens, load.running_seqs,
                           load.waiting_seqs, load.kv_usage, load.max_num_seqs,
                           pending_tokens=self._tally.tokens(load.replica_id),
                           pending_requests=self._tally.requests(load.replica_id))

    def _sent(self, engine: _Engine, key: str, tokens: int) -> None:
        self._tally.add(key, engine.name, tokens, self.now)

    def _pick_prefill(self, prompt: int) -> _Engine:
        ranking = rank_prefill(prompt, {}, self._loads(self.prefill), self._prefill_policy,
                               self.rng).ranking
        return next(e for e in self.prefill if e.name == ranking[0])

    def _pick_decode(self) -> _Engine:
        ranking = rank_decode(self._loads(self.decode), self._decode_policy, self.rng)
        return next(e for e in self.decode if e.name == ranking[0])

    # -- requests ------------------------------------------------------------------------

    def _arrive(self, index: int) -> None:
        request = self.requests[index]
        path = choose_path(request.prompt_tokens, self.spec.threshold_tokens)
        if not self.prefill:
            path = "decode_local"
        self.outcomes[index].path = path
        cached = min(request.cached_tokens, request.prompt_tokens - 1)  # it computes the last
        seq = _Seq(index, request.prompt_tokens, request.output_tokens, computed=cached)
        if path == "decode_local":
            self._to_decode(seq)
            return
        engine = self._pick_prefill(request.prompt_tokens)
        self._sent(engine, f"prefill-{index}", request.prompt_tokens - cached)
        engine.waiting.append(seq)
        self._kick(engine, decoding=False)

    def _prefilled(self, seq: _Seq) -> None:
        outcome = self.outcomes[seq.index]
        outcome.prefill_done_s = self.now - self.requests[seq.index].arrival_s
        moved = _Seq(seq.index, seq.prompt, seq.output, computed=seq.prompt)
        self._at(self.now + self.spec.transfer_s(seq.prompt), lambda: self._to_decode(moved))

    def _to_decode(self, seq: _Seq) -> None:
        self.outcomes[seq.index].ready_s = self.now - self.requests[seq.index].arrival_s
        engine = self._pick_decode()
        self._sent(engine, f"decode-{seq.index}", seq.prompt - seq.computed)
        engine.waiting.append(seq)
        self._kick(engine, decoding=True)

    # -- engines -------------------------------------------------------------------------

    def _kick(self, engine: _Engine, decoding: bool) -> None:
        if engine.busy:
            return
        reserve = (lambda s: s.prompt + s.output) if decoding else (lambda s: s.prompt)
        before = len(engine.running)
        engine.admit(reserve, self.now)
        if decoding:
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
        done = []
        for seq, chunk in chunks:
            seq.computed += chunk
            if seq.computed >= seq.prompt:
                if decoding:
                    decoders.append(seq)    # the step that ends its prompt samples a token
                else:
                    done.append(seq)
        later = sum(1 for seq in decoders if seq.generated)   # a first token is no gap
        if later:
            self.gaps.append((self.now, took, later))
        for seq in decoders:
            seq.generated += 1
            outcome = self.outcomes[seq.index]
            since = self.now - self.requests[seq.index].arrival_s
            if seq.generated == 1:
                outcome.ttft_s = since
            if seq.generated >= seq.output:
                outcome.e2e_s = since
                outcome.decode_s = self.now - seq.admitted_s
                done.append(seq)
        for seq in done:
            engine.running.remove(seq)
            engine.reserved -= (seq.prompt + seq.output) if decoding else seq.prompt
            if not decoding:
                self._prefilled(seq)
        if decoding:
            self._count_decode(-sum(1 for s in done))
        self._kick(engine, decoding)

    def _count_decode(self, change: int) -> None:
        """Sequences held by decode engines over time (Little's law's L)."""
        self._concurrency += self._decode_seqs * (self.now - self._last_change)
        self._last_change = self.now
        self._decode_seqs += change
