"""Messages passed between the router and the engine deployments (pure: plain dataclasses).

They cross Ray calls: plain values, plus vLLM's ``SamplingParams`` (a msgspec struct) on the
way in; the decode pool streams vLLM's ``RequestOutput`` deltas back, without the prompt's
token ids (the router has them; each would repeat the whole prompt per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kv_transfer.handle import KVHandle


@dataclass(frozen=True)
class EngineRequest:
    """One generation request as the engines see it: already tokenized by the router."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    # vLLM's SamplingParams as vLLM's OpenAI layer built them from the request (every
    # field the API accepts: n, logprobs, structured outputs, logit_bias, ...). Opaque
    # here; the decode engine samples with them, the prefill engine with lean ones.
    sampling: Any
    # With a reasoning parser (the version's): whether the reasoning already ended in the
    # prompt (structured outputs then constrain from the first token; None: the engine
    # checks the prompt itself) and the parser's arguments, as vLLM's chat layer set them.
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    # The router replica that reads the outputs, as (Ray namespace, actor name): engines
    # abort the request if that replica dies (cluster/engine/callers.py). None: unwatched.
    caller: tuple[str, str] | None = None
    # A stream's decode replica sends at most one chunk of outputs per this many seconds
    # (decode/pacing.py); 0: each output as it comes.
    chunk_interval_s: float = 0.0
    # ... and only once its streams together would send more chunks a second than this,
    # each output leaving as it comes below it; 0: always at chunk_interval_s.
    chunks_per_s: float = 0.0
    # The decode replica whose prefix cache made this request decode-local
    # (router/disaggregation.py): the decode router ranks it first. None: its own choice.
    decode_replica: str | None = None
    # Replicas an earlier attempt of this request failed on while they still run (a
    # deadline passed: a hung engine reports the load it had when it stopped): the pool's
    # router ranks them after every other live replica (router/flow.py).
    avoid_replicas: tuple[str, ...] = ()
    # vLLM's prefix-cache salt: the tenant whose blocks these are (its hashed API key), so
    # that no other tenant's prompt hits them and learns from ``cached_tokens`` what this
    # one sent. None: the cache is shared (router.auth.shared_prefix_cache, or no key).
    cache_salt: str | None = None
    # An answer sent in one piece (a unary request's: vLLM returns it whole): its decode
    # replica sends a ``Progress`` at most this often while its engine steps, so that the
    # router's gap deadline bounds the wait instead of one covering the whole generation.
    # None: no sign of life (a stream, whose tokens are one).
    progress_interval_s: float | None = None


@dataclass(frozen=True)
class Progress:
    """A decode replica's sign of life on a one-piece answer: its engine stepped within
    the last ``progress_interval_s``. The router counts it against its gap deadline and
    passes nothing on."""


@dataclass(frozen=True)
class PrefillResult:
    """What the prefill pool returns: where the prompt's KV blocks wait for a decode engine."""

    handle: KVHandle | None
    prompt_tokens: int
    cached_prompt_tokens: int = 0


class EngineCrashed(RuntimeError):
    """The engine died of an error of its own (cluster/engine/death.py: not a signal) while
    ``request_id`` was in it, with ``requests_in_engine`` requests in all, this one
    included. Alone, the request is the likely cause: the router does not retry it
    (router/retry.py, quarantine)."""

    def __init__(self, request_id: str, requests_in_engine: int):
        super().__init__(request_id, requests_in_engine)  # args: how it crosses Ray
        self.request_id = request_id
        self.requests_in_engine = requests_in_engine

    def __str__(self) -> str:
        return (f"the engine died of an error with request {self.request_id} in it "
                f"({self.requests_in_engine} request(s) in all)")

