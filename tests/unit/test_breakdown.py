"""The stage breakdown `pdserve bench` prints, read from two scrapes of the stage
histogram (tools/bench/breakdown.py)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster import metrics as m
from tools.bench import breakdown

NAME = m.STAGE.exported_name


def histogram_lines(name: str, labels: str, bounds: tuple[float, ...],
                    values: list[float]) -> list[str]:
    """One labelled series of histogram ``name`` in Prometheus text: ``values``
    (seconds) in buckets of ``bounds`` (and +Inf), their sum and count."""
    lines = []
    for bound in (*bounds, float("inf")):
        le = "+Inf" if bound == float("inf") else repr(bound)
        count = sum(value <= bound for value in values)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}')
    lines.append(f"{name}_sum{{{labels}}} {sum(values)}")
    lines.append(f"{name}_count{{{labels}}} {len(values)}")
    return lines


def scrape(stages: dict[str, list[float]], worker: str = "w1") -> str:
    """Prometheus text of the stage histogram with ``stages``' observations (seconds)."""
    lines = [f"# TYPE {NAME} histogram"]
    for stage, values in stages.items():
        labels = f'model="m",path="disaggregated",stage="{stage}",WorkerId="{worker}"'
        lines += histogram_lines(NAME, labels, m.STAGE_BUCKETS, values)
    return "\n".join(lines) + "\n"


def samples(text: str) -> breakdown.StageSamples:
    return breakdown.stage_samples(text_string_to_metric_families(text))


def test_only_the_requests_between_the_scrapes_count():
    earlier = {"render": [0.001] * 10, "first_token": [0.1] * 10}
    before = samples(scrape(earlier))
    after = samples(scrape({"render": [0.001] * 10 + [0.003] * 4,
                            "prefill": [0.2] * 4,
                            "first_token": [0.1] * 10 + [0.05] * 4}))
    assert breakdown.answered(before, after) == 4
    stages = breakdown.breakdown(before, after)
    assert list(stages) == ["render", "prefill", "first_token"]  # in STAGES order
    assert stages["render"]["requests"] == 4
    assert stages["render"]["mean_s"] == pytest.approx(0.003)
    assert stages["prefill"]["mean_s"] == pytest.approx(0.2)
    assert stages["first_token"]["mean_s"] == pytest.approx(0.05)
    # every observation in one bucket: the quantiles lie inside it
    assert 0.002 < stages["render"]["p50_s"] <= 0.005
    assert 0.1 < stages["prefill"]["p95_s"] <= 0.2


def test_series_of_several_router_processes_add_up():
    text = scrape({"admission": [0.01]}, "w1") + scrape({"admission": [0.03]}, "w2").split(
        "\n", 1)[1]
    stages = breakdown.breakdown({}, samples(text))
    assert stages["admission"]["requests"] == 2
    assert stages["admission"]["mean_s"] == pytest.approx(0.02)


def test_quantiles_interpolate_within_a_bucket_as_prometheus_does():
    buckets = [(0.1, 0.0), (0.2, 10.0), (float("inf"), 10.0)]
    assert breakdown.quantile(0.5, buckets) == pytest.approx(0.15)
    assert breakdown.quantile(0.95, buckets) == pytest.approx(0.195)
    # beyond the last finite bound: that bound
    assert breakdown.quantile(0.99, [(0.1, 1.0), (float("inf"), 10.0)]) == pytest.approx(0.1)


def test_the_table_is_in_milliseconds():
    stages = {"render": {"requests": 3, "mean_s": 0.0021, "p50_s": 0.002, "p95_s": 0.004}}
    row = breakdown.table(stages).splitlines()[1].split()
    assert row == ["render", "3", "2.1", "2.0", "4.0"]


def engine_scrape(pool: str, phase: str, values: list[float]) -> str:
    """Prometheus text of the engines' phase histogram, as a replica exports it."""
    name = m.ENGINE_PHASE.exported_name
    labels = f'version="v1",pool="{pool}",replica="r",phase="{phase}",WorkerId="e"'
    lines = [f"# TYPE {name} histogram"]
    for bound in (*m.STAGE_BUCKETS, float("inf")):
        le = "+Inf" if bound == float("inf") else repr(bound)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {sum(v <= bound for v in values)}')
    lines.append(f"{name}_sum{{{labels}}} {sum(values)}")
    lines.append(f"{name}_count{{{labels}}} {len(values)}")
    return "\n".join(lines) + "\n"


