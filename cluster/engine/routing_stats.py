"""What an engine replica reports to Serve's request routers (pure).

Serve calls a deployment's ``record_routing_stats()`` every
``request_routing_stats_period_s`` and hands the dict to every router of the deployment as
``RunningReplica.routing_stats``, where ``router.replica_choice`` reads it. Only JSON-able
numbers go in (the dict crosses the controller's long-poll broadcast), and the optional
keys are left out rather than sent as 0. What the routers make of each key: docs/design.md,
"Replica choice: Serve request routers fed by replica reports".
"""

from __future__ import annotations

from cluster.engine.stats import EngineStats


def routing_stats_from(
    stats: EngineStats,
    *,
    max_num_seqs: int | None = None,
    reported_at: float | None = None,
    engine_dead: bool = False,
    engine_stalled_s: float = 0.0,
) -> dict[str, int | float]:
    """The routing-stats dict of one engine, from its ``EngineStats``."""
    report: dict[str, int | float] = {
        "queued_prefill_tokens": max(0, stats.queued_prefill_tokens),
        "running_seqs": stats.num_running,
        "waiting_seqs": stats.num_waiting,
        "kv_usage": float(stats.kv_cache_usage),
        "requests_finished": stats.requests_finished,
    }
    if max_num_seqs is not None:
        report["max_num_seqs"] = max_num_seqs
    if reported_at is not None:
        report["reported_at"] = reported_at
    if engine_dead:
        report["engine_dead"] = 1
    if engine_stalled_s > 0:
        report["engine_stalled_s"] = round(engine_stalled_s, 3)
    return report
