"""Serving behaviour on the real stack: clients, concurrency, bad input, disconnects."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import httpx
import openai
import psutil
import pytest

from router.sse import sse_lines, sse_lines_async
from tests.integration.conftest import (
    CONFIG,
    MODEL,
    engine_stats,
    wait_for,
    wait_until_idle,
)
from tests.integration.openai_http import ADMIN, API_KEY, AUTH, generate
from tests.integration.poisons import bad_requests
from tools.cluster_processes import replicas

pytestmark = pytest.mark.integration


def test_official_openai_client_streams_chat(pdserve):
    client = openai.OpenAI(base_url=f"{pdserve}/v1", api_key=API_KEY, max_retries=0)
    assert MODEL in [model.id for model in client.models.list()]
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a haiku about tea."}],
        max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert content and finish in (["length"], ["stop"])
    assert chunks[-1].usage.completion_tokens <= 24
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model",
                                       messages=[{"role": "user", "content": "x"}])


def test_sixteen_concurrent_streams_complete_and_free_their_kv(pdserve):
    before = wait_until_idle(pdserve)
    lengths = [16 + 3 * i for i in range(16)]

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int, str | None]:
        body = {"model": MODEL, "prompt": f"Request {i}: " + "tell me more " * (5 + 7 * i),
                "max_tokens": lengths[i], "ignore_eos": True, "stream": True,
                "return_token_ids": True, "stream_options": {"include_usage": True}}
        tokens, usage, finish = 0, None, None
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in sse_lines_async(response.aiter_bytes()):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event["choices"]:
                    tokens += len(choice["token_ids"])
                    finish = choice["finish_reason"] or finish
                usage = event.get("usage") or usage
        assert usage["completion_tokens"] == tokens
        return tokens, lengths[i], finish

    async def all_of_them():
        async with httpx.AsyncClient(base_url=pdserve, timeout=300, headers=AUTH) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    results = asyncio.run(all_of_them())
    assert [got for got, _, _ in results] == lengths
    assert {finish for _, _, finish in results} == {"length"}

    after = wait_until_idle(pdserve)  # both engines idle, no KV block held
    for pool in ("prefill", "decode"):
        finished = after[pool]["requests_finished"] - before[pool]["requests_finished"]
        assert finished == 16, f"{pool} finished {finished} requests, expected 16"
    generated = after["decode"]["generation_tokens"] - before["decode"]["generation_tokens"]
    assert generated == sum(lengths)


@pytest.mark.parametrize(("path", "body", "status", "ours"), bad_requests(MODEL))
def test_bad_input_gets_an_openai_error_and_the_service_keeps_serving(
    pdserve, path, body, status, ours
):
    cores_before = engine_cores()
    assert cores_before, "no EngineCore found"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{pdserve}{path}", content=content,
                          headers={"content-type": "application/json", **AUTH}, timeout=60)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    if ours is not None:
        assert (error["code"], error["param"]) == ours
    assert error["message"] and error["type"] and "Traceback" not in response.text
    healthy = generate(pdserve, "completion", MODEL, "still there?", stream=False, max_tokens=4)
    assert healthy.status == 200 and healthy.usage["completion_tokens"] >= 1
    # No engine was restarted, and none is left with its stall clock running (which would
    # have its health check kill it once engine.stall_timeout_s passed).
    assert engine_cores() == cores_before, "an engine was replaced"
    wait_for(lambda: all(pool["engine_stalled_s"] == 0
                         for pool in engine_stats(pdserve).values()),
             "both engines' stall readings back to 0", 10,
             lambda: {pool: stats["engine_stalled_s"]
                      for pool, stats in engine_stats(pdserve).items()})


@pytest.mark.parametrize("prompt", ["short: decode-local", "long " * 60], ids=["local", "pd"])
def test_a_request_the_engine_refuses_leaves_its_engines_unstalled(pdserve, prompt):
    """A token id outside the vocabulary in ``logit_bias`` is refused with vLLM's own 400,
    by the router running the engines' input checks (router/vllm_frontend.py). Refused
    once by the decode engine itself, the request had left its stall clock running, and
    the health check killed a healthy engine once ``engine.stall_timeout_s`` passed."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "logit_bias": {"999999": 5}}
    response = httpx.post(f"{pdserve}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 400, response.text
    assert "logit_bias" in response.json()["error"]["message"]
    wait_for(lambda: all(pool["engine_stalled_s"] == 0
                         for pool in engine_stats(pdserve).values()),
             "both engines' stall readings back to 0", 10,
             lambda: {pool: stats["engine_stalled_s"]
                      for pool, stats in engine_stats(pdserve).items()})
    wait_until_idle(pdserve)  # and a prefilled prompt's blocks were given back


@pytest.mark.parametrize("words", [6, 40], ids=["local", "pd"])
def test_one_keys_cached_prompt_is_never_another_keys(pdserve, words):
    """Each API key's prompts are cached for it alone (vLLM's cache_salt): a hit on
    another key's blocks would tell, in ``cached_tokens``, what that key sent."""
    prompt = " ".join(f"tenant{index}x{words}" for index in range(words))

    def cached_tokens(key: str) -> int:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        response = httpx.post(f"{pdserve}/v1/completions", json=body, timeout=60,
                              headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached_tokens("key-a")
    assert cached_tokens("key-a") > 0     # the key's own prompt is in the cache
    assert cached_tokens("key-b") == 0    # and no other key reads it there
    assert cached_tokens("key-b") > 0     # while its own copy is there for it


def test_an_undeclared_oversized_body_is_refused_while_it_arrives(pdserve):
    def chunks():  # no Content-Length: the router counts what arrives
        yield b'{"model": "tiny-llama", "prompt": "'
        for _ in range(48):
            yield b"x" * 65536
        yield b'"}'

    response = httpx.post(f"{pdserve}/v1/completions", content=chunks(), timeout=60,
                          headers={"content-type": "application/json", **AUTH})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_body_that_does_not_arrive_in_time_is_answered_408_at_its_deadline(pdserve):
    """A client that declares a body and sends a few bytes of it, then nothing: answered
    408 once ``router.deadlines.body_s`` passed (3 s in this config), never held open."""
    deadline_s = CONFIG.router.deadlines.body_s
    host, port = pdserve.removeprefix("http://").split(":")
    client = http.client.HTTPConnection(host, int(port), timeout=deadline_s + 60)
    try:
        client.putrequest("POST", "/v1/completions")
        for name, value in {**AUTH, "Content-Type": "application/json",
                            "Content-Length": "1000"}.items():
            client.putheader(name, value)
        client.endheaders(message_body=b'{"model": "tiny-llama", "pro')
        started = time.monotonic()
        response = client.getresponse()  # while the rest of the body never comes
        body = json.loads(response.read())
        waited = time.monotonic() - started
    finally:
        client.close()
    assert response.status == 408, body
    assert body["error"]["code"] == "request_timeout"
    assert waited >= deadline_s * 0.9  # not refused before the deadline
    healthy = generate(pdserve, "completion", MODEL, "still there?", stream=False, max_tokens=4)
    assert healthy.status == 200


def test_one_keys_tokenize_calls_at_once_are_bounded_and_anothers_are_not(pdserve):
    """``/tokenize`` takes no admission budget; one key may have
    ``router.limits.max_tokenizing_per_key`` calls at once in a router replica, counted
    from their headers (a slow upload is a call in progress). The next is 429 with
    Retry-After, another key's call is answered, and once the held calls end (408 at
    ``router.deadlines.body_s``) the first key's calls are answered again."""
    limit = CONFIG.router.limits.max_tokenizing_per_key
    host, port = pdserve.removeprefix("http://").split(":")
    body = {"model": MODEL, "prompt": "count me"}

    def tokenize(key: str) -> httpx.Response:
        return httpx.post(f"{pdserve}/tokenize", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})

    held = []
    for _ in range(limit):
        client = http.client.HTTPConnection(host, int(port), timeout=60)
        client.putrequest("POST", "/tokenize")
        for name, value in {**AUTH, "Content-Type": "application/json",
                            "Content-Length": "1000"}.items():
            client.putheader(name, value)
        client.endheaders(message_body=b'{"model": "tiny-llama", "pro')
        held.append(client)
    try:
        wait_for(lambda: tokenize(API_KEY).status_code == 429,
                 f"a call past the key's {limit} held ones refused", 10)
        refused = tokenize(API_KEY)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_concurrent_calls"
        assert tokenize("key-a").status_code == 200  # another key is not held back
        for client in held:
            assert client.getresponse().status == 408
    finally:
        for client in held:
            client.close()
    assert tokenize(API_KEY).status_code == 200  # each held call gave its place back


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v1/chat/completions", 405), ("DELETE", "/v1/models", 405),
    ("GET", "/v2/anything", 404)])
