"""Whether a request goes through the prefill pool or is prefilled by its decode engine (pure).

Disaggregation has a fixed cost per request: a hop to a prefill replica, a KV transfer
and a second scheduling on the decode side (~75 ms at low load on the project's CPU
machine, docs/benchmarks.md). For a prompt that the decode engine prefills in less than
that, it is pure loss; long prompts are what must be kept off the decode engines, where
their prefill would stall every running stream. So prompts shorter than a threshold take
the decode-local path.

What a decode engine computes is not the prompt but the part of it its prefix cache
lacks. The next turn of a conversation repeats the last turn's prompt and answer, which
the decode engine that produced the answer still holds: that request is decode-local when
its *uncached* tokens are under the threshold, pinned to that replica (llm-d's prefix-aware
decider; docs/design.md, "The next turn stays on its decode engine").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Route = Literal["disaggregated", "decode_local"]


def choose_path(prompt_tokens: int, threshold_tokens: int) -> Route:
    """``decode_local`` for prompts under ``threshold_tokens`` (0 disaggregates all)."""
    return "decode_local" if prompt_tokens < threshold_tokens else "disaggregated"


@dataclass(frozen=True)
class PathChoice:
    """A route, and the decode replica it must go to (None: the decode router's choice)."""

    route: Route
    decode_replica: str | None = None


def choose_path_with_cache(prompt_tokens: int, threshold_tokens: int,
                           holder: str | None = None, held_tokens: int = 0) -> PathChoice:
    """The path by prompt length, or decode-local on ``holder`` when that decode replica is
    believed to hold ``held_tokens`` of the prompt's head and the rest is under the
    threshold. An engine computes at least the prompt's last token, cached or not."""
    route = choose_path(prompt_tokens, threshold_tokens)
    if route == "decode_local" or holder is None or held_tokens <= 0:
        return PathChoice(route)
    uncached = max(1, prompt_tokens - held_tokens)
    if choose_path(uncached, threshold_tokens) == "decode_local":
        return PathChoice("decode_local", holder)
    return PathChoice(route)
