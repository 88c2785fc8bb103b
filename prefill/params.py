"""What a prefill pass asks of its engine (shell: builds vLLM's ``SamplingParams``).

The pool's own half of the engine contract; docs/design.md, "Prefill runs with
max_tokens=1; decode samples every output token".
"""

from __future__ import annotations

from typing import Any

from kv_transfer.handle import engine_extra_args, prefill_request_params


def prefill_params() -> Any:
    """A prompt pass for a remote decode engine: one discarded token, none of the request's
    sampling (n, logprobs, grammars, penalties are the decode engine's business), no text
    for it (``detokenize=False``: AsyncLLM's output handler skips the detokenizer), and the
    connector told to keep the blocks for a remote decode."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=1, n=1, output_kind=RequestOutputKind.FINAL_ONLY, detokenize=False,
        extra_args=engine_extra_args(prefill_request_params()),
    )