def test_the_frameworks_own_errors_are_openai_shaped(pdserve, method, path, status):
    response = httpx.request(method, f"{pdserve}{path}", headers=AUTH, timeout=30)
    assert response.status_code == status
    assert set(response.json()["error"]) >= {"message", "type", "param", "code"}


# Serve's proxy lets a request run on after its client left when asked to by this header
# (meant for a trusted balancer in front of it); router/proxy_edge.py drops it.
@pytest.mark.parametrize("hint", [{}, {"x-request-disconnect-disabled": "?1"}],
                         ids=["plain", "asking-to-run-on"])
def test_client_disconnect_aborts_the_request_on_both_engines(pdserve, hint):
    before = wait_until_idle(pdserve)
    body = {"model": MODEL, "prompt": "go on forever " * 40, "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=pdserve, timeout=60, headers={**AUTH, **hint}) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = sse_lines(response.iter_bytes())
        received = [next(lines) for _ in range(6)]
        assert all(line.startswith("data: ") or not line for line in received)
    # leaving the block closed the connection mid-stream
    after = wait_until_idle(pdserve, timeout_s=60)
    generated = after["decode"]["generation_tokens"] - before["decode"]["generation_tokens"]
    assert 0 < generated < 4000, "the aborted request must stop generating"
    # The engines keep serving.
    assert generate(pdserve, "chat", MODEL, "hello again", stream=True, max_tokens=4).status == 200
    stats = engine_stats(pdserve)
    assert stats["decode"]["num_running"] == 0
    # the router routes to every replica of each pool (what the fault suite waits for)
    assert {pool: stats[pool]["routed_replicas"] for pool in ("prefill", "decode")} == {
        "prefill": CONFIG.prefill.replicas, "decode": CONFIG.decode.replicas}


MAX_UNREAD = 7500


def test_a_client_that_stops_reading_is_taken_for_gone_and_its_request_ended(pdserve):
    """A client that sends a stream request and then reads nothing (its receive window
    a few KB): once a chunk waited router.deadlines.client_read_s (3 s here) for it,
    Serve's proxy ends the request as if the client had left (router/proxy_edge.py),
    instead of holding its events and an engine for a reader that never comes."""
    before = wait_until_idle(pdserve)
    # ~7 MB of events (20 logprobs a token): well past what the kernel and the proxy's
    # transport buffer for a connection before its writes wait for the reader
    body = json.dumps({"model": MODEL, "prompt": "never read " * 20, "max_tokens": MAX_UNREAD,
                       "ignore_eos": True, "logprobs": 20, "stream": True}).encode()
    host, port = CONFIG.router.host, CONFIG.router.port
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
        client.connect((host, port))
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\n"
                       b"Authorization: %s\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (
                           host.encode(), AUTH["Authorization"].encode(), len(body), body))
        wait_for(lambda: engine_stats(pdserve)["decode"]["num_running"] == 1,
                 "the stream running", 60)
        # ended while the client is still connected, reading nothing
        after = wait_until_idle(pdserve, timeout_s=90)
    generated = after["decode"]["generation_tokens"] - before["decode"]["generation_tokens"]
    assert 0 < generated < MAX_UNREAD, "the unread stream must stop generating"
    admission = httpx.get(f"{pdserve}/admin/admission", headers=ADMIN, timeout=10).json()
    assert (admission["running"], admission["tokens_in_flight"]) == (0, 0)


