"""Ray Serve custom autoscaling policies for the pools (the thin shell over ``policy``).

The policies are classes built from :func:`policy_kwargs` (Serve passes ``policy_kwargs``
to a class only): ``PrefillAutoscalingPolicy`` / ``DecodeAutoscalingPolicy`` per deployment
(:func:`autoscaling_config_for`, Serve's own delays set to 0) and ``AppAutoscalingPolicy``
for a Serve config file (:func:`app_autoscaling_policy`). They read the replicas'
``record_autoscaling_stats`` (``cluster.engine.load_report``) from Serve's context, log
and export each decision, and hold the target when they fail (docs/design.md,
"Autoscaling: the pools' own policies, a standby floor, drain on the way down").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from cluster.autoscaling.config import AutoscalingConfig, ReplicaBounds
from cluster.autoscaling.policy import (
    AppDecision,
    Pool,
    PoolLoad,
    PoolState,
    PoolView,
    ReplicaObservation,
    ScalingDecision,
    decide_app,
    decide_decode,
    decide_prefill,
)
from cluster.metrics import (
    DESIRED_REPLICAS,
    PREFILL_PER_DECODE,
    SCALE_EVENTS,
    STANDBY_FLOOR,
)
from cluster.recorder import Recorder
from cluster.slo import SLOConfig

# A child of Serve's logger, so decisions land in the controller's Serve log.
logger = logging.getLogger("ray.serve.pdserve.autoscaling")


# Where the state of this package lives inside Serve's per-deployment policy_state.
STATE_KEY = "pdserve_autoscaling"

_MODULE = "cluster.autoscaling.serve_policy"

# What the policies export is catalogued with the other metrics (cluster.metrics).
EXPORTED = (DESIRED_REPLICAS, STANDBY_FLOOR, SCALE_EVENTS, PREFILL_PER_DECODE)


def load_from_metrics(
    aggregated: Mapping[str, Mapping[Hashable, float]] | None,
    replicas: Sequence[Hashable] | None = None,
) -> PoolLoad:
    """A pool's load from ``ctx.aggregated_metrics`` ({name: {replica_id: value}}).

    ``replicas`` (``ctx.running_replicas``) fixes the order and drops replicas that have
    stopped; None takes every replica that reported something.
    """
    aggregated = aggregated or {}
    names = [f.name for f in fields(ReplicaObservation)]
    if replicas is None:
        replicas = list(dict.fromkeys(r for name in names for r in aggregated.get(name, {})))
    return PoolLoad(tuple(
        ReplicaObservation(**{name: aggregated.get(name, {}).get(replica) for name in names})
        for replica in replicas
    ))


def view_from_context(ctx: Any) -> PoolView:
    """The pure policy's view of one deployment, from Serve's ``AutoscalingContext``."""
    bounds = ReplicaBounds(
        min_replicas=ctx.capacity_adjusted_min_replicas,
        # A target capacity of 0 gives max 0; Serve clamps to it after the policy anyway.
        max_replicas=max(1, ctx.capacity_adjusted_max_replicas,
                         ctx.capacity_adjusted_min_replicas),
    )
    return PoolView(
        current=ctx.target_num_replicas,
        load=load_from_metrics(ctx.aggregated_metrics, ctx.running_replicas),
        state=PoolState.from_dict((ctx.policy_state or {}).get(STATE_KEY)),
        bounds=bounds,
        running=ctx.current_num_replicas,
    )


def policy_kwargs(autoscaling: AutoscalingConfig, slo: SLOConfig) -> dict[str, Any]:
    """The ``policy_kwargs`` a policy class is built from: the autoscaling section and the
    cluster's SLOs (the latency objectives the pools scale for)."""
    return {**autoscaling.model_dump(mode="json"), "slo": slo.model_dump(mode="json")}


class _Policy:
    """Holds the validated config, the SLOs and the exporter; subclasses decide."""

    def __init__(self, *, slo: Mapping[str, Any], **autoscaling: Any) -> None:
        self.config = AutoscalingConfig.model_validate(autoscaling)
        self.slo = SLOConfig.model_validate(slo)
        self._exporter = _DecisionExporter()


class PrefillAutoscalingPolicy(_Policy):
    """Deployment-level policy of a prefill pool (``policy_function`` of its deployment)."""

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        return _deployment_decision(self, ctx, "prefill")


class DecodeAutoscalingPolicy(_Policy):
    """Deployment-level policy of a decode pool (``policy_function`` of its deployment)."""

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        return _deployment_decision(self, ctx, "decode")


