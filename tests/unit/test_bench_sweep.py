"""The rate sweep of ``pdserve bench overhead`` (tools/bench/sweep.py): run order, what a
run's records add up to, and the table's comparison."""

from __future__ import annotations

import pytest

from tools.bench.stats import RequestRecord
from tools.bench.sweep import abba, chunk_gaps, run_salt, summarise, sweep_table


def record(index: int, sent_at: float, token_times: list[float]) -> RequestRecord:
    return RequestRecord(index, "short", 64, sent_at=sent_at, status=200,
                         first_token_at=token_times[0], token_times=token_times,
                         output_tokens=len(token_times))


def test_each_rate_runs_the_two_setups_in_abba_order():
    assert abba("vllm", "pdserve") == [("vllm", 0), ("pdserve", 0), ("pdserve", 1),
                                       ("vllm", 1)]


def test_each_runs_salt_is_its_own_and_as_long_as_the_others_at_its_rate():
    """The baseline runs again beside each pdserve setup: a salt of its first pass would
    find its prompts in vLLM's prefix cache (its TTFT halved once, in a sweep of two
    variants)."""
    salts = {run_salt(pass_, setup, round_, 4)
             for pass_ in (1, 2) for setup in (0, pass_) for round_ in (0, 1)}
    assert len(salts) == 8
    assert len({len(run_salt(1, setup, round_, 4)) for setup in (0, 1)
                for round_ in (0, 1)}) == 1


def test_tokens_that_arrived_in_one_chunk_make_one_gap():
    assert chunk_gaps([1.0, 1.0, 1.0, 1.02, 1.02, 1.05]) == pytest.approx([0.02, 0.03])
    assert chunk_gaps([1.0]) == []


def test_a_run_sums_up_to_its_medians_tokens_and_cpu_per_thousand_tokens():
    records = [record(0, 0.0, [0.1, 0.1, 0.12, 0.14]),   # TPOT (0.14-0.1)/3, gaps .02 .02
               record(1, 0.5, [0.62, 0.63, 0.64, 0.65]),  # TPOT 0.01, gaps .01 x3
               RequestRecord(2, "short", 64, sent_at=1.0, error="http_503")]
    run = summarise(records, {"router": 0.4, "decode engine": 1.6}, elapsed_s=2.0)
    assert (run["requests"], run["n"], run["tokens"]) == (3, 2, 8)
    assert run["ttft_p50_s"] == pytest.approx(0.1)
    assert run["ttft_p95_s"] == pytest.approx(0.12)
    assert run["tpot_p50_s"] == pytest.approx(0.01)
    assert run["itl_p50_s"] == pytest.approx(0.01)
    assert run["tokens_per_s"] == 4.0
    assert run["tokens_per_chunk"] == 8 / 7  # the first stream's first two came as one
    assert run["cpu_s_per_1k_tokens"] == {"router": 50.0, "decode engine": 200.0}


def test_the_table_sets_pdserves_means_against_vllms_at_each_rate():
    def run(setup, round_, ttft, tpot, cpu):
        return {"rate": 4.0, "setup": setup, "round": round_, "ttft_p50_s": ttft,
                "ttft_p95_s": ttft, "tpot_p50_s": tpot, "itl_p50_s": tpot,
                "tokens_per_s": 100.0, "cpu_s_per_1k_tokens": cpu}

    runs = [run("vllm", 0, 0.020, 0.005, {"other": 1.0, "engine": 5.0}),
            run("pdserve", 0, 0.030, 0.006, {"router": 1.0, "proxy": 0.5,
                                             "decode replica": 0.5, "decode engine": 5.0}),
            run("pdserve", 1, 0.034, 0.006, {"router": 1.0, "proxy": 1.0,
                                             "decode replica": 0.5, "decode engine": 5.0}),
            run("vllm", 1, 0.024, 0.005, {"other": 1.0, "engine": 5.0})]
    table = sweep_table(runs, "vllm", "pdserve")
    assert "TTFT p50 +10.0 ms" in table
    assert "TPOT p50 1.20x" in table and "ITL p50 1.20x" in table
    assert "serving CPU 2.25x" in table  # (2.0 + 2.5) / 2 against 1.0
