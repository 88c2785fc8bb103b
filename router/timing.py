"""Latencies of one request as its client sees them (pure: the clock is passed in)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestTimer:
    """Feed it the arrival time, the dispatch time and each chunk's time and token count.

    Inter-token latency is per token: a chunk carrying k tokens after a gap g contributes
    k gaps of g/k (tokens that arrive together were produced within that gap).
    """

    arrival: float
    dispatched: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    inter_token_gaps: list[float] = field(default_factory=list)

    def dispatch(self, now: float) -> None:
        self.dispatched = now

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

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.dispatched is None else self.dispatched - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.last_token is None else self.last_token - self.arrival
