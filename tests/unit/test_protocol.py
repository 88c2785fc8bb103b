"""Request parsing and limits: every client mistake is a 400 naming the field."""

import json

import pytest

from router.errors import APIError
from router.protocol import (
    NOT_HONOURED,
    ChatCompletionRequest,
    CompletionRequest,
    check_token_ids,
    parse_request,
    resolve_max_tokens,
)


def parse(model_class, body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, model_class)


def error_of(model_class, body) -> APIError:
    with pytest.raises(APIError) as raised:
        parse(model_class, body)
    assert raised.value.status == 400
    return raised.value


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"\xff\xfe", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        ({"prompt": "hi"}, "model", "missing_required_parameter"),
        ({"model": "m"}, "prompt", "missing_required_parameter"),
        ({"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"model": "m", "prompt": "hi", "max_tokens": -3}, "max_tokens", "invalid_value"),
        ({"model": "m", "prompt": "hi", "max_tokens": "5"}, "max_tokens", "invalid_value"),
        ({"model": "m", "prompt": "hi", "temperature": 3}, "temperature", "invalid_value"),
        ({"model": "m", "prompt": "hi", "stream": "yes"}, "stream", "invalid_value"),
        ({"model": "m", "prompt": 42}, "prompt", "invalid_value"),
        ({"model": "m", "prompt": "hi", "n": 2}, "n", "unsupported_parameter"),
        ({"model": "m", "prompt": "hi", "logprobs": 3}, "logprobs", "unsupported_parameter"),
        ({"model": "m", "prompt": "hi", "echo": True}, "echo", "unsupported_parameter"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt", "unsupported_parameter"),
        ({"model": "m", "prompt": ""}, "prompt", "invalid_value"),
        ({"model": "m", "prompt": "hi", "stop": ["a"] * 5}, "stop", "invalid_value"),
    ],
)
def test_completion_errors(body, param, code):
    error = error_of(CompletionRequest, body)
    assert (error.param, error.code) == (param, code)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": "m", "messages": [{"role": "user", "content": 7}]}, "messages.0.content"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages.0.content"),
    ],
)
def test_chat_errors(body, param):
    assert error_of(ChatCompletionRequest, body).param == param


def test_valid_requests_parse():
    completion = parse(CompletionRequest, {"model": "m", "prompt": ["one"], "stop": "x",
                                           "user": "u", "unknown_field": 1})
    assert completion.single_prompt() == "one"
    assert completion.sampling(5).stop == ("x",)
    assert parse(CompletionRequest, {"model": "m", "prompt": [[5, 6]]}).single_prompt() == [5, 6]
    chat = parse(ChatCompletionRequest, {
        "model": "m", "max_tokens": 3, "max_completion_tokens": 9, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]}],
    })
    assert chat.requested_max_tokens() == 9
    assert chat.include_usage
    assert chat.template_messages() == [{"role": "user", "content": "ab"}]


def test_max_tokens_resolution():
    assert resolve_max_tokens(10, None, 100, 256) == 90  # default capped by the window
    assert resolve_max_tokens(10, None, 1000, 256) == 256
    assert resolve_max_tokens(10, 90, 100, 256) == 90
    with pytest.raises(APIError) as too_many:
        resolve_max_tokens(10, 91, 100, 256)
    assert too_many.value.code == "context_length_exceeded"
    with pytest.raises(APIError) as prompt_too_long:
        resolve_max_tokens(100, None, 100, 256)
    assert prompt_too_long.value.status == 400


def test_token_ids_must_be_in_vocabulary():
    check_token_ids([0, 258], 259)
    with pytest.raises(APIError, match="outside the vocabulary"):
        check_token_ids([259], 259)
    with pytest.raises(APIError):
        check_token_ids([-1], 259)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("field", sorted(NOT_HONOURED))
def test_a_field_not_honoured_is_refused_by_name_not_ignored(field):
    for model_class, body in ((ChatCompletionRequest, CHAT),
                              (CompletionRequest, {"model": "m", "prompt": "hi"})):
        if field in model_class.model_fields:
            continue  # parsed with its type (completions' echo): a dict is invalid_value
        error = error_of(model_class, {**body, field: {"a value": "that changes the answer"}})
        assert (error.status, error.param, error.code) == (400, field, "unsupported_parameter")


@pytest.mark.parametrize(("field", "value"), [
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", {"type": "function", "function": {"name": "f"}}),
    ("tool_choice", "required"),
    ("logit_bias", {"42": 100}),
    ("top_logprobs", 2),
    ("top_k", 5),
    ("echo", True),
    ("add_generation_prompt", False),
    ("skip_special_tokens", False),
])
def test_what_users_send_today_is_refused_rather_than_silently_ignored(field, value):
    error = error_of(ChatCompletionRequest, {**CHAT, field: value})
    assert (error.param, error.code) == (field, "unsupported_parameter")


@pytest.mark.parametrize(("field", "value"), [
    ("response_format", {"type": "text"}), ("tools", []), ("tool_choice", "none"),
    ("tool_choice", "auto"), ("logit_bias", {}), ("top_k", -1), ("min_p", 0.0),
    ("repetition_penalty", 1.0), ("echo", False), ("parallel_tool_calls", True),
    ("stream_options", {"include_usage": True, "continuous_usage_stats": False}),
])
def test_values_that_leave_the_answer_unchanged_are_accepted(field, value):
    assert parse(ChatCompletionRequest, {**CHAT, field: value}).model == "m"


def test_tool_calls_in_the_conversation_and_continuous_usage_are_refused():
    history = {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]}]}
    assert error_of(ChatCompletionRequest, history).param == "messages.1.tool_calls"
    usage = {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert error_of(ChatCompletionRequest, usage).param == "stream_options.continuous_usage_stats"


def test_true_is_not_a_neutral_one_nor_false_a_zero():
    assert error_of(ChatCompletionRequest, {**CHAT, "best_of": True}).param == "best_of"
    assert error_of(ChatCompletionRequest, {**CHAT, "min_tokens": False}).param == "min_tokens"


def test_no_refused_field_is_one_the_router_parses():
    parsed = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    assert not parsed & (set(NOT_HONOURED) - {"echo"})  # completions parse echo to refuse it
