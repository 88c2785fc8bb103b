"""What an engine replica reports to Serve's request routers (pure).

Serve calls a deployment's ``record_routing_stats()`` every
``request_routing_stats_period_s`` and hands the returned dict to every router of the
deployment as ``RunningReplica.routing_stats``; ``router.replica_choice`` reads it. Only
plain JSON-able numbers go in: the dict crosses the controller's long-poll broadcast.

Keys:

- ``queued_prefill_tokens``: prompt tokens waiting for or in prefill on this engine.
- ``running_seqs`` / ``waiting_seqs``: the scheduler's running and waiting requests.
- ``kv_usage``: share of the KV cache in use, 0..1.
- ``max_num_seqs``: the engine's sequence limit (when known), to make counts relative.
- ``requests_finished``: requests the engine has finished since it started (a counter).
  Routers derive the pool's request rate from it, and from that how much the other
  router replicas send (``router.replica_choice.OtherRouters``).
- ``engine_dead``: 1 when the replica's engine died (the actor lives on until Serve's
  health check replaces it); routers rank it last. Absent otherwise.
- ``engine_stalled_s``: seconds the engine has held requests without a step
  (cluster/engine/stall.py), when above 0. The other figures are then the ones it had when
  it stopped; routers rank a replica stalled for longer than their ``stale_after_s`` as
  they rank one whose reports stopped. Absent otherwise.
- ``reported_at``: wall-clock time of the report (when given). Routers use it to drop
  their own tally of requests the report already includes, and to rank a replica whose
  reports stopped coming last.
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
