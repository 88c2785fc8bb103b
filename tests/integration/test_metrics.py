"""Prometheus metrics on the real stack: what was sent is what was counted."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.integration import prometheus
from tests.integration.conftest import CONFIG, MODEL, wait_until_idle
from tests.integration.openai_http import AUTH, generate
from tests.integration.prometheus import total

pytestmark = pytest.mark.integration

METRICS_URL = f"http://{CONFIG.ray.node_ip_address}:{CONFIG.ray.metrics_export_port}/metrics"


def scrape() -> dict[str, dict[tuple, float]]:
    return prometheus.scrape(METRICS_URL)


def settled_scrape(*names: str, **labels: str) -> dict[str, dict[tuple, float]]:
    """This cluster's scrape once the counters ``names`` have settled."""
    return prometheus.settled_scrape(METRICS_URL, *names, **labels)


# What test_counters_balance_with_what_was_sent counts.
BALANCED = ("ray_pdserve_requests_total", "ray_pdserve_prompt_tokens_total",
            "ray_pdserve_generation_tokens_total",
            "ray_pdserve_time_to_first_token_seconds_count",
            "ray_pdserve_e2e_latency_seconds_count",
            "ray_pdserve_inter_token_latency_seconds_count",
            "ray_pdserve_engine_generation_tokens_total",
            "ray_pdserve_engine_prompt_tokens_total", "ray_pdserve_kv_transfer_bytes_total",
            "ray_pdserve_kv_transfer_seconds_count", "ray_pdserve_kv_transfer_failures_total")


def test_counters_balance_with_what_was_sent(pdserve):
    wait_until_idle(pdserve)
    before = settled_scrape(*BALANCED)
    results = [
        generate(pdserve, "completion", MODEL, f"metrics probe {i} " * (10 + 40 * i),
                 stream=bool(i % 2), max_tokens=6 + i, temperature=0, ignore_eos=True)
        for i in range(5)
    ]
    assert all(r.status == 200 for r in results)
    refused = [
        httpx.post(f"{pdserve}/v1/completions", headers=AUTH,
                   json={"model": MODEL, "prompt": "x", "max_tokens": 0}),
        httpx.post(f"{pdserve}/v1/completions", headers=AUTH,
                   json={"model": "nope", "prompt": "x"}),
    ]
    assert [r.status_code for r in refused] == [400, 404]
    wait_until_idle(pdserve)
    after = settled_scrape(*BALANCED)
    prompt_tokens = sum(r.usage["prompt_tokens"] for r in results)
    generated = sum(r.usage["completion_tokens"] for r in results)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("ray_pdserve_requests_total", model=MODEL, outcome="ok") == 5
    assert delta("ray_pdserve_requests_total", outcome="client_error") == 2
    assert delta("ray_pdserve_prompt_tokens_total", model=MODEL) == prompt_tokens
    assert delta("ray_pdserve_generation_tokens_total", model=MODEL) == generated
    assert delta("ray_pdserve_time_to_first_token_seconds_count", model=MODEL) == 5
    assert delta("ray_pdserve_e2e_latency_seconds_count", model=MODEL) == 5
    assert delta("ray_pdserve_inter_token_latency_seconds_count", model=MODEL) == generated - 5
    assert delta("ray_pdserve_engine_generation_tokens_total", pool="decode") == generated
    assert delta("ray_pdserve_engine_prompt_tokens_total", pool="prefill",
                 source="computed") == prompt_tokens
    # Decode receives the prompts' KV over NIXL; it computes at most a trailing block each.
    assert delta("ray_pdserve_engine_prompt_tokens_total", pool="decode",
                 source="transferred") >= prompt_tokens - 5 * CONFIG.engine.block_size
    assert delta("ray_pdserve_kv_transfer_bytes_total", pool="decode") > 0
    assert delta("ray_pdserve_kv_transfer_seconds_count", pool="decode") >= 4
    assert delta("ray_pdserve_kv_transfer_failures_total") == 0
    for version in CONFIG.versions:
        for pool in ("prefill", "decode"):
            assert total(after, "ray_pdserve_pool_replicas", pool=pool, version=version) == 1
    assert total(after, "ray_pdserve_kv_cache_usage_ratio", pool="prefill", version="v1") == 0
    # engine.vllm_metrics (on in this cluster): vLLM's own engine metrics, through Ray's
    exported = httpx.get(METRICS_URL, timeout=30).text
    assert re.search(r"^ray_vllm_generation_tokens\w*\{", exported, re.MULTILINE), \
        "vLLM's generation token counter is not exported"
