"""Latencies of one request as its client sees them (pure: the clock is passed in)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The stages of a request up to its first event, in the order they happen; each lasts from
# the end of the one before (the first from the request's arrival):
STAGES = (
    "render",       # vLLM's OpenAI layer: parse, validate, chat template, tokenize
    "admission",    # waiting for the admission budget (router/admission.py)
    "prefill",      # the prefill pool: routing, queue, compute, the handle back (retries too)
    "first_token",  # the decode pool: routing, KV pull or local prefill, the first step
    "first_event",  # the first output made into the answer's first bytes (detokenized)
)


@dataclass
class RequestTimer:
    """Feed it the arrival time, the stage marks and each chunk's time and token count.

    Inter-token latency is per token: a chunk carrying k tokens after a gap g contributes
    k gaps of g/k (tokens that arrive together were produced within that gap).
    Marks keep their first time: the prompts of a batched request reach them one by one,
    and the first prompt's marks lead to the first token.
    """

    arrival: float
    rendered: float | None = None
    dispatched: float | None = None
    prefilled: float | None = None
    first_token: float | None = None
    first_event: float | None = None
    last_token: float | None = None
    tokens: int = 0
    chunks: int = 0  # outputs that carried tokens
    inter_token_gaps: list[float] = field(default_factory=list)

    def render(self, now: float) -> None:
        if self.rendered is None:
            self.rendered = now

    def dispatch(self, now: float) -> None:
        if self.dispatched is None:
            self.dispatched = now

    def prefill(self, now: float) -> None:
        if self.prefilled is None:
            self.prefilled = now

    def answer(self, now: float) -> None:
        """The answer's first bytes (a stream's first event, a unary answer) are out."""
        if self.first_event is None:
            self.first_event = now

    def stages(self) -> dict[str, float]:
        """Seconds spent in each stage that happened (``STAGES``; no ``prefill`` on the
        decode-local path). Consecutive: they add up to arrival → the last mark."""
        marks = (self.rendered, self.dispatched, self.prefilled, self.first_token,
                 self.first_event)
        stages, previous = {}, self.arrival
        for name, at in zip(STAGES, marks, strict=True):
            if at is not None:
                stages[name] = max(0.0, at - previous)
                previous = max(previous, at)
        return stages

    def chunk(self, now: float, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if self.first_token is None:
            self.first_token = now
            # the first token's own gap is TTFT, not an inter-token gap
            later_tokens = num_tokens - 1
            gap_start = now
        else:
            later_tokens = num_tokens
            gap_start = self.last_token
        if later_tokens:
            gap = (now - gap_start) / later_tokens if gap_start is not None else 0.0
            self.inter_token_gaps.extend([gap] * later_tokens)
        self.last_token = now
        self.tokens += num_tokens
        self.chunks += 1

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.dispatched is None else self.dispatched - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.last_token is None else self.last_token - self.arrival
