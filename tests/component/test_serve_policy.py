"""The autoscaling policies' Ray Serve adapter: Serve's own wrappers and schemas, no Ray started."""

from dataclasses import fields

import pytest
from pydantic import ValidationError

from cluster.autoscaling import serve_policy
from cluster.autoscaling.config import (
    AutoscalingConfig,
    PrefillScalingConfig,
    ReplicaBounds,
    StandbySchedule,
    StandbyWindow,
)
from cluster.autoscaling.policy import ReplicaObservation
from cluster.engine import load_report
from cluster.slo import SLOConfig
from tests.unit.test_autoscaling_policy import CONFIG, SLO, T

KWARGS = serve_policy.policy_kwargs(CONFIG, SLO)  # what Serve builds a policy class from

ray_config = pytest.importorskip("ray.serve.config")


def test_metric_names_are_the_observation_fields():
    names = {f.name for f in fields(ReplicaObservation)}
    reported = set(load_report.PREFILL_METRICS) | set(load_report.DECODE_METRICS)
    assert reported == names
    assert not set(load_report.PREFILL_METRICS) & set(load_report.DECODE_METRICS)


def test_autoscaling_config_for_validates_as_serves_autoscaling_config():
    evening = StandbySchedule(timezone="Europe/Berlin", windows=[
        StandbyWindow(start="17:00", end="23:00", min_replicas=4, days=["mon", "fri"])])
    autoscaling = AutoscalingConfig(prefill=PrefillScalingConfig(
        min_replicas=2, max_replicas=6, standby=evening))
    data = serve_policy.autoscaling_config_for("prefill", None, autoscaling, SLO)
    serve = ray_config.AutoscalingConfig(**data)
    assert (serve.min_replicas, serve.max_replicas, serve.initial_replicas) == (2, 6, 2)
    assert (serve.upscale_delay_s, serve.downscale_delay_s) == (0, 0)
    assert serve.look_back_period_s == autoscaling.look_back_period_s
    assert serve.policy.policy_function == (
        "cluster.autoscaling.serve_policy:PrefillAutoscalingPolicy")
    kwargs = dict(serve.policy.policy_kwargs)
    assert SLOConfig.model_validate(kwargs.pop("slo")) == SLO
    assert AutoscalingConfig.model_validate(kwargs) == autoscaling

    per_version = serve_policy.autoscaling_config_for(
        "decode", ReplicaBounds(min_replicas=1, max_replicas=3), autoscaling, SLO,
        initial_replicas=9)
    serve = ray_config.AutoscalingConfig(**per_version)
    assert (serve.min_replicas, serve.max_replicas, serve.initial_replicas) == (1, 3, 3)
    assert serve.policy.policy_function.endswith(":DecodeAutoscalingPolicy")
    bare = serve_policy.autoscaling_config_for("decode", (1, 3), autoscaling, SLO,
                                               deployment_policy=False)
    assert ray_config.AutoscalingConfig(**bare).policy.is_default_policy_function()


def test_autoscaling_config_for_refuses_a_disabled_config_and_unknown_pools():
    with pytest.raises(ValueError, match="disabled"):
        serve_policy.autoscaling_config_for("prefill", None,
                                            AutoscalingConfig(enabled=False), SLO)
    with pytest.raises(ValueError, match="unknown pool"):
        serve_policy.autoscaling_config_for("router", None, AutoscalingConfig(), SLO)  # type: ignore
    with pytest.raises(ValidationError):
        serve_policy.autoscaling_config_for("prefill", (5, 2), AutoscalingConfig(), SLO)


def _context(name, metrics, *, current=2, target=None, state=None, now=T, app="app",
             bounds=(1, 16)):
    from ray.serve._private.common import DeploymentID, ReplicaID

    deployment = DeploymentID(name=name, app_name=app)
    replicas = [ReplicaID(unique_id=f"{name}-{i}", deployment_id=deployment)
                for i in range(current)]
    aggregated = {metric: {replicas[i]: value for i, value in enumerate(values)}
                  for metric, values in metrics.items()}
    return ray_config.AutoscalingContext(
        deployment_id=deployment, deployment_name=name, app_name=app,
        current_num_replicas=current,
        target_num_replicas=current if target is None else target,
        running_replicas=replicas, total_num_requests=1.0, total_queued_requests=0.0,
        aggregated_metrics=lambda: aggregated, raw_metrics=None,
        capacity_adjusted_min_replicas=bounds[0], capacity_adjusted_max_replicas=bounds[1],
        policy_state=dict(state or {}), last_scale_up_time=None, last_scale_down_time=None,
        current_time=now, config=None)


