"""The OpenAI wire format of responses and stream events."""

import json

from cluster.engine.messages import TokenChunk
from router import openai_format as fmt

COMPLETION = fmt.ResponseMeta("cmpl-1", "m", 1700000000, "completion", return_token_ids=True)
CHAT = fmt.ResponseMeta("chatcmpl-1", "m", 1700000000, "chat")


def event(text: str) -> dict:
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: "):])


def test_full_completion():
    body = fmt.full_response(COMPLETION, "hey", [1, 2, 3], [9, 9], "length", 3, cached_tokens=1)
    assert body["object"] == "text_completion"
    assert body["choices"][0].pop("prompt_token_ids") == [9, 9]
    assert body["choices"] == [{"index": 0, "text": "hey", "logprobs": None,
                                "finish_reason": "length", "token_ids": [1, 2, 3]}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5,
                             "prompt_tokens_details": {"cached_tokens": 1}}


def test_full_chat_has_message_and_no_token_ids_unless_asked():
    body = fmt.full_response(CHAT, "hi", [1], [2], "stop", 1)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert "token_ids" not in body["choices"][0] and "prompt_token_ids" not in body


def test_chat_stream_events():
    assert event(fmt.stream_start(CHAT, [1]))["choices"][0]["delta"] == {
        "role": "assistant", "content": ""}
    middle = event(fmt.stream_chunk(CHAT, TokenChunk("ab", (5, 6), 2, 1)))
    assert middle["object"] == "chat.completion.chunk"
    assert middle["choices"][0] == {"index": 0, "delta": {"content": "ab"}, "logprobs": None,
                                    "finish_reason": None}
    last = event(fmt.stream_chunk(CHAT, TokenChunk("", (), 2, 1, finish_reason="length")))
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
    usage = event(fmt.stream_usage(CHAT, TokenChunk("", (), 2, 1)))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 3


def test_completion_stream_has_no_role_event_and_skips_empty_chunks():
    assert fmt.stream_start(COMPLETION, [1]) is None
    assert fmt.stream_chunk(COMPLETION, TokenChunk("", (), 0, 1)) is None
    chunk = event(fmt.stream_chunk(COMPLETION, TokenChunk("x", (7,), 1, 1), [4, 5]))
    assert chunk["choices"][0]["text"] == "x" and chunk["choices"][0]["token_ids"] == [7]
    assert chunk["choices"][0]["prompt_token_ids"] == [4, 5]


def test_done_event():
    assert fmt.DONE_EVENT == "data: [DONE]\n\n"
