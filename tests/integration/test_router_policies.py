"""Router policies on the real stack: per-request disaggregation and admission control."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.conftest import CONFIG, MODEL, wait_until_idle
from tests.integration.openai_http import generate

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


def test_over_budget_load_is_queued_or_refused_while_admitted_requests_finish(pdserve):
    """Budget 20,000 tokens, queue of 2, 3 s wait; each flood request may hold 7,000 tokens.

    Key A floods; key B's small request arrives in the middle of it and is admitted at
    once (it fits the budget, and A's waiters do not hold back another key).
    """
    wait_until_idle(pdserve)
    admission = CONFIG.router.admission
    body = {"model": MODEL, "prompt": "x" * 6000, "max_tokens": 1000, "ignore_eos": True}
    assert 2 * 7000 <= admission.token_budget < 3 * 7000 and admission.max_queue == 2
    finished_at: dict[str, float] = {}

    async def send_all() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=pdserve, timeout=300) as client:
            loop = asyncio.get_running_loop()

            async def flood(i: int) -> httpx.Response:
                await asyncio.sleep(0.4 * i)  # arrive in order
                response = await client.post(
                    "/v1/completions", json={**body, "prompt": f"{i}" + body["prompt"]},
                    headers={"Authorization": "Bearer key-a"})
                finished_at[f"a{i}"] = loop.time()
                return response

            async def other_key() -> httpx.Response:
                await asyncio.sleep(2.2)  # after the flood filled budget and queue
                response = await client.post(
                    "/v1/completions", headers={"Authorization": "Bearer key-b"},
                    json={"model": MODEL, "prompt": "key b says hi", "max_tokens": 8})
                finished_at["b"] = loop.time()
                return response

            *flooded, b = await asyncio.gather(*(flood(i) for i in range(5)), other_key())
            return flooded, b

    responses, b_response = asyncio.run(send_all())
    # two fit the budget; two wait in the queue and time out; the fifth finds it full
    assert [r.status_code for r in responses] == [200, 200, 503, 503, 429]
    for response in responses[:2]:
        assert response.json()["usage"]["completion_tokens"] == 1000
    for response, code in zip(responses[2:], ["queue_timeout", "queue_timeout", "queue_full"],
                              strict=True):
        assert response.headers["retry-after"] == str(admission.retry_after_s)
        error = response.json()["error"]
        assert (error["code"], error["type"]) == (code, "overloaded_error")
    # the other key was served during the flood, not after it
    assert b_response.status_code == 200
    assert b_response.json()["usage"]["completion_tokens"] == 8
    assert finished_at["b"] < min(finished_at["a0"], finished_at["a1"])
    wait_until_idle(pdserve)
    # the budget was given back: the service admits again
    assert generate(pdserve, "completion", MODEL, "after the storm " * 5, stream=False,
                    max_tokens=4).status == 200
