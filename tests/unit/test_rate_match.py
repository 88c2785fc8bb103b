"""Rate-matched comparison (tools/bench/rate_match.py): the SLO's judgement of a probe, the
bracket-then-bisect search over rates, engine cores, and the per-core table."""

from __future__ import annotations

import pytest

from cluster.slo import SLOConfig
from tools.bench.rate_match import (
    EnginePool,
    HoldRule,
    Matched,
    RateSearch,
    best,
    bound_cores,
    bracket,
    engine_cores,
    matched_rows,
    matched_table,
    per_core,
    probe_line,
)
from tools.bench.stats import SLO, RequestRecord, summarise

RULE = HoldRule(ttft_p95_s=0.5, itl_p95_s=0.05)


def search_with(search: RateSearch, holds) -> list[tuple[float, bool]]:
    """Run ``search`` against an oracle ``holds(rate) -> bool``: its probes."""
    history: list[tuple[float, bool]] = []
    while (rate := search.next_rate(history)) is not None:
        assert rate not in [r for r, _ in history], "a rate probed twice"
        history.append((rate, holds(rate)))
    return history


def summary_of(records: list[RequestRecord]) -> dict:
    return summarise(records, duration_s=10.0, slo=SLO(ttft_s=0.5, tpot_s=0.1))


def answered(index: int, ttft: float, gap: float, tokens: int = 5) -> RequestRecord:
    first = 1.0 + ttft
    return RequestRecord(index, "short", 100, sent_at=1.0, status=200, first_token_at=first,
                         token_times=[first + i * gap for i in range(tokens)],
                         output_tokens=tokens)


# ---- the search ----------------------------------------------------------------------

@pytest.mark.parametrize("threshold", [0.05, 0.3, 0.9, 1.0, 1.7, 3.0, 5.5, 12.0, 40.0])
def test_a_monotone_threshold_is_found_within_tolerance_and_budget(threshold):
    search = RateSearch(start=1.0, max_probes=12, tolerance=1.15)
    history = search_with(search, lambda rate: rate <= threshold)
    low, high = bracket(history)
    assert len(history) <= search.max_probes
    assert low is not None and low <= threshold < high <= low * search.tolerance
    assert best(history) == low


def test_the_default_search_brackets_a_nearby_threshold_in_its_six_probes():
    history = search_with(RateSearch(), lambda rate: rate <= 3.0)
    low, high = bracket(history)
    assert len(history) <= 6 and high / low <= 1.2 and low <= 3.0 < high


def test_the_probe_budget_is_respected_even_when_the_bracket_is_still_wide():
    search = RateSearch(start=1.0, max_probes=3)
    history = search_with(search, lambda rate: rate <= 100.0)
    assert [rate for rate, _ in history] == [1.0, 2.0, 4.0]
    assert best(history) == 4.0 and bracket(history) == (4.0, None)


def test_a_setup_that_always_holds_stops_at_the_max_rate():
    search = RateSearch(start=1.0, max_probes=50, max_rate=10.0)
    history = search_with(search, lambda rate: True)
    assert [rate for rate, _ in history] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert best(history) == 10.0


def test_a_setup_that_always_fails_stops_at_the_min_rate_with_no_best():
    search = RateSearch(start=1.0, max_probes=50, min_rate=0.1)
    history = search_with(search, lambda rate: False)
    assert [rate for rate, _ in history] == [1.0, 0.5, 0.25, 0.125, 0.1]
    assert best(history) is None and bracket(history) == (None, 0.1)


def test_a_failure_below_a_held_rate_is_noise_not_the_brackets_end():
    # a history the search did not make itself (its own probes stay inside the bracket)
    history = [(1.0, True), (2.0, False), (4.0, True)]
    assert bracket(history) == (4.0, None) and best(history) == 4.0
    assert RateSearch(max_probes=9).next_rate(history) == 8.0
    assert RateSearch(max_probes=9).next_rate([*history, (8.0, False)]) == pytest.approx(
        32**0.5)


def test_a_noisy_oracle_still_ends_with_a_held_rate_below_a_failed_one():
    flips = iter([True, True, False, True, False, True, True, False, True])
    history = search_with(RateSearch(max_probes=9, tolerance=1.1), lambda rate: next(flips))
    low, high = bracket(history)
    assert len(history) <= 9 and low is not None and high is not None and low < high


def test_a_random_oracle_ends_within_budget():
    import random

    chance = random.Random(7)
    for _ in range(200):
        search = RateSearch(max_probes=9)
        history = search_with(search, lambda rate: chance.random() < 0.5)
        assert len(history) <= 9


def test_a_search_refuses_nonsense_settings():
    with pytest.raises(ValueError, match="tolerance"):
        RateSearch(tolerance=1.0)
    with pytest.raises(ValueError, match="max_probes"):
        RateSearch(max_probes=0)
    with pytest.raises(ValueError, match="start rate"):
        RateSearch(start=0.0)


# ---- the SLO's judgement ---------------------------------------------------------------

def test_a_fast_run_with_every_request_answered_holds():
    verdict = RULE.judge(summary_of([answered(i, ttft=0.2, gap=0.02) for i in range(20)]))
    assert verdict.held and verdict.broken == ()


