"""Whether a request goes through the prefill pool or is prefilled by its decode engine (pure).

Prompts shorter than a threshold take the decode-local path; with the decode pool's prefix
belief (``choose_path_with_cache``) the threshold applies to the prompt tokens missing from
the decode replica believed to hold its longest head, and a decode-local request is pinned
to that replica. Why and what it measured: docs/design.md, "Per-request disaggregation" and "The
next turn stays on its decode engine".
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
