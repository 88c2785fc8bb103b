"""What pdserve checks of a request before vLLM's OpenAI layer sees it (router/protocol.py).

vLLM's own request models validate the body (tests/component/test_vllm_frontend.py); here:
a body that is not a JSON object is a 400, never a crash; the fields pdserve cannot honour
are refused by name when set to a value that counts, and pass when neutral; token ids
outside the vocabulary are a 400 before any engine sees them.
"""


import pytest

from router.errors import APIError
from router.protocol import NOT_HONOURED, check_token_ids, refuse_not_honoured

# A value for each field that changes the answer.
COUNTING = {
    "use_beam_search": True,
    "kv_transfer_params": {"do_remote_decode": True},
    "cache_salt": "salt",
    "priority": 5,
}


def test_every_field_not_honoured_has_a_counting_value_here():
    assert set(COUNTING) == set(NOT_HONOURED)


@pytest.mark.parametrize("field", sorted(NOT_HONOURED))
def test_a_field_not_honoured_is_refused_by_name_not_ignored(field):
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for value in (COUNTING[field], {"a value": "that changes the answer"}):
        with pytest.raises(APIError) as raised:
            refuse_not_honoured({**chat, field: value})
        error = raised.value
        assert (error.status, error.param, error.code) == (400, field, "unsupported_parameter")
        assert field in error.message


@pytest.mark.parametrize(("field", "value"), [
    (field, value) for field, values in NOT_HONOURED.items() for value in values
])
def test_the_neutral_values_are_accepted(field, value):
    refuse_not_honoured({"model": "m", "prompt": "hi", field: value})


def test_a_body_without_those_fields_is_accepted():
    refuse_not_honoured({"model": "m", "prompt": "hi", "n": 3, "logprobs": 2, "tools": []})


def test_true_is_not_a_neutral_one_nor_false_a_zero():
    with pytest.raises(APIError) as raised:
        refuse_not_honoured({"priority": False})  # 0 is neutral, false is not 0
    assert raised.value.param == "priority"
    with pytest.raises(APIError) as raised:
        refuse_not_honoured({"use_beam_search": 0})  # false is neutral, 0 is not false
    assert raised.value.param == "use_beam_search"


@pytest.mark.parametrize("value", ["x", {"do_remote_prefill": True}, None])
def test_a_vllm_xargs_key_the_engines_reserve_is_refused(value):
    """vLLM copies ``vllm_xargs`` into the engine's ``extra_args``, where the KV connector
    reads its handshake: a client's ``kv_transfer_params`` there would be taken as one."""
    with pytest.raises(APIError) as raised:
        refuse_not_honoured({"model": "m", "prompt": "hi",
                             "vllm_xargs": {"kv_transfer_params": value, "mine": 1}})
    assert raised.value.param == "vllm_xargs.kv_transfer_params"
    assert raised.value.status == 400


def test_other_vllm_xargs_pass():
    refuse_not_honoured({"model": "m", "prompt": "hi", "vllm_xargs": {"mine": 1}})
    refuse_not_honoured({"model": "m", "prompt": "hi", "vllm_xargs": "not an object"})


def test_a_float_equal_to_a_neutral_number_is_neutral():
    refuse_not_honoured({"priority": 0.0})


def test_token_ids_must_be_in_vocabulary():
    check_token_ids([0, 258], 259)
    check_token_ids([], 259)
    with pytest.raises(APIError, match="outside the vocabulary") as raised:
        check_token_ids([1, 259], 259)
    assert (raised.value.status, raised.value.param, raised.value.code) == (
        400, "prompt", "invalid_value")
    with pytest.raises(APIError):
        check_token_ids([-1], 259)


def test_a_body_that_is_not_an_object_is_left_to_vllms_models():
    for body in ([1, 2], "text", 42, None):
        refuse_not_honoured(body)  # no error here: vLLM's request model refuses it
