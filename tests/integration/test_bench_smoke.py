"""`pdserve bench run` end to end against the test cluster: a few requests, no timings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from router.timing import STAGES
from tests.integration.conftest import CONFIG, CONFIG_PATH, MODEL, REPO
from tests.integration.openai_http import API_KEY

pytestmark = pytest.mark.integration


def test_bench_run_measures_every_request(pdserve, tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "bench", "run", "--base-url", pdserve,
         "--model", MODEL, "--workload", "interference", "--num-requests", "4",
         "--rates", "4,8", "--scale", "0.05", "--long-fraction", "0.5", "--seed", "1",
         "--tokenizer", str(CONFIG.model.path), "--out", str(tmp_path), "--no-progress",
         "--api-key", API_KEY, "--config", str(CONFIG_PATH)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "TTFT" in completed.stdout and "goodput" in completed.stdout
    for rate in ("4.0", "8.0"):
        result = json.loads((tmp_path / f"run-interference-{rate}.json").read_text())
        assert result["all"]["requests"] == result["all"]["completed"] == 4
        assert result["all"]["errors"] == {}
        for record in result["records"]:
            assert record["status"] == 200
            # every planned token arrived and was timed (ignore_eos)
            assert record["output_tokens"] == len(record["token_times"]) > 0
        # where the time to the first event went: every request in every stage it had
        stages = result["stages"]
        assert set(stages) >= set(STAGES) - {"prefill"}, stages
        for stage in STAGES:
            row = stages.get(stage, {"requests": 1})
            assert row["requests"] == (4 if stage != "prefill" else row["requests"]) > 0
        # and, within the pool stages, the engines' own time: every request was decoded
        assert stages["decode engine queued"]["requests"] == 4
        assert stages["decode engine prefill"]["requests"] == 4
        # the stages span the router's part of the TTFT, less than what the client saw:
        # their means are exact (the counters beside the histogram, cluster/metrics.py
        # EXACT_SUMS), where Ray's rebuilt histogram sums could exceed the client's
        router_s = sum(stages[stage]["mean_s"] * stages[stage]["requests"]
                       for stage in STAGES if stage in stages) / 4
        client_s = sum(r["first_token_at"] - r["sent_at"] for r in result["records"]) / 4
        assert 0 < router_s < client_s
    assert "first_event" in completed.stdout  # the breakdown table
    for plot in ("run-interference-ttft-cdf.png", "run-interference-sweep.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TRACES = REPO / "tests/unit/data/traces"


def replay(pdserve: str, out, trace: str, *flags: str) -> subprocess.CompletedProcess:
    """``pdserve bench run --trace`` against the test cluster, as a user runs it (pass
    ``--config`` among ``flags`` for the engines' counters: reading them waits for the
    cluster's metrics to settle before and after, ~20 s)."""
    completed = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "bench", "run", "--base-url", pdserve,
         "--model", MODEL, "--trace", str(TRACES / trace), *flags,
         "--tokenizer", str(CONFIG.model.path), "--out", str(out), "--no-progress",
         "--api-key", API_KEY],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def test_a_trace_excerpt_is_replayed_request_for_request(pdserve, tmp_path):
    """Eight requests of Azure's conversation trace, ten times as fast: every one answered
    with the trace's output length, and the server counted exactly the trace's prompt
    tokens (token-id prompts: nothing added, nothing lost to a tokenizer round trip)."""
    lines = (TRACES / "azure_llm_2023_conv.csv").read_text().splitlines()[1:9]
    recorded = [(int(prompt), int(output)) for _, prompt, output in
                (line.split(",") for line in lines)]
    completed = replay(pdserve, tmp_path, "azure_llm_2023_conv.csv", "--max-requests", "8",
                       "--speedup", "10")
    assert "8 requests, 0 clipped and 0 skipped" in completed.stdout, completed.stdout
    result = json.loads((tmp_path / "run-azure_llm_2023_conv-x10.json").read_text())
    assert result["all"]["requests"] == result["all"]["completed"] == 8
    assert result["all"]["errors"] == {}
    assert result["trace"]["fit"]["prompt_tokens_after"] == sum(p for p, _ in recorded)
    answered = sorted(result["records"], key=lambda record: record["index"])
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in answered] == recorded
    assert all(len(r["token_times"]) == r["output_tokens"] for r in answered)


def test_a_mooncake_slice_is_clipped_to_the_window_and_its_shared_block_is_cached(
        pdserve, tmp_path):
    """Mooncake's trace from 5 s on, six requests: two bursts of three, 3 s apart (1-15K
    prompt tokens, all starting with the same 512-token block), clipped to a 2,048-token
    window: every prompt that does not fit cut to leave room for its whole answer, every
    request answered in full with exactly the clipped prompt, and the block they share
    found in the engines' prefix caches. (The trace's next burst, nine at once from one
    API key, would meet the test cluster's per-key admission limits: a 429.)"""
    completed = replay(pdserve, tmp_path, "mooncake_fast25_conversation.jsonl",
                       "--start", "5", "--max-requests", "6", "--max-model-len", "2048",
                       "--config", str(CONFIG_PATH))
    assert "6 requests, 5 clipped and 0 skipped" in completed.stdout, completed.stdout
    result = json.loads((tmp_path / "run-mooncake_fast25_conversation-x1.json").read_text())
    assert result["all"]["requests"] == result["all"]["completed"] == 6
    assert result["all"]["errors"] == {}
    records = result["records"]
    assert result["trace"]["fit"]["prompt_tokens_after"] == sum(
        r["prompt_tokens"] for r in records)
    assert all(r["prompt_tokens"] + r["output_tokens"] <= 2048 for r in records)
    assert sum(r["prompt_tokens"] + r["output_tokens"] == 2048 for r in records) == 5
    work = result["engine_work"]
    cached = work.get("prefill prompt tokens cached", 0) + work.get(
        "decode prompt tokens cached", 0)
    assert cached >= 512, work
