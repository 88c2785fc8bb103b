"""One set of SLOs: the autoscaler, the dashboard and the benchmark read the config's `slo`."""

import yaml

from cluster.autoscaling.policy import PoolLoad, PoolView, decide_decode, decide_prefill
from cluster.autoscaling.serve_policy import (
    AppAutoscalingPolicy,
    DecodeAutoscalingPolicy,
    PrefillAutoscalingPolicy,
    autoscaling_config_for,
)
from cluster.config import SLOConfig, load_config
from cluster.dashboard import build_dashboard
from cluster.serve_config import serve_config
from tools.bench.stats import SLO, RequestRecord, summarise

T = 1_750_000_000.0
CHANGED = {"ttft_p95_s": 0.3, "itl_p95_s": 0.02, "tpot_s": 0.04}


def slo_lines(slo: SLOConfig) -> dict[str, list[str]]:
    """The SLO line queries of each dashboard panel that has one."""
    return {panel["title"]: [t["expr"] for t in panel["targets"] if t["legendFormat"] == "SLO"]
            for panel in build_dashboard(slo)["panels"]}


def test_the_autoscaler_the_dashboard_and_the_bench_read_one_slo_section(tmp_path):
    path = tmp_path / "pdserve.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "m", "path": "/models/m"},
                                    "autoscaling": {}, "slo": CHANGED}))
    config = load_config(path)
    assert config.slo == SLOConfig(**CHANGED) and all(
        getattr(SLOConfig(), name) != value for name, value in CHANGED.items())

    # the dashboard's SLO lines
    lines = slo_lines(config.slo)
    assert lines["Time to first token vs SLO"] == ["vector(0.3)"]
    assert lines["Inter-token latency vs SLO"] == ["vector(0.02)"]

    # the benchmark's goodput: a request within the defaults but not within these is not good
    record = RequestRecord(0, "short", 100, sent_at=0.0, first_token_at=0.4,
                           token_times=[0.4, 0.45, 0.5], output_tokens=3)
    bench = SLO.from_config(config.slo)
    assert bench == SLO(ttft_s=0.3, tpot_s=0.04)
    assert summarise([record], 1.0, bench)["goodput_requests_per_s"] == 0.0
    assert summarise([record], 1.0, SLO.from_config(SLOConfig()))["goodput_requests_per_s"] == 1.0

    # the autoscaler: each pool's policy and the application-level one, as Serve builds them
    pools = {role: autoscaling_config_for(role, config.scaling_bounds("v1", role),
                                          config.autoscaling, config.slo)["policy"]
             for role in ("prefill", "decode")}
    app = serve_config(config, path)["applications"][0]["autoscaling_policy"]
    policies = [PrefillAutoscalingPolicy(**pools["prefill"]["policy_kwargs"]),
                DecodeAutoscalingPolicy(**pools["decode"]["policy_kwargs"]),
                AppAutoscalingPolicy(**app["policy_kwargs"])]
    assert all(policy.slo == config.slo for policy in policies)
    # latencies that meet the default objectives break these: both pools scale up
    policy = policies[0]
    slow_ttft = PoolView(4, PoolLoad.spread(4, ttft_p95_s=0.4), running=4)
    prefill = decide_prefill(slow_ttft, policy.config.prefill, policy.slo, T)
    assert prefill.direction == "up" and prefill.reason.endswith("> 0.30 s SLO")
    slow_itl = PoolView(4, PoolLoad.spread(4, itl_p95_s=0.03), running=4)
    decode = decide_decode(slow_itl, policy.config.decode, policy.slo, T)
    assert decode.direction == "up" and decode.reason.endswith("> 0.02 s SLO")


def test_by_default_the_dashboard_draws_the_objectives_the_autoscaler_scales_for():
    # It used to draw 0.1 s for ITL while the decode pool scaled for 0.05 s.
    lines = slo_lines(SLOConfig())
    assert lines["Inter-token latency vs SLO"] == [f"vector({SLOConfig().itl_p95_s})"]
    assert lines["Time to first token vs SLO"] == [f"vector({SLOConfig().ttft_p95_s})"]
