"""A version's reasoning parser on the real stack (v2 runs vLLM's ``deepseek_r1`` parser).

The tiny model never chooses ``</think>`` by itself (its output row is zero), so these
requests sample with a ``logit_bias`` on it and a seed: the same seeded request sent as a
completion over the chat's own prompt tokens gives the raw text (same engine, same sampling),
and the chat answer must be that text split where the reasoning ends. Both paths: a short
prompt is prefilled by the decode engine, a long one by the prefill pool and sent over NIXL.

Structured outputs after reasoning: with ``include_reasoning: false`` vLLM's chat layer tells
the engine the reasoning has ended, so the grammar constrains from the first token; with
reasoning included and no ``</think>`` ever sampled, the grammar never starts. The decode
engine sees that flag only if pdserve carries it there.
"""

from __future__ import annotations

import json

import httpx
import pytest

from router.sse import sse_lines
from tests.integration.openai_http import AUTH

pytestmark = pytest.mark.integration

MODEL = "tiny-llama-think"   # pdserve-test.yaml: v2, with reasoning_parser: deepseek_r1
END = "</think>"
START_ID, END_ID = 259, 260  # cluster/tiny_model.py: after 256 bytes and 3 special tokens
SHORT = "Think first."
LONG = "Think it through before answering. " * 8   # ~280 tokens: over the threshold
# "</think>" made likely; "<think>" ruled out (vLLM's parser reads a second reasoning block
# differently in unary and streamed answers).
SAMPLED = {"temperature": 1.0, "seed": 11, "max_tokens": 48,
           "logit_bias": {str(END_ID): 5, str(START_ID): -100}}


def post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, headers=AUTH, timeout=300)


def chat_prompt_ids(base_url: str, messages: list[dict]) -> list[int]:
    response = post(base_url, "/tokenize", {"model": MODEL, "messages": messages})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def streamed_message(base_url: str, body: dict) -> tuple[str, str]:
    reasoning, content = [], []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", headers=AUTH, timeout=300,
                      json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in sse_lines(response.iter_bytes()):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: "):])["choices"]:
                reasoning.append(choice["delta"].get("reasoning") or "")
                content.append(choice["delta"].get("content") or "")
    return "".join(reasoning), "".join(content)


@pytest.mark.parametrize("prompt", [SHORT, LONG], ids=["decode-local", "disaggregated"])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_the_answer_is_split_where_the_reasoning_ends(pdserve, prompt, stream):
    messages = [{"role": "user", "content": prompt}]
    raw = post(pdserve, "/v1/completions", {
        "model": MODEL, "prompt": chat_prompt_ids(pdserve, messages), **SAMPLED})
    assert raw.status_code == 200, raw.text
    text = raw.json()["choices"][0]["text"]
    before, found, after = text.partition(END)
    assert found and before and after, f"the sample must end its reasoning midway: {text!r}"

    body = {"model": MODEL, "messages": messages, **SAMPLED}
    if stream:
        reasoning, content = streamed_message(pdserve, body)
    else:
        answer = post(pdserve, "/v1/chat/completions", body)
        assert answer.status_code == 200, answer.text
        message = answer.json()["choices"][0]["message"]
        reasoning, content = message["reasoning"], message["content"]
    assert (reasoning, content) == (before, after)


@pytest.mark.parametrize("prompt", [SHORT, LONG], ids=["decode-local", "disaggregated"])
def test_structured_outputs_start_when_the_reasoning_has_ended(pdserve, prompt):
    choices = ["yes", "no"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "max_tokens": 8, "structured_outputs": {"choice": choices},
            "return_token_ids": True}
    hidden = post(pdserve, "/v1/chat/completions", {**body, "include_reasoning": False})
    assert hidden.status_code == 200, hidden.text
    # The parser still reads an answer without "</think>" as reasoning and hides it, token
    # ids included; what is left to see is that the grammar ended it: one of the choices
    # and the end of text, where an unconstrained answer runs to max_tokens.
    answer = hidden.json()
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] in {len(choice) + 1 for choice in choices}

    # Reasoning included: the grammar waits for a "</think>" this model never writes.
    shown = post(pdserve, "/v1/chat/completions", body)
    assert shown.status_code == 200, shown.text
    message = shown.json()["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"] == sampled_text(shown)
    assert message["reasoning"] not in choices
    assert shown.json()["usage"]["completion_tokens"] == body["max_tokens"]


def sampled_text(response: httpx.Response) -> str:
    """The answer's tokens as text, end of text left out (one token per byte)."""
    token_ids = response.json()["choices"][0]["token_ids"]
    return bytes(token for token in token_ids if token < 256).decode()