def test_a_streamed_event_is_one_line_whatever_its_text_holds(pdserve):
    """U+2028, U+2029 and U+0085 are line breaks to str.splitlines (httpx's iter_lines)
    and unescaped in vLLM's JSON; the router escapes them (router/sse.py). Echo puts them
    in the stream's text deterministically."""
    prompt = "line\u2028separator\x85next\u2029paragraph"
    body = {"model": MODEL, "prompt": prompt, "echo": True, "max_tokens": 2, "stream": True}
    response = httpx.post(f"{pdserve}/v1/completions", headers=AUTH, json=body, timeout=60)
    assert response.status_code == 200
    lines = [line for line in response.text.split("\n") if line]  # the router writes LF
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") and len(line.splitlines()) == 1 for line in lines)
    text = "".join(choice["text"] for line in lines[:-1]
                   for choice in json.loads(line[len("data: "):])["choices"])
    assert text.startswith(prompt)


def test_health_and_models(pdserve):
    assert httpx.get(f"{pdserve}/health").json() == {"status": "ok"}
    models = httpx.get(f"{pdserve}/v1/models", headers=AUTH).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == list(CONFIG.served_models)
    wrong_method = httpx.get(f"{pdserve}/v1/completions")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


# ---- seeded sampling over a chunked prefill (cluster/engine/seeded_cpu.py) ----------------