def test_a_slow_first_token_or_slow_gaps_break_the_slo():
    slow_ttft = RULE.judge(summary_of([answered(i, ttft=0.8, gap=0.02) for i in range(20)]))
    slow_itl = RULE.judge(summary_of([answered(i, ttft=0.2, gap=0.09) for i in range(20)]))
    assert not slow_ttft.held and slow_ttft.broken == ("TTFT p95 800 ms > 500 ms",)
    assert not slow_itl.held and slow_itl.broken == ("ITL p95 90 ms > 50 ms",)


def test_one_error_breaks_the_slo_unless_a_share_is_allowed():
    records = [answered(i, ttft=0.2, gap=0.02) for i in range(19)]
    records.append(RequestRecord(19, "short", 100, sent_at=1.0, status=503, error="http_503"))
    summary = summary_of(records)
    verdict = RULE.judge(summary)
    assert not verdict.held and verdict.broken == ("19/20 answered (1 http_503)",)
    assert HoldRule(0.5, 0.05, min_answered=0.95).judge(summary).held


def test_a_run_with_nothing_answered_or_nothing_sent_fails():
    failed = [RequestRecord(i, "short", 100, sent_at=1.0, error="timeout") for i in range(3)]
    assert not RULE.judge(summary_of(failed)).held
    assert not RULE.judge(summary_of([])).held


def test_one_token_answers_have_no_itl_to_break():
    records = [answered(i, ttft=0.2, gap=0.0, tokens=1) for i in range(5)]
    assert RULE.judge(summary_of(records)).held


def test_the_rule_takes_the_configs_bounds_unless_overridden():
    slo = SLOConfig(ttft_p95_s=0.7, itl_p95_s=0.04)
    assert HoldRule.from_config(slo) == HoldRule(0.7, 0.04)
    assert HoldRule.from_config(slo, ttft_p95_s=2.0) == HoldRule(2.0, 0.04)
    assert "every request answered" in HoldRule.from_config(slo).describe()


def test_a_probe_line_says_what_broke():
    summary = summary_of([answered(i, ttft=0.8, gap=0.02) for i in range(4)])
    line = probe_line("colocated", 2.0, summary, RULE.judge(summary))
    assert line.startswith("colocated @ 2 req/s: TTFT p95 800 ms, ITL p95 20 ms, 4/4 answered")
    assert line.endswith("failed: TTFT p95 800 ms > 500 ms")


# ---- engine cores --------------------------------------------------------------------

@pytest.mark.parametrize(("bind", "cores"), [
    ("0", {0}), ("1", {1}), ("0,1", {0, 1}), ("0-3", {0, 1, 2, 3}), ("0-1|2-3", {0, 1, 2, 3}),
    ("0, 2", {0, 2}), ("auto", None), ("nobind", None), ("", None), (None, None), ("1-", None),
])
def test_a_bind_names_its_cores(bind, cores):
    assert bound_cores(bind) == (None if cores is None else frozenset(cores))


def test_bound_pools_count_distinct_cores_and_unbound_ones_their_reservation():
    # pdserve on the bench config: prefill on core 0, decode on core 1
    assert engine_cores([EnginePool("0"), EnginePool("1")]) == (2.0, "bound")
    # colocated: one engine bound to both pools' cores counts the same two
    assert engine_cores([EnginePool("0,1")]) == (2.0, "bound")
    # two replicas bound alike share their cores
    assert engine_cores([EnginePool("0-1", replicas=2)]) == (2.0, "bound")
    # one pool unbound: every pool counted by what its replicas reserve
    assert engine_cores([EnginePool("0"), EnginePool(None, replicas=2, num_cpus=1.5)]) == (
        4.0, "reserved")


# ---- the table -----------------------------------------------------------------------

def test_per_core_figures_and_ratios_to_the_first_setup():
    rows = matched_rows([Matched("pdserve", 2.8, 3.4, 2.4, 2.0),
                         Matched("colocated", 1.4, 1.7, 1.2, 2.0),
                         Matched("big", 8.0, None, 6.0, 4.0),
                         Matched("never", None, 0.1, None, 2.0)])
    assert per_core(3.0, 2.0) == 1.5 and per_core(None, 2.0) is None and per_core(1.0, 0) is None
    assert [row["goodput_per_core"] for row in rows] == [1.2, 0.6, 1.5, None]
    assert [row["vs_first"] for row in rows] == [1.0, 0.5, 1.25, None]
    assert rows[0]["rate_per_core"] == 1.4
    table = matched_table("rate-matched", rows)
    lines = table.splitlines()
    assert lines[0] == "rate-matched" and "vs pdserve" in lines[1]
    assert lines[3].split() == ["colocated", "1.4", "1.7", "1.2", "2", "0.6", "0.50x"]
    assert lines[5].split() == ["never", "-", "0.1", "-", "2", "-", "-"]


def test_no_ratio_when_the_first_setup_never_held():
    rows = matched_rows([Matched("pdserve", None, 0.1, None, 2.0),
                         Matched("colocated", 1.0, 1.2, 0.9, 2.0)])
    assert [row["vs_first"] for row in rows] == [None, None]
