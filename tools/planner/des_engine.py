"""The simulated engines (pure): sequences, prefix caches and vLLM v1's scheduling.

An engine's step computes at most ``max_num_batched_tokens`` tokens (one for every
running sequence first, then prompt chunks in arrival order), admits sequences while
their KV fits, preempts the latest admitted when a decode step's KV does not (recompute),
and keeps finished sequences' blocks in its prefix cache, least recently used out first.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tools.bench.engine_work import PROMPT_SOURCES
from tools.planner.des_spec import EngineLimits, StepTime
from tools.planner.model import prefill_pairs
from tools.planner.speculation import Speculation


@dataclass(eq=False)     # one sequence is itself only (and list.remove compares cheaply)
class Seq:
    """One request's sequence on one engine."""

    index: int
    prompt: int
    output: int
    computed: int = 0          # prompt tokens whose KV exists here
    generated: int = 0
    admitted_s: float = 0.0
    chain: tuple[int, ...] = ()  # its prompt's full blocks (block_chain)
    resumed: int = 0           # tokens it had generated when last preempted (recomputed)
    last_token_s: float = 0.0
    router: int = 0            # the router view that routes it (des_routing.RouterView)
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


class PrefixCache:
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
        """Hold ``chain``'s blocks, as the most recently used."""
        for block in chain:
            self.blocks[block] = None
            self.blocks.move_to_end(block)

    def trim(self, room_blocks: int) -> None:
        """Evict the least recently used blocks until ``room_blocks`` are left."""
        while len(self.blocks) > max(0, room_blocks):
            self.blocks.popitem(last=False)


@dataclass
class Engine:
    """One simulated replica's engine, scheduling like vLLM v1."""

    name: str
    limits: EngineLimits
    step_time: StepTime
    busy: bool = False
    waiting: deque = field(default_factory=deque)   # Seq not yet admitted
    running: list = field(default_factory=list)      # Seq admitted (prefilling or decoding)
    reserved: int = 0                                 # KV tokens held by running
    preemptions: int = 0
    busy_s: float = 0.0
    ongoing: int = 0                                  # requests its replica holds (Serve's)
    served: int = 0                                   # requests its replica is done with
    cache: PrefixCache = field(default_factory=PrefixCache)
    block_size: int = 16
    speculation: Speculation | None = None    # a speculating decode engine's
    draft_rng: random.Random | None = None     # whether each step drafts
    # prompt tokens taken in, by where their KV came from (engine_work's sources)
    prompt_tokens: dict = field(default_factory=lambda: dict.fromkeys(PROMPT_SOURCES, 0))

    def has_room(self) -> bool:
        """Whether its replica takes one more request (Serve's max_ongoing_requests)."""
        return self.limits.max_ongoing is None or self.ongoing < self.limits.max_ongoing

    def queued_prompt_tokens(self) -> int:
        """Prompt tokens (and recomputed answers) still to compute, waiting or running."""
        return (sum(s.target - s.computed for s in self.waiting)
                + sum(s.target - s.computed for s in self.running if s.computed < s.target))

    def admit(self, now: float) -> None:
        """Admit waiting sequences in order while their KV fits, then trim the cache."""
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

    def _look_up(self, seq: Seq) -> None:
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

    def finish_step(self, now: float, decoding: bool, decoders: list, chunks: list,
                    took: float) -> StepEnd:
        """The end of the step ``plan_step`` planned (``took`` seconds): prompt chunks
        computed, a token (and, speculating, the accepted drafts) for every sequence
        decoding, and the KV they add reserved."""
        self.busy = False
        verified = len(decoders)       # decoding before the step (the rest: prompts ended)
        done, resumed = self._computed(decoding, decoders, chunks)
        # a preempted sequence's next token comes after its wait and its recompute
        gaps = [(now, now - seq.last_token_s, 1) for seq in resumed]
        first_tokens: list[Seq] = []
        later = 0                      # tokens after a sequence's first: each a gap
        together = 0                   # accepted drafts: out with the step's token, no gap
        gained = 0
        for position, seq in enumerate(decoders + resumed):
            if seq.generated:
                later += 1
            tokens = 1
            if position < verified and seq.drafts:
                tokens = min(self.speculation.gained(self.draft_rng),
                             seq.output - seq.generated)
                together += tokens - 1
            gained += tokens
            seq.generated += tokens
            seq.last_token_s = now
            if seq.generated == 1:
                first_tokens.append(seq)
            if seq.generated >= seq.output:
                done.append(seq)
        later -= len(resumed)          # theirs are above
        if later:
            gaps.append((now, took, later))
        if together:
            gaps.append((now, 0.0, together))
        self.reserved += gained
        return StepEnd(done, first_tokens, gaps)

    @staticmethod
    def _computed(decoding: bool, decoders: list, chunks: list) -> tuple[list, list]:
        """Add the step's prompt chunks: (prefills done, recomputes done); a decode
        sequence whose prompt the step ended joins ``decoders`` (it samples a token)."""
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
        return done, resumed

    def release(self, seq: Seq) -> None:
        """``seq`` leaves the engine, its KV freed."""
        self.running.remove(seq)
        self.reserved -= seq.held


@dataclass
class StepEnd:
    """What a step's end did: the sequences done with the engine (prefilled, or
    answered), those that got their first token, and the inter-token gaps it adds."""

    done: list[Seq]
    first_tokens: list[Seq]
    gaps: list[tuple[float, float, int]]


def first_with_room(ranking: Sequence[str], engines: list[Engine]) -> Engine:
    """The first of the ranking whose replica takes the request, as Serve tries them in
    order; when all are full, the first (Serve would hold it in the router until one
    has room: here it waits in that engine's queue instead)."""
    by_name = {engine.name: engine for engine in engines}
    return next((by_name[name] for name in ranking if by_name[name].has_room()),
                by_name[ranking[0]])


def summed_prompt_tokens(engines: list[Engine]) -> dict[str, int]:
    """The engines' prompt tokens by source, summed."""
    return {source: sum(e.prompt_tokens[source] for e in engines)
            for source in PROMPT_SOURCES}
