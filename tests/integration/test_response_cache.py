"""The response cache on the real stack: two router replicas sharing a real Redis server.

The module deploys the test cluster's config with ``router.response_cache`` on (store:
redis) and two router replicas (`pdserve deploy`: the engines keep running), and deploys
the plain config back at its end. What it checks, through the HTTP API:

- a greedy request is computed once: the next identical one, streamed or whole, on either
  router replica, is a hit with the same tokens, a fresh id and no engine work;
- sampled requests bypass it; another API key's identical request is a miss;
- identical requests at once compute once per router replica (single flight);
- hits are counted (hit ratio, saved tokens) and kept out of the latency histograms;
- with Redis killed, requests are still answered (misses), never failed.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import httpx
import pytest
import yaml

from tests.integration import prometheus
from tests.integration.conftest import CONFIG_PATH, MODEL, engine_stats, wait_until_idle
from tests.integration.openai_http import ADMIN, generate
from tests.integration.test_metrics import settled_scrape
from tests.integration.test_rollout import deploy
from tools.redis_local import redis_server

pytestmark = pytest.mark.integration

ROUTER_REPLICAS = 2
MAX_TOKENS = 12
DEPLOY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cached(pdserve, tmp_path_factory):
    """The cluster with the response cache on over Redis: (base URL, Redis process)."""
    directory = tmp_path_factory.mktemp("response-cache")
    with redis_server(directory) as (url, server):
        changed = yaml.safe_load(CONFIG_PATH.read_text())
        changed["router"]["replicas"] = ROUTER_REPLICAS
        changed["router"]["response_cache"] = {"enabled": True, "store": "redis",
                                               "redis_url": url}
        changed_path = directory / "cached.yaml"
        changed_path.write_text(yaml.safe_dump(changed))
        try:
            deploy(changed_path)
            _wait_for_router_replicas(pdserve, ROUTER_REPLICAS)
            yield pdserve, server
        finally:
            deploy(CONFIG_PATH)
            _wait_for_cache_off(pdserve)


def _cache_state(base_url: str) -> dict:
    response = httpx.get(f"{base_url}/admin/cache", headers=ADMIN, timeout=30)
    response.raise_for_status()
    return response.json()


def _wait_for_router_replicas(base_url: str, count: int) -> None:
    """Until ``count`` distinct router replicas, all with the cache on, have answered."""
    seen: set[str] = set()
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while len(seen) < count:
        state = _cache_state(base_url)
        if state["enabled"]:
            seen.add(state["router_replica"])
        assert time.monotonic() < deadline, f"router replicas with the cache: {seen}"


def _wait_for_cache_off(base_url: str) -> None:
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while _cache_state(base_url)["enabled"]:
        assert time.monotonic() < deadline, "the plain config's router never took over"
        time.sleep(0.5)


def fresh_prompt() -> str:
    return f"cache me {uuid.uuid4().hex[:8]}"


def ask(base_url: str, prompt: str, *, stream: bool = False, kind: str = "chat", **params):
    return generate(base_url, kind, MODEL, prompt, stream=stream, max_tokens=MAX_TOKENS,
                    **{"temperature": 0, **params})


def decode_requests(base_url: str) -> int:
    return engine_stats(base_url)["decode"]["requests_finished"]


def test_a_greedy_answer_is_computed_once_then_replayed_streamed_or_whole(cached):
    base_url, _ = cached
    prompt = fresh_prompt()
    wait_until_idle(base_url)
    before = decode_requests(base_url)
    first = ask(base_url, prompt)
    assert first.status == 200 and first.headers["x-pdserve-cache"] == "miss"
    computed = decode_requests(base_url)
    assert computed == before + 1
    replays = [ask(base_url, prompt) for _ in range(3)] + [
        ask(base_url, prompt, stream=True) for _ in range(3)]
    for replay in replays:
        assert replay.status == 200 and replay.headers["x-pdserve-cache"] == "hit"
        assert replay.token_ids == first.token_ids and replay.text == first.text
        assert replay.finish_reason == first.finish_reason
        assert replay.usage["completion_tokens"] == first.usage["completion_tokens"]
        assert replay.headers["x-request-id"] != first.headers["x-request-id"]
    assert decode_requests(base_url) == computed          # no engine computed a hit
    # the answer stored by one router replica is served by the other (Redis)
    routers = {replay.headers["x-pdserve-router"] for replay in [first, *replays]}
    deadline = time.monotonic() + 60
    while len(routers) < ROUTER_REPLICAS:
        assert time.monotonic() < deadline, f"only router replicas {routers} answered"
        replay = ask(base_url, prompt)
        assert replay.headers["x-pdserve-cache"] == "hit"
        routers.add(replay.headers["x-pdserve-router"])


def test_a_completion_and_a_chat_do_not_share_an_entry_and_both_are_cached(cached):
    base_url, _ = cached
    prompt = fresh_prompt()
    chat, completion = ask(base_url, prompt), ask(base_url, prompt, kind="completion")
    assert chat.headers["x-pdserve-cache"] == completion.headers["x-pdserve-cache"] == "miss"
    again = ask(base_url, prompt, kind="completion", stream=True)
    assert again.headers["x-pdserve-cache"] == "hit" and again.text == completion.text


def test_a_sampled_request_bypasses_the_cache_and_a_seeded_one_is_cached(cached):
    base_url, _ = cached
    prompt = fresh_prompt()
    sampled = [ask(base_url, prompt, temperature=0.9) for _ in range(2)]
    assert [r.headers["x-pdserve-cache"] for r in sampled] == ["bypass", "bypass"]
    seeded = [ask(base_url, prompt, temperature=0.9, seed=11) for _ in range(2)]
    assert [r.headers["x-pdserve-cache"] for r in seeded] == ["miss", "hit"]
    assert seeded[0].token_ids == seeded[1].token_ids


def test_another_api_keys_identical_request_is_computed_for_it(cached):
    base_url, _ = cached
    body = {"model": MODEL, "messages": [{"role": "user", "content": fresh_prompt()}],
            "max_tokens": MAX_TOKENS, "temperature": 0}

    def as_key(key: str) -> str:
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120,
                              headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        return response.headers["x-pdserve-cache"]

    assert [as_key("key-a"), as_key("key-b"), as_key("key-a"), as_key("key-b")] == [
        "miss", "miss", "hit", "hit"]


def test_identical_requests_at_once_compute_at_most_once_per_router_replica(cached):
    base_url, _ = cached
    prompt, count = fresh_prompt(), 8
    wait_until_idle(base_url)
    before = decode_requests(base_url)
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda _: ask(base_url, prompt, stream=True), range(count)))
    assert all(answer.status == 200 for answer in answers)
    assert len({tuple(answer.token_ids) for answer in answers}) == 1
    results = [answer.headers["x-pdserve-cache"] for answer in answers]
    assert results.count("miss") <= ROUTER_REPLICAS
    assert results.count("miss") + results.count("hit") == count
    assert decode_requests(base_url) - before == results.count("miss")


def test_hits_are_counted_and_kept_out_of_the_latency_histograms(cached):
    base_url, _ = cached
    names = ("ray_pdserve_response_cache_requests_total", "ray_pdserve_requests_total",
             "ray_pdserve_time_to_first_token_seconds_count")
    before = settled_scrape(*names)
    prompt, hits = fresh_prompt(), 4
    first = ask(base_url, prompt)
    for _ in range(hits):
        assert ask(base_url, prompt).headers["x-pdserve-cache"] == "hit"
    after = settled_scrape(*names)

    def grew(name: str, **labels: str) -> float:
        return (prometheus.total(after, name, **labels)
                - prometheus.total(before, name, **labels))

    assert grew("ray_pdserve_response_cache_requests_total", result="hit") == hits
    assert grew("ray_pdserve_response_cache_requests_total", result="miss") == 1
    assert grew("ray_pdserve_requests_total", path="cache", outcome="ok") == hits
    assert grew("ray_pdserve_time_to_first_token_seconds_count") == 1   # the miss only
    assert grew("ray_pdserve_response_cache_saved_tokens_total", kind="generation") == (
        hits * first.usage["completion_tokens"])
    assert grew("ray_pdserve_response_cache_saved_tokens_total", kind="prompt") == (
        hits * first.usage["prompt_tokens"])


def test_with_redis_killed_requests_are_answered_as_misses(cached):
    base_url, server = cached
    prompt = fresh_prompt()
    assert ask(base_url, prompt).headers["x-pdserve-cache"] == "miss"
    server.kill()
    server.wait(timeout=10)
    for _ in range(3):
        answer = ask(base_url, prompt, stream=True)
        assert answer.status == 200 and answer.headers["x-pdserve-cache"] == "miss"
        assert answer.finish_reason in ("stop", "length")
