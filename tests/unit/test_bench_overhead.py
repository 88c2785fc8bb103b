"""`pdserve bench overhead`'s pure parts (tools/bench/overhead.py): the per-path config,
the latency table against the baseline, and a TTFT split by owner."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tools.bench import overhead

RUN = {
    "ttft_p50_s": 0.02,
    "ttft_p95_s": 0.03,
    "tpot_p50_s": 0.007,
    "e2e_p50_s": 0.2,
    "cpu_s_per_1k_tokens": {"other": 9.0},
}


def test_each_path_is_a_threshold_that_sends_every_short_prompt_down_it():
    config = SimpleNamespace(engine=SimpleNamespace(max_model_len=9216))
    document = {"router": {"port": 8300}}
    local = overhead.config_for_path(document, "decode_local", config)
    disaggregated = overhead.config_for_path(document, "disaggregated", config)
    assert local["router"] == {"port": 8300, "disaggregation_threshold_tokens": 9216}
    assert disaggregated["router"]["disaggregation_threshold_tokens"] == 0
    assert document == {"router": {"port": 8300}}  # the base is left as it was
    with pytest.raises(ValueError, match="decode_local, disaggregated"):
        overhead.config_for_path(document, "colocated", config)


def test_the_table_shows_what_pdserve_adds_to_the_baseline():
    runs = {
        "vllm": RUN,
        "pdserve decode_local": {**RUN, "ttft_p50_s": 0.0245, "tpot_p50_s": None},
    }
    table = overhead.latency_table(runs, baseline="vllm")
    ttft = next(line for line in table.splitlines() if "TTFT p50" in line)
    assert "20.0" in ttft and "24.5 (+4.5)" in ttft
    per_token = next(line for line in table.splitlines() if "TPOT" in line)
    assert per_token.rstrip().endswith("-")


def test_a_disaggregated_ttft_splits_into_the_engines_time_and_the_rest():
    stages = {
        name: {"mean_s": mean, "requests": 4}
        for name, mean in {
            "render": 0.005,
            "admission": 0.0003,
            "prefill": 0.026,
            "first_token": 0.025,
            "first_event": 0.0003,
            "prefill engine queued": 0.001,
            "prefill engine prefill": 0.008,
            "decode engine queued": 0.002,
            "decode engine prefill": 0.009,
        }.items()
    }
    share = overhead.engine_share(stages)
    assert share["router_s"] == pytest.approx(0.0566)
    assert share["engines_s"] == pytest.approx(0.020)
    assert share["serving_s"] == pytest.approx(0.0366)
    assert share["engine_hops_s"] == 0  # replicas that time no hops: all is calls and router
    assert share["calls_and_router_s"] == pytest.approx(0.0366)
    hops = {"prefill replica to engine": 0.0012, "prefill engine to replica": 0.001,
            "decode replica to engine": 0.0011, "decode engine to replica": 0.0009}
    share = overhead.engine_share(
        stages | {part: {"mean_s": mean, "requests": 4} for part, mean in hops.items()})
    assert share["engines_s"] == pytest.approx(0.020)  # the hops are serving, not engine
    assert share["serving_s"] == pytest.approx(0.0366)
    assert share["engine_hops_s"] == pytest.approx(0.0042)
    assert share["calls_and_router_s"] == pytest.approx(0.0324)
    assert overhead.engine_share({"render": stages["render"]}) is None  # decode-local


def test_relay_capacity_is_one_core_over_the_cpu_a_token_took():
    run = {"cpu_s_per_1k_tokens": {"router": 0.125, "proxy": 0.0}}
    assert overhead.relay_capacity(run) == 8000
    assert overhead.relay_capacity(run, "proxy") is None  # nothing beyond idle: no figure
    assert overhead.relay_capacity({"cpu_s_per_1k_tokens": {}}) is None


def test_the_prompts_prefill_is_the_engine_that_computed_it():
    stage = lambda mean: {"requests": 4, "mean_s": mean}  # noqa: E731
    disaggregated = {"prefill engine prefill": stage(0.025), "decode engine prefill": stage(0.007)}
    assert overhead.prompt_prefill_mean_s(disaggregated) == 0.025
    assert overhead.prompt_prefill_mean_s({"decode engine prefill": stage(0.02)}) == 0.02
    assert overhead.prompt_prefill_mean_s({"engine prefill": stage(0.018)}) == 0.018  # vLLM
    assert overhead.prompt_prefill_mean_s(None) is None
    runs = {"vllm": {**RUN, "prompt_prefill_mean_s": 0.018},
            "pdserve decode_local": {**RUN, "prompt_prefill_mean_s": 0.0205}}
    row = next(line for line in overhead.latency_table(runs, baseline="vllm").splitlines()
               if "prompt's prefill" in line)
    assert "18.0" in row and "20.5 (+2.5)" in row
