"""Whether a request goes through the prefill pool or is prefilled by its decode engine (pure).

Disaggregation has a fixed cost per request: a hop to a prefill replica, a KV transfer
and a second scheduling on the decode side (~75 ms at low load on the project's CPU
machine, docs/benchmarks.md). For a prompt that the decode engine prefills in less than
that, it is pure loss; long prompts are what must be kept off the decode engines, where
their prefill would stall every running stream. So prompts shorter than a threshold take
the decode-local path.
"""

from __future__ import annotations

from typing import Literal

Route = Literal["disaggregated", "decode_local"]


def choose_path(prompt_tokens: int, threshold_tokens: int) -> Route:
    """``decode_local`` for prompts under ``threshold_tokens`` (0 disaggregates all)."""
    return "decode_local" if prompt_tokens < threshold_tokens else "disaggregated"
