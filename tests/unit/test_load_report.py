"""What engine replicas report to the autoscaling policies (pure)."""

from cluster.engine.load_report import LatencyWindow, LoadReporter, RateMeter
from cluster.engine.stats import EngineStats


def test_latency_window_keeps_only_the_window_and_gives_the_nearest_rank_p95():
    window = LatencyWindow(window_s=10)
    for i in range(100):
        window.observe(now=float(i) / 10, seconds=float(i))   # t 0..9.9 s, values 0..99
    assert window.p95(now=9.9) == 94.0
    assert window.p95(now=15.0) == 97.0   # only t > 5 s are left: values 51..99
    assert window.p95(now=30.0) is None


def test_rate_meter_is_the_counter_delta_per_second():
    meter = RateMeter()
    assert meter.rate(0.0, 100) == 0.0          # no previous read
    assert meter.rate(10.0, 600) == 50.0
    assert meter.rate(10.0, 700) == 0.0         # no time passed
    assert meter.rate(20.0, 650) == 0.0         # a counter never goes back; a restart


def test_prefill_and_decode_reports_carry_their_pools_metrics():
    prefill = LoadReporter("prefill")
    stats = EngineStats(role="prefill", engine_id="p", queued_prefill_tokens=4096)
    assert prefill.report(stats, now=0.0) == {"queued_prefill_tokens": 4096.0,
                                              "prompt_tokens_per_s": 0.0}
    stats.prompt_tokens_computed, stats.prompt_tokens_cached = 1500, 500
    prefill.latency.observe(9.0, 0.25)
    assert prefill.report(stats, now=10.0) == {"queued_prefill_tokens": 4096.0,
                                               "prompt_tokens_per_s": 200.0,
                                               "ttft_p95_s": 0.25}
    decode = LoadReporter("decode")
    stats = EngineStats(role="decode", engine_id="d", num_running=12, kv_cache_usage=0.5,
                        generation_tokens=300)
    report = decode.report(stats, now=1.0)
    assert report == {"running_seqs": 12.0, "kv_usage": 0.5, "output_tokens_per_s": 0.0}
    assert "itl_p95_s" not in report  # nothing observed: left out, not 0
