"""Messages passed between the router and the engine deployments (pure: plain dataclasses).

They cross Ray calls, so they hold only plain values; the engine hosts turn them into
vLLM objects and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kv_transfer.handle import KVHandle


@dataclass(frozen=True)
class SamplingSpec:
    """The sampling settings of one request (OpenAI fields, plus vLLM's `ignore_eos`)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False


@dataclass(frozen=True)
class EngineRequest:
    """One generation request as the engines see it: already tokenized by the router."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec


@dataclass(frozen=True)
class PrefillResult:
    """What the prefill pool returns: where the prompt's KV blocks wait for a decode engine."""

    handle: KVHandle | None
    prompt_tokens: int
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class TokenChunk:
    """A piece of a generation streamed by a decode engine.

    ``text`` and ``token_ids`` are the new tokens since the previous chunk;
    ``completion_tokens`` counts all generated so far; ``finish_reason`` is set on the
    last chunk only ("stop", "length" or "abort").
    """

    text: str
    token_ids: tuple[int, ...]
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None = None
    cached_prompt_tokens: int = 0
    stop_reason: str | int | None = None
    extra: dict = field(default_factory=dict)