def _serve_wrapped(policy_dict, app_level=False):
    # Serve's own path: deserialize the policy, instantiate the class with policy_kwargs,
    # wrap it with delays/factors (private API of the pinned ray 2.60).
    from ray.serve._private.autoscaling_state import _resolve_policy_callable
    from ray.serve.autoscaling_policy import (
        _apply_app_level_autoscaling_config,
        _apply_autoscaling_config,
    )

    policy = ray_config.AutoscalingPolicy(**policy_dict)
    wrap = _apply_app_level_autoscaling_config if app_level else _apply_autoscaling_config
    return wrap(_resolve_policy_callable(policy))


def test_the_deployment_policy_runs_through_serves_wrapper_and_keeps_its_state():
    data = serve_policy.autoscaling_config_for("prefill", (1, 16), CONFIG, SLO)
    serve = ray_config.AutoscalingConfig(**data)
    policy = _serve_wrapped(data["policy"])
    ctx = _context("prefill", {"queued_prefill_tokens": [30_000.0, 11_000.0],
                               "ttft_p95_s": [0.3, 0.3]})
    ctx.config = serve
    replicas, state = policy(ctx)
    assert replicas == 4                   # 41k / 16k, with the hysteresis (20%) to spare
    assert state[serve_policy.STATE_KEY]["last_scale_up_s"] == T
    # Next tick: the state comes back through policy_state; the TTFT breach must wait for
    # the new replica to start.
    ctx = _context("prefill", {"queued_prefill_tokens": [10_000.0, 10_000.0],
                               "ttft_p95_s": [0.9, 0.9]}, target=4, state=state, now=T + 5)
    ctx.config = serve
    assert policy(ctx)[0] == 4


def test_the_app_policy_entry_validates_in_a_serve_application_config():
    from ray.serve.schema import ServeApplicationSchema

    entry = serve_policy.app_autoscaling_policy(CONFIG, SLO, {"pf": "prefill:v1"})
    deployment = serve_policy.autoscaling_config_for("prefill", None, CONFIG, SLO,
                                                     deployment_policy=False)
    app = ServeApplicationSchema(import_path="cluster.app:build", autoscaling_policy=entry,
                                 deployments=[{"name": "pf", "autoscaling_config": deployment}])
    assert app.autoscaling_policy["policy_function"].endswith(":AppAutoscalingPolicy")
    policy = serve_policy.AppAutoscalingPolicy(**app.autoscaling_policy["policy_kwargs"])
    assert policy.config == CONFIG and policy.deployment_pools == {"pf": "prefill:v1"}


def test_the_app_policy_sizes_each_versions_pools_and_leaves_other_deployments_alone():
    policy = _serve_wrapped(serve_policy.app_autoscaling_policy(CONFIG, SLO), app_level=True)
    serve = ray_config.AutoscalingConfig(
        **serve_policy.autoscaling_config_for("prefill", (1, 16), CONFIG, SLO,
                                              deployment_policy=False))
    contexts = {}
    for name, metrics in [
        ("prefill", {"queued_prefill_tokens": [40_000.0, 40_000.0],
                     "prompt_tokens_per_s": [20_000.0, 20_000.0]}),
        ("decode", {"running_seqs": [100.0, 100.0], "output_tokens_per_s": [2000.0, 2000.0]}),
        ("prefill-v2", {"queued_prefill_tokens": [0.0, 0.0], "ttft_p95_s": [0.1, 0.1]}),
        ("router", {}),
    ]:
        ctx = _context(name, metrics)
        ctx.config = serve
        contexts[ctx.deployment_id] = ctx
    decisions, states = policy(contexts)
    by_name = {key.name: value for key, value in decisions.items()}
    assert "router" not in by_name
    assert by_name["prefill"] == 4                                 # x2 step from 2
    assert by_name["decode"] > 2                                   # taken along by the mix
    assert by_name["prefill-v2"] == 2                              # idle, waits to shrink
    assert all(serve_policy.STATE_KEY in states[key] for key in decisions)