class AppAutoscalingPolicy(_Policy):
    """Application-level policy: sizes each model version's prefill and decode together.

    Deployments are told apart by name: ``prefill`` / ``decode``, or ``prefill-<version>``
    / ``decode-<version>`` (``_`` works too); pools of one version are sized together.
    ``deployment_pools`` overrides this: {deployment name: "prefill" | "decode" |
    "prefill:<version>" | "decode:<version>"}. Deployments of no pool are left alone.
    """

    def __init__(
        self, deployment_pools: dict[str, str] | None = None, **policy_kwargs: Any
    ) -> None:
        super().__init__(**policy_kwargs)
        self.deployment_pools = dict(deployment_pools or {})
        for name in self.deployment_pools:  # a typo fails the deploy, not every tick
            pool_of(name, self.deployment_pools)

    def __call__(
        self, contexts: Mapping[Any, Any]
    ) -> tuple[dict[Any, int], dict[Any, dict[str, Any]]]:
        replicas: dict[Any, int] = {}
        states: dict[Any, dict[str, Any]] = {}
        for version, members in self._versions(contexts).items():
            try:
                decisions = self._decide_version(version, members, contexts)
            except Exception:
                logger.exception("pdserve autoscaling failed for version %r; holding", version)
                decisions = {}
            for deployment_id in members.values():
                decision = decisions.get(deployment_id)
                if decision is None:  # holding: keep the memory, or Serve would drop it
                    states[deployment_id] = _kept_state(contexts[deployment_id])
                else:
                    replicas[deployment_id] = decision.desired
                    states[deployment_id] = {STATE_KEY: decision.state.to_dict()}
        return replicas, states

    def _versions(self, contexts: Mapping[Any, Any]) -> dict[str, dict[Pool, Any]]:
        versions: dict[str, dict[Pool, Any]] = {}
        for deployment_id, ctx in contexts.items():
            found = pool_of(ctx.deployment_name, self.deployment_pools)
            if found is not None:
                pool, version = found
                versions.setdefault(version, {})[pool] = deployment_id
        return versions

    def _decide_version(
        self, version: str, members: dict[Pool, Any], contexts: Mapping[Any, Any]
    ) -> dict[Any, ScalingDecision]:
        if not self.config.enabled:
            return {}  # left out of the answer, every deployment keeps its target
        prefill_id, decode_id = members.get("prefill"), members.get("decode")
        first = contexts[prefill_id if prefill_id is not None else decode_id]
        app, now = first.app_name or "", _now(first)
        if prefill_id is not None and decode_id is not None:
            both = decide_app(view_from_context(contexts[prefill_id]),
                              view_from_context(contexts[decode_id]), self.config, self.slo,
                              now)
            self._exporter.ratio(app, both)
            pairs = [(prefill_id, both.prefill), (decode_id, both.decode)]
        elif prefill_id is not None:
            view = view_from_context(contexts[prefill_id])
            pairs = [(prefill_id, decide_prefill(view, self.config.prefill, self.slo, now))]
        else:
            view = view_from_context(contexts[decode_id])
            pairs = [(decode_id, decide_decode(view, self.config.decode, self.slo, now))]
        for deployment_id, decision in pairs:
            self._exporter.report(decision, app, contexts[deployment_id].deployment_name)
        return dict(pairs)


def pool_of(
    deployment_name: str, explicit: Mapping[str, str] | None = None
) -> tuple[Pool, str] | None:
    """(pool, version) of a deployment by its name or an explicit mapping; None: no pool."""
    if explicit and deployment_name in explicit:
        pool, _, version = explicit[deployment_name].partition(":")
        if pool not in ("prefill", "decode"):
            raise ValueError(f"deployment_pools[{deployment_name!r}]: unknown pool {pool!r}")
        return pool, version  # type: ignore[return-value]
    for pool in ("prefill", "decode"):
        if deployment_name == pool:
            return pool, ""
        for separator in ("-", "_"):
            if deployment_name.startswith(pool + separator):
                return pool, deployment_name[len(pool) + 1:]
    return None


