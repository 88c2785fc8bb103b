"""`pdserve bench overhead` and `pdserve bench variants` end to end: each starts servers of
its own (vLLM's, pdserve once per path or variant) from ray_configs/bench.yaml, so they run
in a pytest session of their own (`-m bench`), after the shared cluster's. Smoke tests:
a few requests, what was measured and that each setup really ran as configured, no
timings (docs/benchmarks.md has the measurements)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, _cluster_processes, _wait_for_exit
from tools.bench import engine_work

pytestmark = [pytest.mark.integration, pytest.mark.bench]

BENCH_CONFIG = REPO / "ray_configs/bench.yaml"


def bench(*args: str, out: Path) -> subprocess.CompletedProcess:
    """``pdserve bench ...`` as a user runs it; its servers are gone when it returns."""
    before = _cluster_processes()
    completed = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "bench", *args, "--config", str(BENCH_CONFIG),
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    leftover = _wait_for_exit(before)
    assert not leftover, f"processes left behind by bench {args[0]}: {leftover}"
    return completed


def test_overhead_times_vllm_and_each_pdserve_path_as_configured(tmp_path):
    completed = bench("overhead", "--one-at-a-time", "--requests", "2", "--max-tokens", "4",
                      "--idle-sample-s", "1", out=tmp_path)
    runs = json.loads((tmp_path / "overhead.json").read_text())["runs"]
    assert set(runs) == {"vllm", "pdserve decode_local", "pdserve disaggregated"}
    for run in runs.values():
        assert run["n"] == run["requests"] == 2
        assert run["ttft_p50_s"] > 0 and run["tokens_per_s"] > 0
    local, split = runs["pdserve decode_local"], runs["pdserve disaggregated"]
    for run in (local, split):  # every request's stages, and what its engines did
        assert run["stages"]["first_token"]["requests"] == 2
        assert run["stages"]["decode engine prefill"]["requests"] == 2
        # and the decode replica's hops to its engine core and back, once per request
        assert run["stages"]["decode replica to engine"]["requests"] == 2
        assert run["stages"]["decode engine to replica"]["requests"] == 2
        assert engine_work.decode_prompt_tokens(run["engine_work"]) > 0
    # the disaggregated TTFT split between the engines and the serving around them
    owners = split["ttft_by_owner_s"]
    assert 0 < owners["engines_s"] < owners["router_s"]
    assert split["stages"]["prefill replica to engine"]["requests"] == 2
    assert split["stages"]["prefill engine to replica"]["requests"] == 2
    assert 0 < owners["engine_hops_s"] < owners["serving_s"]
    # the decode-local path never touches the prefill pool or NIXL; the other always does
    assert "prefill" not in local["stages"]
    assert "prefill replica to engine" not in local["stages"]
    assert local["engine_work"].get("kv bytes pulled", 0) == 0
    assert local["engine_work"].get("prefill prompt tokens computed", 0) == 0
    assert split["stages"]["prefill"]["requests"] == 2
    assert split["engine_work"]["kv bytes pulled"] > 0
    assert split["engine_work"]["decode prompt tokens transferred"] > 0
    assert "router's part of the TTFT" in completed.stdout
    # vLLM's own engine phases, from its server's /metrics, beside the engine that
    # computed each pdserve prompt: the same measure on each side
    assert runs["vllm"]["stages"]["engine prefill"]["requests"] == 2
    assert runs["vllm"]["stages"]["engine queued"]["requests"] == 2
    assert local["prompt_prefill_mean_s"] == local["stages"]["decode engine prefill"]["mean_s"]
    assert split["prompt_prefill_mean_s"] == split["stages"]["prefill engine prefill"]["mean_s"]
    assert all(run["prompt_prefill_mean_s"] > 0 for run in runs.values())


def test_variants_serve_each_config_and_count_what_the_engines_did(tmp_path):
    """Two conversations of two turns under a shared system prompt, served with the prefix
    cache and without it: each later turn carries its conversation so far, and only the
    first variant's engines find what came before in their caches."""
    bench("variants", "--variant", "cache", "--variant",
          "no-cache:engine.enable_prefix_caching=false", "--num-requests", "4",
          "--turns", "2", "--think-s", "0.2", "--rate", "2", "--scale", "0.05",
          "--shared-prefix-tokens", "256",
          "--tokenizer", str(REPO / ".cache/models/tiny-llama-256x4-s0"), "--no-progress",
          out=tmp_path)
    results = json.loads((tmp_path / "variants.json").read_text())["results"]
    assert set(results) == {"cache", "no-cache"}
    for summary in results.values():
        assert summary["all"]["requests"] == summary["all"]["completed"] == 4
        assert summary["later_turns"]["requests"] == summary["later_turns"]["completed"] == 2
        assert summary["stages"]["first_token"]["requests"] == 4
    for summary in results.values():  # the decode engines took in every prompt sent, once
        assert engine_work.decode_prompt_tokens(summary["engine_work"]) == summary["all"][
            "prompt_tokens"] > 4 * 256
    cached, uncached = (results[name]["engine_work"] for name in ("cache", "no-cache"))
    # the second conversation finds the head (8 blocks of 32, the last maybe partial),
    # each later turn its whole first turn
    assert cached["prefill prompt tokens cached"] >= 3 * 7 * 32
    assert cached["decode prompt tokens cached"] >= 3 * 7 * 32
    assert uncached.get("prefill prompt tokens cached", 0) == 0
    assert uncached.get("decode prompt tokens cached", 0) == 0
