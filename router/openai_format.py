"""OpenAI wire format of responses and stream chunks (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from cluster.engine.messages import TokenChunk

Kind = Literal["completion", "chat"]

DONE_EVENT = "data: [DONE]\n\n"


@dataclass(frozen=True)
class ResponseMeta:
    """What every response and chunk of one request repeats."""

    request_id: str
    model: str
    created: int
    kind: Kind
    return_token_ids: bool = False


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _object_name(meta: ResponseMeta, streaming: bool) -> str:
    if meta.kind == "completion":
        return "text_completion"
    return "chat.completion.chunk" if streaming else "chat.completion"


def _envelope(meta: ResponseMeta, streaming: bool, choices: list[dict]) -> dict[str, Any]:
    return {
        "id": meta.request_id,
        "object": _object_name(meta, streaming),
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    }


def full_response(
    meta: ResponseMeta,
    text: str,
    token_ids: list[int],
    prompt_token_ids: list[int],
    finish_reason: str | None,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """The body of a non-streaming response."""
    if meta.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
    choice["finish_reason"] = finish_reason
    if meta.return_token_ids:
        choice["token_ids"] = token_ids
    body = _envelope(meta, False, [choice])
    if meta.return_token_ids:
        _attach_prompt_ids(meta, body, prompt_token_ids)
    body["usage"] = usage(len(prompt_token_ids), completion_tokens, cached_tokens)
    return body


def stream_start(meta: ResponseMeta, prompt_token_ids: list[int]) -> str | None:
    """The first event of a chat stream announces the role; completions have none."""
    if meta.kind != "chat":
        return None
    choice: dict[str, Any] = {
        "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
        "finish_reason": None,
    }
    body = _envelope(meta, True, [choice])
    if meta.return_token_ids:
        _attach_prompt_ids(meta, body, prompt_token_ids)
    return sse(body)


def _attach_prompt_ids(meta: ResponseMeta, body: dict[str, Any], ids: list[int]) -> None:
    # Where vLLM's server puts them (`return_token_ids`): in the choice for completions,
    # at the top level for chat.
    if meta.kind == "completion":
        body["choices"][0]["prompt_token_ids"] = ids
    else:
        body["prompt_token_ids"] = ids


def stream_chunk(
    meta: ResponseMeta, chunk: TokenChunk, prompt_token_ids: list[int] | None = None
) -> str | None:
    """One event for a chunk of tokens, or None when it carries nothing to send.

    ``prompt_token_ids`` goes with the first event of a completion stream (a chat stream
    announces them in its start event).
    """
    if not chunk.text and not chunk.token_ids and chunk.finish_reason is None:
        return None
    if meta.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": chunk.text, "logprobs": None}
    else:
        delta = {"content": chunk.text} if chunk.text or chunk.finish_reason is None else {}
        choice = {"index": 0, "delta": delta, "logprobs": None}
    choice["finish_reason"] = chunk.finish_reason
    body = _envelope(meta, True, [choice])
    if meta.return_token_ids:
        choice["token_ids"] = list(chunk.token_ids)
        if prompt_token_ids is not None:
            _attach_prompt_ids(meta, body, prompt_token_ids)
    return sse(body)


def stream_usage(meta: ResponseMeta, last: TokenChunk) -> str:
    """The final usage event sent when ``stream_options.include_usage`` is set."""
    body = _envelope(meta, True, [])
    body["usage"] = usage(last.prompt_tokens, last.completion_tokens, last.cached_prompt_tokens)
    return sse(body)


def stream_error(error_body: dict[str, Any]) -> str:
    """An error after the stream started (status already sent): as an event, then DONE."""
    return sse(error_body)


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