def test_the_app_policy_keeps_its_memory_when_a_version_fails(monkeypatch):
    policy = serve_policy.AppAutoscalingPolicy(**KWARGS)
    memory = {serve_policy.STATE_KEY: {"last_scale_up_s": T - 10}}
    ctx = _context("prefill", {}, state=memory)
    ctx._aggregated_metrics_value = lambda: 1 / 0
    decisions, states = policy({ctx.deployment_id: ctx})
    assert decisions == {} and states[ctx.deployment_id] == memory
    with pytest.raises(ValueError, match="unknown pool"):
        serve_policy.AppAutoscalingPolicy(deployment_pools={"x": "router"}, **KWARGS)


def test_pools_are_found_by_name_or_by_explicit_mapping():
    assert serve_policy.pool_of("prefill") == ("prefill", "")
    assert serve_policy.pool_of("decode-llama-70b") == ("decode", "llama-70b")
    assert serve_policy.pool_of("decode_v2") == ("decode", "v2")
    assert serve_policy.pool_of("router") is None
    assert serve_policy.pool_of("prefiller") is None
    assert serve_policy.pool_of("pf", {"pf": "prefill:v3"}) == ("prefill", "v3")
    with pytest.raises(ValueError, match="unknown pool"):
        serve_policy.pool_of("x", {"x": "router"})


def test_each_decision_is_logged_with_its_reason_and_exported(monkeypatch, caplog):
    recorded = []

    def record(self, spec, tags, value=1.0):
        recorded.append((spec.name, tags, value))

    monkeypatch.setattr(serve_policy.Recorder, "set", record)
    monkeypatch.setattr(serve_policy.Recorder, "inc", record)
    policy = serve_policy.PrefillAutoscalingPolicy(**KWARGS)
    with caplog.at_level("INFO", logger="ray.serve.pdserve.autoscaling"):
        policy(_context("prefill", {"queued_prefill_tokens": [30_000.0, 11_000.0]}))
    assert ("app/prefill (prefill): 2 -> 4, up: queued prefill tokens 41k > 2 x 16k target "
            "(to 4, 20% spare)") in caplog.text
    tags = {"application": "app", "deployment": "prefill", "pool": "prefill"}
    assert ("pdserve_autoscaling_desired_replicas", tags, 4) in recorded
    assert ("pdserve_autoscaling_standby_floor_replicas", tags, 0) in recorded
    assert ("pdserve_autoscaling_scale_events_total", {**tags, "direction": "up"}, 1.0) in (
        recorded)
    from cluster.metrics import CATALOGUE  # catalogued with the others, for the dashboard

    assert set(serve_policy.EXPORTED) <= set(CATALOGUE)


def test_a_failing_metrics_export_never_breaks_scaling(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no metrics agent")

    monkeypatch.setattr(serve_policy.Recorder, "set", broken)
    monkeypatch.setattr(serve_policy.Recorder, "inc", broken)
    policy = serve_policy.PrefillAutoscalingPolicy(**KWARGS)
    ctx = _context("prefill", {"queued_prefill_tokens": [40_000.0, 40_000.0]})
    assert policy(ctx)[0] == 4


def test_a_failing_policy_holds_the_current_target():
    policy = serve_policy.DecodeAutoscalingPolicy(**KWARGS)
    ctx = _context("decode", {}, target=5, state={serve_policy.STATE_KEY: {"x": 1}})
    ctx._aggregated_metrics_value = lambda: 1 / 0
    replicas, state = policy(ctx)
    assert replicas == 5 and state == {serve_policy.STATE_KEY: {"x": 1}}


def test_a_disabled_config_holds():
    policy = serve_policy.PrefillAutoscalingPolicy(
        **serve_policy.policy_kwargs(AutoscalingConfig(enabled=False), SLO))
    ctx = _context("prefill", {"queued_prefill_tokens": [10**6, 10**6]}, target=2)
    assert policy(ctx)[0] == 2


def test_load_from_metrics_keeps_running_replicas_only_and_marks_missing_values():
    load = serve_policy.load_from_metrics(
        {"running_seqs": {"a": 3.0, "gone": 9.0}, "kv_usage": {"b": 0.5}}, ["a", "b"])
    assert load.total("running_seqs") == 3.0 and load.mean("kv_usage") == 0.5
    assert load.replicas[1].running_seqs is None
    assert len(serve_policy.load_from_metrics({"running_seqs": {"a": 1.0}}).replicas) == 1
