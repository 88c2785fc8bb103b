"""A trace replay over time (tools/bench/stats.py ``timeline``), the probe that stands for
a setup in that plot (tools/bench/rate_match.py ``shown_rate``) and the plot itself."""

from __future__ import annotations

import pytest

from tools.bench.rate_match import shown_rate
from tools.bench.report import trace_timeline_plot
from tools.bench.stats import RequestRecord, timeline, timeline_window


def answered(index: int, sent_at: float, ttft: float, gaps: list[float]) -> RequestRecord:
    times = [sent_at + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    return RequestRecord(index, "short", 64, sent_at=sent_at, status=200,
                         first_token_at=times[0], token_times=times, output_tokens=len(times))


def failed(index: int, sent_at: float) -> RequestRecord:
    return RequestRecord(index, "short", 64, sent_at=sent_at, error="http_503")


def test_each_window_counts_its_sends_and_takes_the_latencies_of_its_answers():
    records = [answered(0, 10.0, 0.1, [0.02, 0.03]), answered(1, 10.5, 0.3, [0.05]),
               failed(2, 11.9), answered(3, 14.2, 0.2, [])]
    bins = timeline(records, 2.0)
    assert [b.start_s for b in bins] == [10.0, 12.0, 14.0]
    assert [b.arrivals_per_s for b in bins] == [1.5, 0.0, 0.5]   # 3, 0, 1 sends in 2 s
    assert bins[0].ttft_p95_s == pytest.approx(0.3)   # the failed send adds no latency
    assert bins[0].itl_p95_s == pytest.approx(0.05)
    assert (bins[1].ttft_p95_s, bins[1].itl_p95_s) == (None, None)   # nothing sent
    assert bins[2].ttft_p95_s == pytest.approx(0.2) and bins[2].itl_p95_s is None
    assert sum(b.arrivals_per_s * 2.0 for b in bins) == len(records)


def test_a_timeline_needs_a_positive_window_and_is_empty_without_records():
    assert timeline([], 1.0) == []
    with pytest.raises(ValueError, match="window_s"):
        timeline([failed(0, 0.0)], 0.0)


def test_the_window_is_about_a_thirtieth_of_the_span_in_whole_seconds_at_least_one():
    assert timeline_window([failed(0, 0.0), failed(1, 300.0)]) == 10.0
    assert timeline_window([failed(0, 0.0), failed(1, 12.0)]) == 1.0
    assert timeline_window([]) == 1.0


def test_a_setup_is_shown_at_its_highest_rate_that_held_else_its_lowest():
    assert shown_rate([(1.0, True), (2.0, True), (4.0, False), (2.83, True)]) == 2.83
    assert shown_rate([(1.0, False), (0.5, False)]) == 0.5
    assert shown_rate([]) is None


def test_the_timeline_plot_is_written_one_row_per_run(tmp_path):
    pytest.importorskip("matplotlib")
    runs = {"a @ 1/s": [answered(i, i * 0.5, 0.1 * i, [0.02]) for i in range(10)],
            "b @ 2/s": [answered(0, 0.0, 0.1, []), failed(1, 1.0)]}
    path = tmp_path / "timeline.png"
    trace_timeline_plot(path, runs, "a trace over time", 1.0)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
