"""What a decode pass asks of its engine (pure: a copy of the request's ``SamplingParams``).

The pool's own half of the engine contract; docs/design.md, "Prefill runs with
max_tokens=1; decode samples every output token".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kv_transfer.handle import engine_extra_args


def decode_params(sampling: Any, kv_transfer_params: Mapping[str, Any] | None) -> Any:
    """The request's own sampling, pulling the KV the handle names (none: decode-local).

    Its output kind stays what vLLM's OpenAI layer chose: deltas for a stream, one final
    output for a unary request (one Ray item instead of one per token through the router).
    """
    params = sampling.clone()
    kv_args = engine_extra_args(kv_transfer_params)
    if kv_args:
        params.extra_args = {**(params.extra_args or {}), **kv_args}
    return params