# Tokens the decode engine computes in one step: the pool's cap, else vLLM 0.32's default
# for an AsyncLLM (SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS).
DECODE_STEP_TOKENS = (CONFIG.pool(CONFIG.model.version, "decode").max_num_batched_tokens
                      or CONFIG.engine.max_num_batched_tokens or 2048)


def chunked_prompt(tag: str) -> str:
    """Some 2,500 tokens (one a byte) of distinct words: the decode engine prefills it in
    chunks, each of which samples a token it throws away."""
    prompt = " ".join(f"{tag}{i}" for i in range(2_500 // (len(tag) + 4)))
    assert DECODE_STEP_TOKENS < len(prompt.encode()) < 2 * DECODE_STEP_TOKENS + 500
    return prompt


def decode_engine_cores() -> set[int]:
    """The EngineCore processes of the primary version's decode replicas."""
    return engine_cores(pools=("decode",))


def engine_cores(pools=("prefill", "decode")) -> set[int]:
    """The EngineCore processes of the primary version's replicas of ``pools``."""
    return {core.pid for pool in pools
            for _, cores in replicas(f"{pool}-{CONFIG.model.version}") for core in cores}


def test_a_seeded_poison_prompt_prefilled_in_chunks_answers_and_its_engine_lives(pdserve):
    """vLLM 0.32 rewinds a seeded generator after a prefill chunk's discarded sample by an
    offset a CPU generator does not have: the decode engine died on this request (n > 1:
    the decode engine prefills the prompt itself)."""
    cores = decode_engine_cores()
    assert cores, "no decode EngineCore found"
    body = {"model": MODEL, "prompt": chunked_prompt("poison"), "temperature": 1.0,
            "seed": 5, "n": 2, "max_tokens": 8, "ignore_eos": True}
    answers = []
    for _ in range(2):  # the second prompt comes partly from the decode engine's cache
        response = httpx.post(f"{pdserve}/v1/completions", json=body, headers=AUTH,
                              timeout=300)
        assert response.status_code == 200, response.text
        answers.append([choice["text"] for choice in response.json()["choices"]])
    assert answers[0] == answers[1] and len(answers[0]) == 2
    assert decode_engine_cores() == cores, "the decode engine was replaced"
    assert all(psutil.pid_exists(pid) for pid in cores)


def test_a_seeded_answer_is_the_same_decode_local_and_disaggregated(pdserve):
    """Disaggregated (the prefill engine computes the prompt) and decode-local (prompt
    logprobs: the decode engine prefills it itself, in chunks, never reading its cache):
    the decode engine's first kept sample starts from the seed either way. In this order,
    since a prompt the decode engine holds may be kept local."""
    prompt = chunked_prompt("seeded")
    answers = {}
    for path, extra in (("pd", {}), ("local", {"prompt_logprobs": 0})):
        before = wait_until_idle(pdserve)["prefill"]["requests_finished"]
        answer = generate(pdserve, "completion", MODEL, prompt, stream=False, max_tokens=8,
                          temperature=1.0, seed=5, ignore_eos=True, **extra)
        assert answer.status == 200, answer.error
        prefilled = wait_until_idle(pdserve)["prefill"]["requests_finished"] - before
        assert prefilled == (path == "pd"), f"{path}: the prefill pool ran {prefilled}"
        answers[path] = answer.token_ids
    assert len(answers["local"]) == 8
    assert answers["local"] == answers["pd"]
