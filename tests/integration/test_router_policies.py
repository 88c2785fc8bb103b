"""Router policies on the real stack: per-request disaggregation and admission control."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from router.replica_routers import ROUTING_STATS_PERIOD_S
from tests.integration.conftest import CONFIG, MODEL, wait_until_idle
from tests.integration.openai_http import ADMIN, generate

pytestmark = pytest.mark.integration

THRESHOLD = CONFIG.router.disaggregation_threshold_tokens


def test_short_prompts_skip_the_prefill_pool_and_long_ones_use_it(pdserve):
    before = wait_until_idle(pdserve)
    short = generate(pdserve, "completion", MODEL, "tiny prompt", stream=False, max_tokens=4)
    assert short.status == 200 and len(short.prompt_token_ids) < THRESHOLD
    middle = wait_until_idle(pdserve)
    assert middle["prefill"]["requests_finished"] == before["prefill"]["requests_finished"]
    computed = middle["decode"]["prompt_tokens_computed"] - before["decode"][
        "prompt_tokens_computed"]
    assert computed == len(short.prompt_token_ids)  # the decode engine prefilled it

    long = generate(pdserve, "completion", MODEL, "a longer prompt " * 20, stream=False,
                    max_tokens=4)
    assert long.status == 200 and len(long.prompt_token_ids) >= THRESHOLD
    after = wait_until_idle(pdserve)
    assert after["prefill"]["requests_finished"] == middle["prefill"]["requests_finished"] + 1
    assert (after["decode"]["prompt_tokens_transferred"]
            > middle["decode"]["prompt_tokens_transferred"])


HOLD_TOKENS = 7000  # decode steps of each budget holder: far longer than the refusals take
OVER_SHARE_TOKENS = 1000  # the two holders and this fit the budget, not key A's share
KEY_A = {"Authorization": "Bearer key-a"}
KEY_B = {"Authorization": "Bearer key-b"}


def test_over_budget_load_is_queued_or_refused_while_admitted_requests_finish(pdserve):
    """Budget 20,000 tokens, queue of 2, 6 s wait; each of key A's requests may hold
    ~7,200 tokens (prompt plus max_tokens), so two fit and a third does not. A key's
    running requests may hold 15,000 (max_running_share_per_key 0.75).

    Two of A's requests take the budget. Then three more of A's and a small one of key B's
    are sent at once: two of A's wait and time out (503), one finds the queue full (429),
    whichever order they arrive in, and B's fits and is served during the flood. The two
    holders then finish with every token and the budget is whole again.

    Nothing here waits a fixed time: the test waits for the router's admission state, and
    the overflow goes out in one burst, because on two shared cores a client or proxy can
    stall for seconds between requests. What is left to chance is that the holders outlast
    the 6 s wait: 7,000 decode steps take 14 s even at 2 ms a step, ~50 s here.
    """
    wait_until_idle(pdserve)
    admission = CONFIG.router.admission
    assert admission.max_queue == 2 and admission.max_queue_per_key == 2
    outcome = asyncio.run(_flood_from_key_a(pdserve))

    holders, held = outcome["holders"], outcome["held"]
    prompt_tokens = [usage["prompt_tokens"] for _, usage in holders]
    cost = [tokens + HOLD_TOKENS for tokens in prompt_tokens]
    assert 2 * max(cost) <= admission.token_budget < 3 * min(cost)
    # the budget holds exactly the two holders' worst case
    assert (held["running"], held["queued"], held["tokens_in_flight"]) == (2, 0, sum(cost))
    for status, usage in holders:
        assert status == 200 and usage["completion_tokens"] == HOLD_TOKENS
    refusals = sorted((r.status_code, r.json()["error"]["code"], r.json()["error"]["type"],
                       r.headers["retry-after"]) for r in outcome["overflow"])
    retry_after = str(admission.retry_after_s)
    assert refusals == [(429, "queue_full", "overloaded_error", retry_after),
                        (503, "queue_timeout", "overloaded_error", retry_after),
                        (503, "queue_timeout", "overloaded_error", retry_after)]
    # the other key was served during the flood
    b_response = outcome["other_key"]
    assert b_response.status_code == 200
    assert b_response.json()["usage"]["completion_tokens"] == 8
    # the refused left nothing behind; the holders were still running then
    assert (outcome["after_refusals"]["running"], outcome["after_refusals"]["queued"]) == (2, 0)
    # running requests count against a key's share (max_running_share_per_key): key A's
    # next request waited, and timed out, while the budget had room for it
    share = admission.max_running_share_per_key * admission.token_budget
    over = outcome["over_share"]
    assert sum(cost) + OVER_SHARE_TOKENS <= admission.token_budget
    assert sum(cost) <= share < sum(cost) + OVER_SHARE_TOKENS
    assert (over.status_code, over.json()["error"]["code"]) == (503, "queue_timeout")
    # the budget was given back: nothing in flight, and the service admits again
    assert (outcome["after"]["running"], outcome["after"]["tokens_in_flight"]) == (0, 0)
    wait_until_idle(pdserve)
    assert generate(pdserve, "completion", MODEL, "after the storm " * 5, stream=False,
                    max_tokens=4).status == 200


async def _flood_from_key_a(pdserve: str) -> dict:
    flood = {"model": MODEL, "max_tokens": HOLD_TOKENS, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=pdserve, timeout=300) as client:

        async def state() -> dict:
            response = await client.get("/admin/admission", headers=ADMIN)
            assert response.status_code == 200
            return response.json()

        async def until(condition, what: str) -> dict:
            for _ in range(600):  # 60 s
                current = await state()
                if condition(current):
                    return current
                await asyncio.sleep(0.1)
            pytest.fail(f"admission never reached: {what}; last {current}")

        async def key_a(prompt: str) -> httpx.Response:
            # Unary: a stream would make Serve's proxy relay every token, and on two
            # shared cores that backlog delays the next requests by seconds.
            return await client.post("/v1/completions", headers=KEY_A,
                                     json={**flood, "prompt": prompt})

        async def hold(i: int) -> tuple[int, dict]:
            response = await key_a(f"hold {i} " * 30)
            return response.status_code, response.json()["usage"]

        assert (await state())["running"] == 0
        holders = [asyncio.create_task(hold(i)) for i in range(2)]
        held = await until(lambda s: s["running"] == 2, "both holders admitted")
        *overflow, other_key = await asyncio.gather(
            *(key_a(f"wait {i} " * 30) for i in range(3)),
            client.post("/v1/completions", headers=KEY_B,
                        json={"model": MODEL, "prompt": "key b says hi", "max_tokens": 8,
                              # sampled: without ignore_eos an early EOS may end it
                              "ignore_eos": True}))
        after_refusals = await state()
        # A request the budget has room for, beyond key A's running share: it waits for
        # A's own requests to end (here: out its max_wait_s), whatever the budget holds.
        over_share = await client.post("/v1/completions", headers=KEY_A, json={
            "model": MODEL, "prompt": "one more of mine", "max_tokens": OVER_SHARE_TOKENS})
        finished = await asyncio.gather(*holders)
        after = await until(lambda s: s["running"] == 0, "the budget given back")
    return {"holders": finished, "held": held, "overflow": overflow, "other_key": other_key,
            "after_refusals": after_refusals, "after": after, "over_share": over_share}


def test_a_decode_engine_pulls_only_what_its_prefix_cache_lacks(pdserve):
    """Two disaggregated prompts that share a long head (a system prompt): the decode
    engine keeps the blocks it pulled for the first as prefix cache, so for the second it
    pulls only the suffix's blocks over NIXL, and the prefill engine computes only the
    suffix (vLLM's NIXL connector counts local prefix hits before it reads remote blocks)."""
    block = CONFIG.engine.block_size
    shared = "You are a careful assistant for the pdserve test suite. " * 12  # ~21 blocks
    runs = []
    # Each question is longer than the threshold: what the decode engine lacks of the
    # second prompt is still worth a prefill (router.routing.decode.cache_aware_path).
    for question in ("What is a KV cache, and why does a server keep one per request? ",
                     "Why split prefill and decode onto engines of their own, and what then "
                     "moves between them? "):
        before = wait_until_idle(pdserve)
        answer = generate(pdserve, "completion", MODEL, shared + question, stream=False,
                          max_tokens=4, temperature=0)
        assert answer.status == 200 and len(answer.prompt_token_ids) >= THRESHOLD
        after = wait_until_idle(pdserve)
        runs.append({name: {key: after[name][key] - before[name][key]
                            for key in ("prompt_tokens_transferred", "prompt_tokens_cached",
                                        "prompt_tokens_computed", "kv_bytes_transferred",
                                        "requests_finished")}
                     for name in ("prefill", "decode")} | {
                     "prompt": len(answer.prompt_token_ids)})
    first, second = runs
    shared_blocks = len(shared.encode()) // block   # byte-level tokens, whole blocks only
    assert second["prompt"] - shared_blocks * block >= THRESHOLD
    assert first["prefill"]["requests_finished"] == second["prefill"]["requests_finished"] == 1
    # the second prompt's shared blocks were already on the decode engine
    assert second["decode"]["prompt_tokens_cached"] >= (shared_blocks - 1) * block
    assert second["decode"]["prompt_tokens_transferred"] <= second["prompt"] - (
        shared_blocks - 1) * block
    assert second["decode"]["kv_bytes_transferred"] < first["decode"]["kv_bytes_transferred"] / 2
    # and on the prefill engine, which computed only the suffix
    assert second["prefill"]["prompt_tokens_cached"] >= (shared_blocks - 1) * block


def test_a_lone_router_measures_no_other_routers_sending_to_the_pools(pdserve):
    """Each pool's request router counts what the replicas finished less its own
    completions (router.replica_choice.OtherRouters): the other router replicas' share,
    from which it would draw its first choice. This cluster has one router replica, so
    while both pools finish several requests a load-report period, it measures none; a
    router that missed its own completions would count every request as another's."""
    before = wait_until_idle(pdserve)
    started, sent = time.monotonic(), 0
    # at least four load reports (one a second) with requests finishing between them;
    # each prompt past the threshold and unlike the others (none cached): both pools
    while sent < 20 or time.monotonic() - started < 4 * ROUTING_STATS_PERIOD_S:
        prompt = f"Lone router, request {sent}: " + "a longer prompt " * 20
        assert generate(pdserve, "completion", MODEL, prompt, stream=False,
                        max_tokens=4).status == 200
        sent += 1
    after = wait_until_idle(pdserve)
    for pool in ("prefill", "decode"):
        assert after[pool]["requests_finished"] - before[pool]["requests_finished"] == sent
        assert after[pool]["other_routers_per_period"] is not None
        assert after[pool]["other_routers_per_period"] < 0.5, after[pool]
