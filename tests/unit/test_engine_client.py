"""The engine client's pure parts (router/engine_client.py): ids and the choice of path.

``generate`` imports vLLM, so it is tested in tests/component/test_engine_client.py; here:
vLLM's request ids lead back to the router's own, and each request takes the path its
sampling allows (``n`` > 1 and prompt logprobs are prefilled by the decode engine, the
rest by prompt length against the threshold).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from router.disaggregation import PathChoice
from router.engine_client import PDEngineClient, request_key

THRESHOLD = 16


def client(threshold: int = THRESHOLD, decode_cache=None) -> PDEngineClient:
    model_config = SimpleNamespace(get_vocab_size=lambda: 259, max_model_len=1024)
    vllm_config = SimpleNamespace(model_config=model_config)
    return PDEngineClient(vllm_config, renderer="renderer", flow="flow",
                          disaggregation_threshold=threshold, decode_cache=decode_cache)


class HeldHead:
    """A decode pool's belief in which ``replica`` holds the first ``tokens`` of a prompt."""

    def __init__(self, replica: str | None, tokens: int):
        self.answer = (replica, tokens)
        self.asked = 0

    def holder(self, token_ids):
        self.asked += 1
        return self.answer


def sampling(n: int = 1, prompt_logprobs: int | None = None) -> SimpleNamespace:
    """What ``route`` reads of vLLM's ``SamplingParams``."""
    return SimpleNamespace(n=n, prompt_logprobs=prompt_logprobs)


@pytest.mark.parametrize(("vllm_id", "key"), [
    ("chatcmpl-0123abcd", "0123abcd"),       # a chat completion
    ("cmpl-0123abcd-0", "0123abcd"),         # the first prompt of a completion
    ("cmpl-0123abcd-11", "0123abcd"),        # a later prompt of a batch
])
def test_vllms_request_ids_lead_back_to_the_routers_key(vllm_id, key):
    assert request_key(vllm_id) == key


@pytest.mark.parametrize(("prompt_tokens", "route"), [
    (1, "decode_local"), (THRESHOLD - 1, "decode_local"),
    (THRESHOLD, "disaggregated"), (500, "disaggregated"),
])
def test_a_plain_request_is_routed_by_prompt_length(prompt_tokens, route):
    assert client().route(list(range(prompt_tokens)), sampling()) == PathChoice(route)


def test_a_threshold_of_zero_disaggregates_every_plain_request():
    assert client(threshold=0).route([1], sampling()) == PathChoice("disaggregated")


@pytest.mark.parametrize("params", [
    sampling(n=2),                       # each choice would pull blocks freed after the first
    sampling(prompt_logprobs=0),         # the decode engine recomputes the prompt anyway
    sampling(prompt_logprobs=5),
    sampling(n=3, prompt_logprobs=1),
])
def test_what_the_prefill_pool_cannot_serve_is_prefilled_by_the_decode_engine(params):
    long_prompt = list(range(10 * THRESHOLD))
    assert client().route(long_prompt, params) == PathChoice("decode_local")


@pytest.mark.parametrize(("held", "choice"), [
    (0, PathChoice("disaggregated")),
    (10 * THRESHOLD - THRESHOLD, PathChoice("disaggregated")),        # the rest is 16
    (10 * THRESHOLD - THRESHOLD + 1, PathChoice("decode_local", "d1")),  # the rest is 15
    (10 * THRESHOLD, PathChoice("decode_local", "d1")),    # it still computes the last one
])
def test_a_long_prompt_whose_head_a_decode_replica_holds_goes_there_by_what_it_lacks(held,
                                                                                      choice):
    assert client(decode_cache=HeldHead("d1", held)).route(
        list(range(10 * THRESHOLD)), sampling()) == choice


def test_the_decode_cache_is_not_asked_when_the_prompt_alone_decides():
    belief = HeldHead("d1", 10 * THRESHOLD)
    assert client(decode_cache=belief).route([1, 2], sampling()) == PathChoice("decode_local")
    assert client(threshold=0, decode_cache=belief).route(
        list(range(10 * THRESHOLD)), sampling()) == PathChoice("disaggregated")
    assert belief.asked == 0


def test_it_offers_what_vllms_serving_classes_read():
    engine = client()
    assert engine.model_config.max_model_len == 1024
    assert engine.renderer == "renderer" and engine.flow == "flow"
    assert engine.errored is False and engine.input_processor is None
    assert isinstance(engine.dead_error, BaseException)
    assert engine.check_admission(2, "chatcmpl-x") is None  # admission waits for generate
    asyncio.run(engine.notify_kv_transfer_request_rejected("anything"))


def test_a_request_is_found_while_registered_and_unregistering_twice_is_harmless():
    engine = client()
    lifecycle = object()
    engine.register("0123abcd", lifecycle)
    assert engine._requests[request_key("cmpl-0123abcd-0")] is lifecycle
    engine.unregister("0123abcd")
    engine.unregister("0123abcd")
    assert engine._requests == {}


def test_a_fault_is_noted_on_the_request_a_retry_id_leads_back_to():
    engine = client()
    noted = []
    engine.register("0123abcd", SimpleNamespace(faulted=lambda: noted.append("fault")))
    engine.note_fault("cmpl-0123abcd-0-retry1")   # a retry's engine request id
    engine.note_fault("chatcmpl-0123abcd")
    engine.note_fault("chatcmpl-ffff0000")          # no longer registered: nothing to note
    assert noted == ["fault", "fault"]
