"""vLLM's OpenAI layer as the router hosts it, over a fake flow (no engine, no Ray).

vLLM's serving classes are internal API: these tests pin the surface pdserve uses (their
constructors, ``render`` → ``generate`` → response and stream, tokenization) on the tiny
model, so a vLLM upgrade that moves it fails here, in seconds, and not on the real stack.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from cluster.config import parse_config
from cluster.tiny_model import ensure_model
from router.errors import APIError
from router.lifecycle import RequestLifecycle
from router.vllm_frontend import build_version, parse_json_body, parse_openai_request
from tests.fake_observer import RecordingObserver

pytest.importorskip("vllm")


class FakeFlow:
    """Answers every request with the same deltas per choice (default: three of "ab")."""

    decode_cache = None   # no decode pool behind it to hold prefixes

    def __init__(self, deltas=(("ab", [97, 98]),) * 3):
        self.requests, self.deltas = [], deltas

    async def generate(self, request, route, one_piece=False, on_prefilled=lambda: None):
        from vllm.outputs import CompletionOutput, RequestOutput

        self.requests.append((request, route))
        for step, (text, token_ids) in enumerate(self.deltas):
            last = step == len(self.deltas) - 1
            choices = [CompletionOutput(index=i, text=text, token_ids=list(token_ids),
                                        cumulative_logprob=None, logprobs=None,
                                        finish_reason="length" if last else None)
                       for i in range(request.sampling.n)]
            yield RequestOutput(request.request_id, None, None, None, choices, last,
                                num_cached_tokens=3)


class Gate:
    def __init__(self):
        self.out, self.released = [], []

    async def acquire(self, cost, key, prompt_tokens=0):
        self.out.append(cost)
        return len(self.out)

    def release(self, ticket):
        self.released.append(ticket)


def build(path, flow, **model):
    config = parse_config({
        "model": {"name": "tiny", "path": str(path),
                  "generate": {"num_layers": 1, "hidden_size": 64, "num_heads": 2,
                               "num_kv_heads": 1, "intermediate_size": 64,
                               "max_position_embeddings": 1024}, **model},
        "engine": {"max_model_len": 1024, "dtype": "float32"},
        "router": {"disaggregation_threshold_tokens": 16},
    })
    ensure_model(config.versions["v1"].path, config.versions["v1"].generate)
    return build_version(config, "v1", flow, ["tiny", "tiny-alias"]), flow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models") / "tiny"


@pytest.fixture(scope="module")
def version(model_dir):
    return build(model_dir, FakeFlow())


@pytest.fixture(scope="module")
def reasoning_version(model_dir):
    """The model with vLLM's deepseek_r1 parser: it answers "hm</think>ok"."""
    return build(model_dir, FakeFlow((("hm", [104, 109]), ("</think>", [260]),
                                      ("ok", [111, 107]))),
                 reasoning_parser="deepseek_r1")


def serve(version, kind, data):
    frontends, _ = version
    body = parse_openai_request(kind, data)
    body.request_id = "k1"
    gate, observer = Gate(), RecordingObserver()
    lifecycle = RequestLifecycle(gate, "id", observer, "key")
    frontends.client.register("k1", lifecycle)
    frontend = frontends.by_name[data["model"]]

    async def run():
        result = await (frontend.chat.create_chat_completion(body) if kind == "chat"
                        else frontend.completion.create_completion(body))
        if hasattr(result, "__aiter__"):
            return [event async for event in result]
        return result

    try:
        return asyncio.run(run()), gate, observer, lifecycle
    finally:
        frontends.client.unregister("k1")


def test_a_unary_chat_is_rendered_admitted_merged_and_named_as_asked(version):
    _, flow = version
    chat = {"model": "tiny-alias", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 6, "n": 2, "seed": 3, "logit_bias": {"97": 5},
            "response_format": {"type": "json_object"}}
    response, gate, observer, _ = serve(version, "chat", chat)
    request, route = flow.requests[-1]
    assert response.model == "tiny-alias"
    assert [c.message.content for c in response.choices] == ["ababab", "ababab"]
    prompt = len(request.prompt_token_ids)
    assert gate.out == [prompt + 6 * 2] and gate.released == [1]
    assert route == "decode_local"  # n > 1 is prefilled by the decode engine
    params = request.sampling
    assert (params.n, params.seed, params.max_tokens) == (2, 3, 6)
    assert params.logit_bias == {97: 5} and params.structured_outputs is not None
    assert response.usage.prompt_tokens == prompt
    assert response.usage.prompt_tokens_details.cached_tokens == 3
    assert sum(observer.token_counts) == 12


