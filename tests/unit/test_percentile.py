"""The one percentile definition (nearest rank) shared by the canary gate, the autoscaling
reports and the benchmark."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.engine.load_report import LatencyWindow
from cluster.percentile import p95, percentile
from router.canary import OutcomeWindow
from tools.bench.stats import SLO, RequestRecord, summarise


def test_nearest_rank_examples():
    assert percentile([], 50) is None and p95([]) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([1, 2, 3, 4], 50) == 2         # even count: the lower middle value
    # Was 9.5 under the benchmark's former linear interpolation, a latency no request had;
    # nearest rank gives the slower request, the bound "95% at or below" needs.
    assert percentile([0, 10], 95) == 10
    assert p95(range(1, 21)) == 19                    # 95% of 20 is exactly 19 values
    assert percentile([5, 1], 0) == 1 and percentile([5, 1], 100) == 5
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=300), st.integers(1, 100))
def test_percentile_is_the_smallest_value_with_q_percent_at_or_below(values, q):
    value = percentile(values, q)
    assert value in values
    assert sum(v <= value for v in values) * 100 >= q * len(values)
    assert sum(v < value for v in values) * 100 < q * len(values)


def test_the_canary_gate_the_autoscaler_and_the_benchmark_agree_on_p95():
    ttfts = [0.05 * i for i in range(1, 58)]         # 57 requests, like a benchmark class
    window, latency = OutcomeWindow(window_s=100), LatencyWindow(window_s=100)
    records = []
    for i, ttft in enumerate(ttfts):
        window.record(1.0, "v1", ok=True, ttft_s=ttft)
        latency.observe(1.0, ttft)
        record = RequestRecord(i, "short", 100, sent_at=0.0, first_token_at=ttft)
        record.token_times = [ttft]
        records.append(record)
    slo = SLO(ttft_s=0.5, tpot_s=0.1)
    benchmark = summarise(records, duration_s=10.0, slo=slo)["ttft_s"]["p95"]
    assert benchmark == window.stats("v1", now=2.0).ttft_p95_s == latency.p95(now=2.0)
    assert benchmark == sorted(ttfts)[-3]            # the third-slowest of 57
