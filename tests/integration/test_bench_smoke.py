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
