"""What pdserve checks of an OpenAI request before vLLM's OpenAI layer sees it (pure).

vLLM's own request models parse and validate the body (router/vllm_frontend.py); this
module only refuses the few fields pdserve cannot honour (with a 400 naming the field,
never accepted and ignored) and the ``vllm_xargs`` keys the engines reserve, and checks
token ids against the vocabulary before a prompt is sent to the engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.errors import bad_request

# Fields vLLM's layer accepts that pdserve cannot honour, each with the values that change
# nothing. A field accepted and then ignored is worse than a refusal: the client believes
# it got what it asked for.
NOT_HONOURED: dict[str, tuple[Any, ...]] = {
    # beam search runs a search loop against one local engine, not a stream of outputs
    "use_beam_search": (None, False),
    # the engines' own KV-transfer instructions: the router sets them, never a client
    "kv_transfer_params": (None,),
    # the prefix-cache salt is pdserve's: each API key's prompts are salted with the key
    # (router/engine_client.py prefix_cache_salt), which a client's own would undo
    "cache_salt": (None,),
    # the engines schedule first come, first served; admission decides the order
    "priority": (None, 0),
}
# Keys of ``vllm_xargs`` (vLLM copies them into ``SamplingParams.extra_args``) that the
# engines read as their own instructions: the KV connector takes its handshake from
# ``kv_transfer_params`` there, so a client's value would reach the connector as one.
RESERVED_XARGS = ("kv_transfer_params",)


def refuse_not_honoured(data: Any) -> None:
    """400 for a field pdserve cannot honour (``NOT_HONOURED``) set to a value that counts
    (a body that is not an object is left to vLLM's request models to refuse)."""
    if not isinstance(data, dict):
        return
    for name, neutral in NOT_HONOURED.items():
        if name in data and not any(_same(data[name], value) for value in neutral):
            raise bad_request(f"'{name}' is not supported by this server",
                              name, "unsupported_parameter")
    xargs = data.get("vllm_xargs")
    for key in RESERVED_XARGS if isinstance(xargs, dict) else ():
        if key in xargs:
            raise bad_request(f"'vllm_xargs.{key}' is reserved for the engines",
                              f"vllm_xargs.{key}", "unsupported_parameter")


def _same(value: Any, neutral: Any) -> bool:
    # JSON's true is not 1, and 1.0 is 1: compare booleans by identity, the rest by value.
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def check_token_ids(token_ids: Sequence[int], vocab_size: int) -> None:
    """A prompt must name tokens the model has (a 400, before any engine sees it)."""
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise bad_request(
                f"token id {token_id} is outside the vocabulary (0..{vocab_size - 1})",
                "prompt", "invalid_value",
            )
