"""The engine's statistics from vLLM's stat-logger callbacks (shell): ``EngineStats``, the
Prometheus metrics and the step watch fed after every engine step, and the vLLM Prometheus
logger an engine is given (``engine.vllm_metrics``).
"""

from __future__ import annotations

import time
from typing import Any

from cluster import metrics as m
from cluster.engine.stall import StepWatch
from cluster.engine.stats import EngineStats
from cluster.recorder import Counts, Recorder


def stats_logger_factory(stats: EngineStats, recorder: Recorder, counts: Counts,
                         tags: dict[str, str], steps: StepWatch):
    """A vLLM stat-logger factory whose loggers feed ``stats``, the Prometheus metrics and
    ``steps`` (the engine core reports its scheduler's stats after every step)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            publish_gauges(recorder, tags, stats)

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if scheduler_stats is not None:
                steps.stepped(time.monotonic(), has_requests=_holds_requests(scheduler_stats))
                _observe_scheduler(stats, recorder, tags, scheduler_stats)
                _observe_speculation(stats, counts, tags, scheduler_stats.spec_decoding_stats)
            if iteration_stats is not None:
                _observe_iteration(stats, recorder, counts, tags, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Logger


def _holds_requests(scheduler_stats: Any) -> bool:
    """The scheduler holds requests after this step: running, waiting, or waiting aside
    (vLLM's deferred queue, e.g. a request whose KV is still being pulled)."""
    return bool(scheduler_stats.num_running_reqs or scheduler_stats.num_waiting_reqs
                or getattr(scheduler_stats, "num_skipped_waiting_reqs", 0))


def vllm_metrics_logger(export: bool):
    """vLLM's Prometheus stat logger: through Ray's metrics (vLLM's own wrapper, which Ray
    Serve LLM uses) when ``export`` (``engine.vllm_metrics``), else one that records nothing.

    vLLM adds its plain Prometheus logger to every engine given none: inside a Ray replica
    its registry is scraped by nobody, yet it records on every step (3% of a decode
    replica's py-spy samples under streaming load: docs/benchmarks.md). Giving vLLM a logger
    of that class is how it is told not to.
    """
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    if export:
        from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

        return RayPrometheusStatLogger

    class _Unexported(PrometheusStatLogger):
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None):
            pass

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def log_metrics_info(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return _Unexported


def _observe_scheduler(stats: EngineStats, recorder: Recorder, tags, scheduler_stats) -> None:
    stats.observe_scheduler(
        scheduler_stats.kv_cache_usage,
        scheduler_stats.num_running_reqs,
        scheduler_stats.num_waiting_reqs,
    )
    data = scheduler_stats.kv_connector_stats
    if not data:
        return
    # NixlKVConnectorStats.data: lists of per-transfer observations since the last report.
    durations = data.get("transfer_duration", [])
    num_bytes = int(sum(data.get("bytes_transferred", [])))
    failures = sum(
        len(data.get(key, []))
        for key in ("num_failed_transfers", "num_failed_handshakes", "num_failed_notifications")
    )
    leases_expired = len(data.get("num_kv_expired_reqs", []))  # the producer's side
    stats.observe_transfers(num_transfers=len(durations), num_bytes=num_bytes,
                            failures=failures, leases_expired=leases_expired)
    for seconds in durations:
        recorder.observe(m.KV_TRANSFER_SECONDS, tags, seconds)
    recorder.inc(m.KV_TRANSFER_BYTES, tags, num_bytes)
    recorder.inc(m.KV_TRANSFER_FAILURES, tags, failures)
    recorder.inc(m.KV_LEASES_EXPIRED, tags, leases_expired)


def _observe_speculation(stats: EngineStats, counts: Counts, tags, spec) -> None:
    """A step's speculative-decoding counts (None when the engine does not speculate)."""
    if spec is None:
        return
    stats.observe_speculation(spec.num_draft_tokens, spec.num_accepted_tokens)
    counts.add(m.SPEC_TOKENS, {**tags, "kind": "drafted"}, spec.num_draft_tokens)
    counts.add(m.SPEC_TOKENS, {**tags, "kind": "accepted"}, spec.num_accepted_tokens)


def publish_gauges(recorder: Recorder, tags: dict[str, str], stats: EngineStats) -> None:
    recorder.set(m.REPLICAS, tags, 1)
    recorder.set(m.KV_USAGE, tags, stats.kv_cache_usage)
    recorder.set(m.RUNNING, tags, stats.num_running)
    recorder.set(m.WAITING, tags, stats.num_waiting)


def _observe_iteration(stats: EngineStats, recorder: Recorder, counts: Counts, tags,
                       iteration_stats) -> None:
    tokens = iteration_stats.prompt_token_stats
    stats.observe_iteration(
        computed=tokens.computed,
        cached=tokens.local_cache_hit,
        transferred=tokens.external_kv_transfer,
        generation_tokens=iteration_stats.num_generation_tokens,
        finished=len(iteration_stats.finished_requests),
    )
    for source, count in (("computed", tokens.computed), ("cached", tokens.local_cache_hit),
                          ("transferred", tokens.external_kv_transfer)):
        counts.add(m.ENGINE_PROMPT_TOKENS, {**tags, "source": source}, count)
    counts.add(m.ENGINE_GENERATION_TOKENS, tags, iteration_stats.num_generation_tokens)
    for finished in iteration_stats.finished_requests:
        recorder.observe(m.ENGINE_PHASE, {**tags, "phase": "queued"}, finished.queued_time)
        recorder.observe(m.ENGINE_PHASE, {**tags, "phase": "prefill"}, finished.prefill_time)