def test_a_chat_without_max_tokens_gets_the_routers_default_and_only_then(version):
    # (a completion's max_tokens defaults to 16 in the request model itself, as OpenAI's)
    _, flow = version
    hi = [{"role": "user", "content": "hi"}]
    serve(version, "chat", {"model": "tiny", "messages": hi})
    assert flow.requests[-1][0].sampling.max_tokens == 256  # router.default_max_tokens
    serve(version, "chat", {"model": "tiny", "messages": hi, "max_tokens": 700})
    assert flow.requests[-1][0].sampling.max_tokens == 700  # a default, never a cap


def test_a_stream_carries_vllms_deltas_and_usage(version):
    _, flow = version
    long_prompt = "x" * 40  # beyond the threshold of 16 tokens: through the prefill pool
    events, *_ = serve(version, "completion", {
        "model": "tiny", "prompt": long_prompt, "max_tokens": 6, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert flow.requests[-1][1] == "disaggregated"
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(event[len("data: "):]) for event in events[:-1]]
    text = "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])
    assert text == "ababab"
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_a_refusal_inside_a_stream_is_kept_for_the_router_to_answer(version):
    frontends, _ = version
    refusal = APIError(429, "full", "overloaded_error", code="queue_full")

    class Refusing(Gate):
        async def acquire(self, cost, key, prompt_tokens=0):
            raise refusal

    body = parse_openai_request("chat", {"model": "tiny", "stream": True,
                                         "messages": [{"role": "user", "content": "hi"}]})
    body.request_id = "k2"
    lifecycle = RequestLifecycle(Refusing(), "id", RecordingObserver(), "key")
    frontends.client.register("k2", lifecycle)

    async def first_event():
        events = await frontends.by_name["tiny"].chat.create_chat_completion(body)
        return await anext(events)

    event = asyncio.run(first_event())
    frontends.client.unregister("k2")
    assert lifecycle.failure is refusal and "error" in event


@pytest.mark.parametrize("stream", [False, True])
def test_a_reasoning_parser_separates_reasoning_and_tells_the_engine(reasoning_version,
                                                                      stream):
    _, flow = reasoning_version
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "stream": stream}
    answer, *_ = serve(reasoning_version, "chat", chat)
    if stream:
        deltas = [json.loads(event[len("data: "):])["choices"][0]["delta"]
                  for event in answer[:-1]]
        reasoning = "".join(delta.get("reasoning") or "" for delta in deltas)
        content = "".join(delta.get("content") or "" for delta in deltas)
    else:
        reasoning, content = answer.choices[0].message.reasoning, answer.choices[0].message.content
    assert (reasoning, content) == ("hm", "ok")
    request, _ = flow.requests[-1]
    # The prompt has no "</think>": the engine is told reasoning has not ended, so it
    # holds structured outputs back until it does.
    assert request.reasoning_ended is False
    assert request.reasoning_parser_kwargs is not None


def test_without_reasoning_included_structured_outputs_start_at_once(reasoning_version):
    _, flow = reasoning_version
    serve(reasoning_version, "chat", {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "include_reasoning": False, "response_format": {"type": "json_object"}})
    request, _ = flow.requests[-1]
    assert request.reasoning_ended is True and request.sampling.structured_outputs


def test_tokenize_and_detokenize_are_vllms(version):
    frontends, _ = version
    tokenization = frontends.by_name["tiny"].tokenization
    tokens = asyncio.run(tokenization.create_tokenize(
        parse_openai_request("tokenize", {"model": "tiny", "prompt": "hi"}), None))
    assert tokens.tokens == [104, 105] and tokens.count == 2
    text = asyncio.run(tokenization.create_detokenize(
        parse_openai_request("detokenize", {"model": "tiny", "tokens": [104, 105]}), None))
    assert text.prompt == "hi"


def test_a_body_vllm_refuses_is_a_validation_error():
    from fastapi.exceptions import RequestValidationError

    with pytest.raises(RequestValidationError):
        parse_openai_request("chat", {"model": "tiny", "messages": "not a list"})


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"", b'{"model": "m"',
                                  b"[" * 100_000 + b"]" * 100_000])
def test_a_body_that_is_not_json_is_refused_as_fastapi_refuses_it_for_vllm(body):
    from fastapi.exceptions import RequestValidationError

    with pytest.raises(RequestValidationError) as raised:
        parse_json_body(body)
    (problem,) = raised.value.errors()
    assert problem["type"] == "json_invalid" and problem["loc"][0] == "body"


def test_a_json_body_comes_back_as_it_is():
    assert parse_json_body(b'{"model": "m", "unknown": [1]}') == {"model": "m", "unknown": [1]}
    assert parse_json_body(b"[1]") == [1]  # not an object: vLLM's request model refuses it
