"""Limits on a request's body and fields, before any tokenizer sees it (router/limits.py)."""

from __future__ import annotations

import json

import pytest

from router.errors import APIError
from router.limits import (
    PerKeyConcurrency,
    check_body,
    check_declared_size,
    check_received_size,
)

LIMITS = {"max_stop_chars": 8, "max_user_chars": 5, "max_n": 4}


def refusal(data) -> APIError:
    with pytest.raises(APIError) as caught:
        check_body(data, **LIMITS)
    return caught.value


@pytest.mark.parametrize("declared", ["1025", "99999999999999999999"])
def test_a_declared_length_over_the_limit_is_413_before_reading(declared):
    with pytest.raises(APIError) as caught:
        check_declared_size(declared, 1024)
    assert caught.value.status == 413 and caught.value.code == "request_too_large"


@pytest.mark.parametrize("declared", [None, "1024", "0", "twelve"])
def test_a_length_within_the_limit_or_unknown_is_left_to_the_reader(declared):
    check_declared_size(declared, 1024)


def test_the_reader_refuses_once_the_limit_is_passed():
    check_received_size(1024, 1024)
    with pytest.raises(APIError) as caught:
        check_received_size(1025, 1024)
    assert caught.value.status == 413


@pytest.mark.parametrize("data, param", [
    ({"prompt": "a\ud800b"}, "prompt"),
    ({"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\udfff"}]},
     "messages[1].content"),
    ({"logit_bias": {"\ud800": 1}}, "logit_bias.\ud800"),
    ({"prompt": ["fine", ["deeper", "\ud83d"]]}, "prompt[1][1]"),
])
def test_a_lone_surrogate_anywhere_is_a_400_naming_where(data, param):
    error = refusal(json.loads(json.dumps(data)))
    assert (error.status, error.code, error.param) == (400, "invalid_value", param)


def test_a_surrogate_pair_is_one_character_and_fine():
    check_body(json.loads('{"prompt": "\\ud83d\\ude00"}'), **LIMITS)


@pytest.mark.parametrize("stop", ["", [""], ["ok", ""], "x" * 9, ["ok", "x" * 9]])
def test_empty_or_overlong_stop_strings_are_refused(stop):
    error = refusal({"stop": stop})
    assert (error.status, error.param) == (400, "stop")


@pytest.mark.parametrize("stop", [None, "ok", ["a", "x" * 8], [], 3])
def test_stop_strings_within_bounds_or_left_to_vllm(stop):
    check_body({"stop": stop}, **LIMITS)  # a non-string stop is vLLM's to refuse


def test_an_overlong_user_is_refused():
    check_body({"user": "abcde"}, **LIMITS)
    assert refusal({"user": "abcdef"}).param == "user"


def test_more_answers_than_max_n_are_refused():
    error = refusal({"n": 4096, "max_tokens": 2000})
    assert (error.status, error.param, error.code) == (400, "n", "invalid_value")
    assert "at most 4" in error.message
    for n in (1, 4, None, True, "many", 2.5):  # within bounds, or vLLM's to refuse
        check_body({"n": n}, **LIMITS)


def test_a_deep_body_is_walked_without_recursion():
    data: list = []
    for _ in range(50_000):
        data = [data]
    check_body({"prompt": data}, **LIMITS)


def test_each_key_has_its_own_limit_of_calls_at_once():
    calls = PerKeyConcurrency(2)
    assert calls.enter("a") and calls.enter("a")
    assert not calls.enter("a")  # refused, and not counted
    assert calls.enter("b")  # another key is not held back by "a"
    calls.leave("a")
    assert calls.enter("a") and not calls.enter("a")
    for key in ("a", "a", "b"):
        calls.leave(key)
    assert calls.enter("a") and calls.enter("a")  # nothing left counted against "a"
    assert calls.enter("b") and calls.enter("b") and not calls.enter("b")