def test_the_engines_part_of_the_pool_stages_follows_the_stages():
    text = (scrape({"prefill": [0.05] * 3, "first_token": [0.04] * 3})
            + engine_scrape("prefill", "prefill", [0.01] * 3)
            + engine_scrape("decode", "queued", [0.001] * 3))
    stages = breakdown.breakdown({}, samples(text))
    assert list(stages) == ["prefill", "first_token", "prefill engine prefill",
                            "decode engine queued"]
    assert stages["prefill engine prefill"]["mean_s"] == pytest.approx(0.01)
    assert breakdown.answered({}, samples(text)) == 3  # engines' requests are not answers
    assert "of which in the engines" in breakdown.table(stages)


def test_the_replicas_hops_to_their_engines_follow_the_engines_and_are_named_apart():
    text = (scrape({"prefill": [0.05] * 2, "first_token": [0.04] * 2})
            + engine_scrape("decode", "from_engine", [0.0012] * 2)
            + engine_scrape("prefill", "prefill", [0.01] * 2)
            + engine_scrape("prefill", "to_engine", [0.0014] * 2))
    stages = breakdown.breakdown({}, samples(text))
    assert list(stages) == ["prefill", "first_token", "prefill engine prefill",
                            "prefill replica to engine", "decode engine to replica"]
    assert stages["decode engine to replica"]["requests"] == 2
    lines = breakdown.table(stages).splitlines()
    heading = lines.index("  and between each replica and its engine:")
    assert lines[heading + 1].split()[:4] == ["prefill", "replica", "to", "engine"]
    assert lines.index("  of which in the engines:") < heading


def vllm_scrape(phases: dict[str, list[float]]) -> str:
    """A vLLM server's /metrics text: histograms with vLLM 0.32's names, labels (one
    engine) and coarse buckets, its phases beside one of another name."""
    lines = []
    for name, values in phases.items():
        lines += [f"# HELP {name} h", f"# TYPE {name} histogram",
                  *histogram_lines(name, 'engine="0",model_name="m"', (0.3, 0.5), values)]
    return "\n".join(lines) + "\n"


def vllm_totals(text: str) -> breakdown.VllmPhaseTotals:
    return breakdown.vllm_phase_totals(text_string_to_metric_families(text))


def test_a_vllm_servers_engine_phases_are_the_means_of_the_requests_between_scrapes():
    queued, prefill = "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"
    before = vllm_totals(vllm_scrape({queued: [0.5, 0.5], prefill: [1.0, 1.0],
                                      "vllm:e2e_request_latency_seconds": [2.0]}))
    after = vllm_totals(vllm_scrape({queued: [0.5, 0.5, 0.001, 0.003],
                                     prefill: [1.0, 1.0, 0.018, 0.022],
                                     "vllm:e2e_request_latency_seconds": [2.0, 0.1]}))
    means = breakdown.vllm_phase_means(before, after)
    assert set(means) == {"engine queued", "engine prefill"}
    assert means["engine queued"]["requests"] == 2
    assert means["engine queued"]["mean_s"] == pytest.approx(0.002)
    assert means["engine prefill"]["mean_s"] == pytest.approx(0.020)


def test_no_request_between_the_scrapes_gives_no_vllm_phase():
    text = vllm_scrape({"vllm:request_prefill_time_seconds": [0.02]})
    assert breakdown.vllm_phase_means(vllm_totals(text), vllm_totals(text)) == {}


def test_a_stages_mean_is_its_exact_sum_where_the_cluster_exports_one():
    """Ray's exporter sums a histogram's observations at their buckets' midpoints (16 ms
    counted as 17.5 in the 15-20 ms bucket); the companion counter has the exact sum."""
    total = m.STAGE_TOTAL.exported_name
    labels = 'model="m",path="disaggregated",stage="first_token",WorkerId="w1"'

    def with_exact(values: list[float], midpoint_sum: float) -> str:
        text = scrape({"first_token": values}).replace(
            f"{NAME}_sum{{{labels}}} {sum(values)}", f"{NAME}_sum{{{labels}}} {midpoint_sum}")
        return text + f"# TYPE {total} counter\n{total}{{{labels}}} {sum(values)}\n"

    before = samples(with_exact([0.016] * 2, 0.035))
    after = samples(with_exact([0.016] * 6, 0.105))
    row = breakdown.breakdown(before, after)["first_token"]
    assert row["requests"] == 4
    assert row["mean_s"] == pytest.approx(0.016)  # not the midpoints' 0.0175
    # a cluster that exports no such counter: the histogram's own sum
    plain = breakdown.breakdown(samples(scrape({"first_token": [0.016] * 2})),
                                samples(scrape({"first_token": [0.016] * 6})))
    assert plain["first_token"]["mean_s"] == pytest.approx(0.016)
