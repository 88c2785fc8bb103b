"""Model versions on the real stack: weighted split, stickiness, the canary gate, API keys.

The test cluster serves two versions (tiny models with seeds 0 and 1, so one prompt gets
different greedy answers) under three served names; see pdserve-test.yaml.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

import httpx
import pytest

from tests.integration.conftest import CONFIG, ENV_API_KEY, MODEL
from tests.integration.openai_http import ADMIN, AUTH, generate
from tests.integration.prometheus import total
from tests.integration.test_metrics import settled_scrape

pytestmark = pytest.mark.integration

PROMPT = "The versions differ here:"


def ask(base_url: str, model: str, **params) -> tuple[str, str]:
    """(version header, greedy text) of one short completion."""
    result = generate(base_url, "completion", model, PROMPT, stream=False, max_tokens=8,
                      temperature=0, **params)
    assert result.status == 200, result.error
    return result.headers["x-pdserve-version"], result.text


def test_a_split_serves_both_versions_and_the_header_names_the_one_that_answered(pdserve):
    v1_version, v1_text = ask(pdserve, MODEL)
    assert v1_version == "v1"
    # Every request carries the test's API key, which alone would pin them all to one
    # version (stickiness); 40 users spread over both.
    answers = [ask(pdserve, "tiny-llama-split", user=f"split-user-{i}") for i in range(40)]
    counts = Counter(version for version, _ in answers)
    # 50/50 over 40 draws: fewer than 8 of either has probability ~1e-5
    assert counts["v1"] >= 8 and counts["v2"] >= 8 and set(counts) == {"v1", "v2"}
    texts = {version: {text for v, text in answers if v == version} for version in counts}
    assert texts["v1"] == {v1_text}                 # v1 answers exactly as v1 alone does
    assert len(texts["v2"]) == 1 and texts["v2"] != {v1_text}   # v2 is another model


def test_a_user_stays_on_one_version(pdserve):
    for user in ("alice", "bob", "carol", "dave"):
        seen = {ask(pdserve, "tiny-llama-split", user=user)[0] for _ in range(6)}
        assert len(seen) == 1, f"user {user} was served by {seen}"
    # without a user field, the API key is the sticky key
    assert len({ask(pdserve, "tiny-llama-split")[0] for _ in range(6)}) == 1


def test_the_canary_gate_promotes_a_healthy_canary_to_100(pdserve):
    """tiny-llama-rollout starts at v2: 10%; the gate (1 s period, 3 s window, eval command
    that allows only v2) promotes 10 -> 50 -> 100, after which all traffic is v2's."""
    state = httpx.get(f"{pdserve}/admin/rollout", headers=ADMIN, timeout=30).json()
    assert state["canary"]["candidate"] == "v2" and state["canary"]["percent"] == 10
    before = settled_scrape("ray_pdserve_canary_decisions_total", action="promote")

    async def traffic_until_complete(deadline_s: float = 150) -> dict:
        async with httpx.AsyncClient(base_url=pdserve, headers=AUTH, timeout=60) as client:
            body = {"model": "tiny-llama-rollout", "prompt": "canary traffic", "max_tokens": 2}
            start, users = time.monotonic(), itertools.count()
            while time.monotonic() - start < deadline_s:
                replies = await asyncio.gather(*(  # many users: each one is sticky
                    client.post("/v1/completions", json={**body, "user": f"u{next(users)}"})
                    for _ in range(4)))
                assert all(r.status_code == 200 for r in replies)
                rollout = (await client.get("/admin/rollout", headers=ADMIN)).json()
                if rollout["canary"]["complete"]:
                    return rollout
            pytest.fail(f"the rollout did not complete: {rollout}")

    final = asyncio.run(traffic_until_complete())
    assert [(d["action"], d["from"], d["to"]) for d in final["decisions"]] == [
        ("promote", 10, 50), ("promote", 50, 100)]
    assert all("healthy" in d["reason"] for d in final["decisions"])
    assert final["served_models"]["tiny-llama-rollout"] == {"v2": 1}
    assert {ask(pdserve, "tiny-llama-rollout")[0] for _ in range(5)} == {"v2"}
    after = settled_scrape("ray_pdserve_canary_decisions_total", action="promote")
    promotions = (total(after, "ray_pdserve_canary_decisions_total", action="promote")
                  - total(before, "ray_pdserve_canary_decisions_total", action="promote"))
    assert promotions == 2


def test_api_keys_are_required_and_checked(pdserve):
    body = {"model": MODEL, "prompt": "who goes there", "max_tokens": 2}
    missing = httpx.post(f"{pdserve}/v1/completions", json=body, timeout=60)
    wrong = httpx.post(f"{pdserve}/v1/completions", json=body, timeout=60,
                       headers={"Authorization": "Bearer sk-not-a-key"})
    for response in (missing, wrong):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
        assert "sk-not-a-key" not in response.text
    assert httpx.get(f"{pdserve}/v1/models", timeout=30).status_code == 401
    from_env = httpx.post(f"{pdserve}/v1/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {ENV_API_KEY}"})
    assert from_env.status_code == 200
    assert httpx.get(f"{pdserve}/health", timeout=30).status_code == 200  # probes need none
    assert CONFIG.router.auth.api_keys  # the config's keys were used by every other test


def test_admin_endpoints_take_an_admin_key_and_never_a_clients(pdserve):
    for path in ("/admin/stats", "/admin/rollout", "/admin/admission"):
        assert httpx.get(f"{pdserve}{path}", timeout=30).status_code == 401
        as_client = httpx.get(f"{pdserve}{path}", headers=AUTH, timeout=30)
        assert as_client.status_code == 403
        assert as_client.json()["error"]["code"] == "admin_key_required"
        assert httpx.get(f"{pdserve}{path}", headers=ADMIN, timeout=30).status_code == 200
    # An admin key is a client key too.
    assert httpx.get(f"{pdserve}/v1/models", headers=ADMIN, timeout=30).status_code == 200
