"""Running statistics of one vLLM engine, as the router and the tests read them (pure).

The engine host feeds this from vLLM's stat-logger callbacks; everything here is plain
numbers so it can cross a Ray call and be asserted on in tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    """Gauges (latest value) and counters (since the engine started)."""

    role: str
    engine_id: str
    # gauges
    kv_cache_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    queued_prefill_tokens: int = 0  # prompt tokens of requests not yet past their prefill
    # counters: prompt tokens by where their KV came from
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_transferred: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    # counters: NIXL transfers this engine pulled (decode side)
    kv_transfers: int = 0
    kv_bytes_transferred: int = 0
    kv_transfer_failures: int = 0
    # counters: KV leases (prefill side) and handles that came too late (decode side)
    kv_leases_expired: int = 0
    kv_handles_late: int = 0
    # counters: speculative decoding (decode.speculative): tokens proposed and kept
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    def observe_scheduler(self, kv_cache_usage: float, num_running: int, num_waiting: int):
        self.kv_cache_usage = kv_cache_usage
        self.num_running = num_running
        self.num_waiting = num_waiting

    def observe_iteration(
        self,
        *,
        computed: int,
        cached: int,
        transferred: int,
        generation_tokens: int,
        finished: int,
    ) -> None:
        self.prompt_tokens_computed += computed
        self.prompt_tokens_cached += cached
        self.prompt_tokens_transferred += transferred
        self.generation_tokens += generation_tokens
        self.requests_finished += finished

    def observe_transfers(self, num_transfers: int, num_bytes: int, failures: int,
                          leases_expired: int = 0) -> None:
        self.kv_transfers += num_transfers
        self.kv_bytes_transferred += num_bytes
        self.kv_transfer_failures += failures
        self.kv_leases_expired += leases_expired

    def observe_speculation(self, draft_tokens: int, accepted_tokens: int) -> None:
        self.spec_draft_tokens += draft_tokens
        self.spec_accepted_tokens += accepted_tokens

    @property
    def is_idle(self) -> bool:
        """No request running or waiting, and no KV block held (prefix-cache blocks that
        are free to evict do not count as held)."""
        return (self.num_running == 0 and self.num_waiting == 0 and self.kv_cache_usage == 0
                and self.queued_prefill_tokens == 0)

    def snapshot(self) -> dict[str, float | int | str | bool]:
        return {**asdict(self), "is_idle": self.is_idle}