def autoscaling_config_for(
    pool_name: Pool,
    pool_replicas_bounds: ReplicaBounds | tuple[int, int] | None,
    autoscaling: AutoscalingConfig,
    slo: SLOConfig,
    initial_replicas: int | None = None,
    deployment_policy: bool = True,
) -> dict[str, Any]:
    """The ``autoscaling_config`` of a pool's Serve deployment (``ray.serve.config``'s fields).

    ``pool_replicas_bounds`` None takes the pool config's min/max; a model version passes
    its own. Serve's delays are 0 because the policy keeps its own cool-downs. With
    ``deployment_policy=False`` the policy is left out, for an application that uses
    :func:`app_autoscaling_policy` instead.
    """
    if not autoscaling.enabled:
        raise ValueError("autoscaling is disabled: deploy the pool with fixed num_replicas")
    if pool_name not in ("prefill", "decode"):
        raise ValueError(f"unknown pool {pool_name!r}: expected 'prefill' or 'decode'")
    bounds = _bounds(pool_replicas_bounds, getattr(autoscaling, pool_name).bounds)
    start = bounds.clamp(bounds.min_replicas if initial_replicas is None else initial_replicas)
    config: dict[str, Any] = {
        "min_replicas": bounds.min_replicas,
        "max_replicas": bounds.max_replicas,
        "initial_replicas": start,
        "look_back_period_s": autoscaling.look_back_period_s,
        # Serve wants several metric samples per look-back window.
        "metrics_interval_s": min(10.0, autoscaling.look_back_period_s / 2),
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
    }
    if deployment_policy:
        policy_class = "PrefillAutoscalingPolicy" if pool_name == "prefill" else (
            "DecodeAutoscalingPolicy")
        config["policy"] = {
            "policy_function": f"{_MODULE}:{policy_class}",
            "policy_kwargs": policy_kwargs(autoscaling, slo),
        }
    return config


def app_autoscaling_policy(
    autoscaling: AutoscalingConfig, slo: SLOConfig,
    deployment_pools: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``autoscaling_policy`` entry of a Serve application (config file / REST API)."""
    kwargs = policy_kwargs(autoscaling, slo)
    if deployment_pools:
        kwargs["deployment_pools"] = dict(deployment_pools)
    return {"policy_function": f"{_MODULE}:AppAutoscalingPolicy", "policy_kwargs": kwargs}


# --- the shell's plumbing -----------------------------------------------------------------


def _kept_state(ctx: Any) -> dict[str, Any]:
    return {STATE_KEY: dict((ctx.policy_state or {}).get(STATE_KEY) or {})}


def _deployment_decision(policy: _Policy, ctx: Any, pool: Pool) -> tuple[int, dict[str, Any]]:
    state = _kept_state(ctx)
    if not policy.config.enabled:
        return ctx.target_num_replicas, state
    try:
        view = view_from_context(ctx)
        if pool == "prefill":
            decision = decide_prefill(view, policy.config.prefill, policy.slo, _now(ctx))
        else:
            decision = decide_decode(view, policy.config.decode, policy.slo, _now(ctx))
    except Exception:
        # A broken input must not stop the controller's loop; holding is the safe answer.
        logger.exception("pdserve autoscaling failed for %s; holding", ctx.deployment_name)
        return ctx.target_num_replicas, state
    policy._exporter.report(decision, ctx.app_name or "", ctx.deployment_name)
    return decision.desired, {STATE_KEY: decision.state.to_dict()}


def _now(ctx: Any) -> float:
    # The controller stamps each context; the clock is read here, in the shell, only if not.
    return ctx.current_time if ctx.current_time is not None else time.time()


def _bounds(
    given: ReplicaBounds | tuple[int, int] | None, default: ReplicaBounds
) -> ReplicaBounds:
    if given is None:
        return default
    if isinstance(given, ReplicaBounds):
        return given
    low, high = given
    return ReplicaBounds(min_replicas=low, max_replicas=high)


class _DecisionExporter:
    """Logs each decision and exports it through ``ray.util.metrics``, never raising."""

    def __init__(self) -> None:
        self._recorder = Recorder()
        self._failed = False

    def report(self, decision: ScalingDecision, app: str, deployment: str) -> None:
        changes = decision.direction != "hold"
        # Holds repeat every tick; they are worth reading only when debugging.
        (logger.info if changes else logger.debug)(
            "autoscaling %s/%s (%s): %d -> %d, %s", app, deployment, decision.pool,
            decision.current, decision.desired, decision.reason)
        tags = {"application": app, "deployment": deployment, "pool": decision.pool}
        self._safely(lambda: self._recorder.set(DESIRED_REPLICAS, tags, decision.desired))
        self._safely(lambda: self._recorder.set(STANDBY_FLOOR, tags, decision.floor))
        if changes:
            self._safely(lambda: self._recorder.inc(
                SCALE_EVENTS, {**tags, "direction": decision.direction}))

    def ratio(self, app: str, decision: AppDecision) -> None:
        if decision.prefill_per_decode is not None:
            value = decision.prefill_per_decode
            self._safely(lambda: self._recorder.set(
                PREFILL_PER_DECODE, {"application": app}, value))

    def _safely(self, record: Any) -> None:
        try:
            record()
        except Exception:
            if not self._failed:  # say it once, not on every tick
                logger.warning("pdserve autoscaling metrics unavailable", exc_info=True)
            self._failed = True
