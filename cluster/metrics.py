"""pdserve's Prometheus metrics: the catalogue (pure; cluster/recorder.py records to it via Ray).

Metrics are recorded with ``ray.util.metrics`` in whichever replica observes them (the
router for what clients experience, each engine replica for its pool), and Ray exports them
from every node at ``ray.metrics_export_port`` (``/metrics``), where Prometheus scrapes them
(Ray writes a service-discovery file for multi-node clusters). Ray prefixes every name with
``ray_``: ``pdserve_time_to_first_token_seconds`` is scraped as
``ray_pdserve_time_to_first_token_seconds``, with one series per worker process
(``WorkerId`` label) — sum over it in queries.

``CATALOGUE`` is the single list of names, types, labels and buckets; the Grafana
dashboard (``ray_configs/grafana/pdserve-dashboard.json``) is tested against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EXPORT_PREFIX = "ray_"

# Latency buckets (seconds) spanning sub-millisecond CPU steps to multi-second long prompts.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
# Stages of one request (router/timing.py): from tenths of a millisecond (rendering a short
# prompt) to a long prompt's prefill, finest where the serving layer's milliseconds are.
# Ray's exporter rebuilds a histogram's sum from its buckets' midpoints, so a stage's mean
# is only as exact as its bucket.
STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
                 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0)
TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

REQUEST_TAGS = ("model", "version", "path")
POOL_TAGS = ("version", "pool", "replica")

Kind = Literal["counter", "gauge", "histogram"]
Outcome = Literal["ok", "client_error", "rejected", "failed", "cancelled"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    description: str
    tags: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def exported_name(self) -> str:
        return EXPORT_PREFIX + self.name


# --- what clients experience (recorded by the router) -----------------------------------
TTFT = MetricSpec("pdserve_time_to_first_token_seconds", "histogram",
                  "Arrival at the router to the first generated token", REQUEST_TAGS,
                  LATENCY_BUCKETS)
ITL = MetricSpec("pdserve_inter_token_latency_seconds", "histogram",
                 "Gap between consecutive generated tokens of one stream", REQUEST_TAGS,
                 LATENCY_BUCKETS)
E2E = MetricSpec("pdserve_e2e_latency_seconds", "histogram",
                 "Arrival at the router to the last token", REQUEST_TAGS, LATENCY_BUCKETS)
QUEUE = MetricSpec("pdserve_queue_time_seconds", "histogram",
                   "Arrival at the router to dispatch to the prefill pool", REQUEST_TAGS,
                   LATENCY_BUCKETS)
STAGE = MetricSpec("pdserve_request_stage_seconds", "histogram",
                   "Time to the first event by stage (render, admission, prefill, "
                   "first_token, first_event; router/timing.py): consecutive, they add up "
                   "to the request's arrival to its first event", (*REQUEST_TAGS, "stage"),
                   STAGE_BUCKETS)
REQUESTS = MetricSpec("pdserve_requests_total", "counter", "Requests by outcome",
                      ("model", "version", "path", "outcome"))
PROMPT_TOKENS = MetricSpec("pdserve_prompt_tokens_total", "counter",
                           "Prompt tokens of served requests", REQUEST_TAGS)
GENERATION_TOKENS = MetricSpec("pdserve_generation_tokens_total", "counter",
                               "Tokens generated for clients", REQUEST_TAGS)
OUTPUT_CHUNKS = MetricSpec("pdserve_output_chunks_total", "counter",
                           "Outputs the decode pool sent for clients' tokens (generation "
                           "tokens / chunks: tokens per chunk; decode/pacing.py)",
                           REQUEST_TAGS)

# --- each pool (recorded by its engine replicas) ----------------------------------------
REPLICAS = MetricSpec("pdserve_pool_replicas", "gauge",
                      "1 per live engine replica (sum for the pool size)", POOL_TAGS)
RUNNING = MetricSpec("pdserve_pool_running_requests", "gauge",
                     "Requests the engine is running", POOL_TAGS)
WAITING = MetricSpec("pdserve_pool_waiting_requests", "gauge",
                     "Requests waiting in the engine's queue", POOL_TAGS)
KV_USAGE = MetricSpec("pdserve_kv_cache_usage_ratio", "gauge",
                      "Fraction of KV-cache blocks in use (0..1)", POOL_TAGS)
ENGINE_PROMPT_TOKENS = MetricSpec("pdserve_engine_prompt_tokens_total", "counter",
                                  "Prompt tokens by where their KV came from "
                                  "(computed, cached, transferred)", (*POOL_TAGS, "source"))
ENGINE_GENERATION_TOKENS = MetricSpec("pdserve_engine_generation_tokens_total", "counter",
                                      "Tokens the engine generated", POOL_TAGS)
SPEC_TOKENS = MetricSpec("pdserve_spec_decode_tokens_total", "counter",
                        "Speculative decoding (decode.speculative): draft tokens proposed "
                        "and accepted; accepted / drafted is the acceptance rate",
                        (*POOL_TAGS, "kind"))
ENGINE_PHASE = MetricSpec("pdserve_engine_request_seconds", "histogram",
                          "Each request's time by phase: in the engine, recorded when it "
                          "finishes, queued (arrival to first scheduled) and prefill "
                          "(scheduled to first token; on the decode pool the KV pull "
                          "included), the engines' part of the router's prefill and "
                          "first_token stages; around the engine, recorded at the first "
                          "output, to_engine (the replica's call to the engine core queuing "
                          "the request, which waits for a step in flight) and from_engine "
                          "(the engine's output to the replica holding it)",
                          (*POOL_TAGS, "phase"), STAGE_BUCKETS)

# Ray's exporter rebuilds a histogram's ``_sum`` from its buckets' midpoints (a 16 ms
# observation in the 15-20 ms bucket is summed as 17.5 ms), which is coarser than the
# milliseconds the breakdown is for. These two histograms' observations are therefore also
# summed exactly into a counter each; the stage means `pdserve bench` prints and the
# dashboard plots are read from those.
STAGE_TOTAL = MetricSpec("pdserve_stage_seconds_total", "counter",
                         "Exact sum of pdserve_request_stage_seconds's observations",
                         STAGE.tags)
ENGINE_PHASE_TOTAL = MetricSpec("pdserve_engine_phase_seconds_total", "counter",
                                "Exact sum of pdserve_engine_request_seconds's observations",
                                ENGINE_PHASE.tags)
EXACT_SUMS = {STAGE.name: STAGE_TOTAL, ENGINE_PHASE.name: ENGINE_PHASE_TOTAL}

# --- KV transfer (recorded by the decode engines that pull) ----------------------------
KV_TRANSFER_SECONDS = MetricSpec("pdserve_kv_transfer_seconds", "histogram",
                                 "Duration of one NIXL KV transfer", POOL_TAGS,
                                 TRANSFER_BUCKETS)
KV_TRANSFER_BYTES = MetricSpec("pdserve_kv_transfer_bytes_total", "counter",
                               "Bytes of KV cache moved over NIXL", POOL_TAGS)
KV_TRANSFER_FAILURES = MetricSpec("pdserve_kv_transfer_failures_total", "counter",
                                  "Failed NIXL transfers, handshakes and notifications",
                                  POOL_TAGS)
KV_LEASES_EXPIRED = MetricSpec("pdserve_kv_leases_expired_total", "counter",
                               "Prompts whose KV blocks no decode engine took before their "
                               "lease ran out (recorded by the prefill engines)", POOL_TAGS)
KV_HANDLES_LATE = MetricSpec("pdserve_kv_handles_late_total", "counter",
                             "KV handles a decode engine got past their claim deadline: it "
                             "prefilled the prompt itself instead of pulling", POOL_TAGS)

# --- retries (recorded by the router's flow, router/retry.py) ---------------------------
RESPONSE_CACHE_REQUESTS = MetricSpec(
    "pdserve_response_cache_requests_total", "counter",
    "Prompts looked up in the router's response cache, by result (hit, miss: computed and "
    "stored; bypass: not determined, so never cached)", ("version", "result"))
RESPONSE_CACHE_SAVED_TOKENS = MetricSpec(
    "pdserve_response_cache_saved_tokens_total", "counter",
    "Tokens the response cache's hits spared the engines (prompt, generation)",
    ("version", "kind"))
RESPONSE_CACHE_ERRORS = MetricSpec(
    "pdserve_response_cache_store_errors_total", "counter",
    "Shared-store (Redis) calls that failed; each was answered as a miss", ("operation",))
RETRIES = MetricSpec("pdserve_retries_total", "counter",
                     "Stages that failed, why (died, unavailable, deadline, refused, internal, "
                     "crashed, crashed_shared) and what the router did next (retry_prefill, "
                     "decode_local, migrate, give_up, quarantine: a request whose engine "
                     "died of it, answered 500 and never retried)",
                     ("version", "stage", "reason", "action"))

# --- canary rollouts (recorded by the rollout controller) -------------------------------
CANARY_PERCENT = MetricSpec("pdserve_canary_percent", "gauge",
                            "Share of a served model's traffic each version gets (0..100)",
                            ("model", "version"))
CANARY_DECISIONS = MetricSpec("pdserve_canary_decisions_total", "counter",
                              "Canary gate decisions (promote, hold, rollback)",
                              ("model", "action"))

# --- autoscaling (recorded by the pools' policies in the Serve controller) --------------
_SCALING_TAGS = ("application", "deployment", "pool")
DESIRED_REPLICAS = MetricSpec("pdserve_autoscaling_desired_replicas", "gauge",
                              "Replicas the pdserve policy decided for the pool", _SCALING_TAGS)
STANDBY_FLOOR = MetricSpec("pdserve_autoscaling_standby_floor_replicas", "gauge",
                           "Standby floor of the schedule in force (0: none)", _SCALING_TAGS)
# Serve calls a policy every control-loop tick (0.1 s): only changes are counted.
SCALE_EVENTS = MetricSpec("pdserve_autoscaling_scale_events_total", "counter",
                          "Scale-ups and scale-downs the pdserve policy decided",
                          (*_SCALING_TAGS, "direction"))
PREFILL_PER_DECODE = MetricSpec("pdserve_autoscaling_prefill_per_decode", "gauge",
                                "Prefill:decode replica ratio the token mix asks for",
                                ("application",))

CATALOGUE: tuple[MetricSpec, ...] = (
    TTFT, ITL, E2E, QUEUE, STAGE, REQUESTS, PROMPT_TOKENS, GENERATION_TOKENS, OUTPUT_CHUNKS,
    REPLICAS, RUNNING, WAITING, KV_USAGE, ENGINE_PROMPT_TOKENS, ENGINE_GENERATION_TOKENS,
    SPEC_TOKENS, ENGINE_PHASE, STAGE_TOTAL, ENGINE_PHASE_TOTAL,
    KV_TRANSFER_SECONDS, KV_TRANSFER_BYTES, KV_TRANSFER_FAILURES, KV_LEASES_EXPIRED,
    KV_HANDLES_LATE, RETRIES,
    RESPONSE_CACHE_REQUESTS, RESPONSE_CACHE_SAVED_TOKENS, RESPONSE_CACHE_ERRORS,
    CANARY_PERCENT, CANARY_DECISIONS,
    DESIRED_REPLICAS, STANDBY_FLOOR, SCALE_EVENTS, PREFILL_PER_DECODE,
)


def outcome_for_status(status: int) -> Outcome:
    """How a request that ended with an HTTP error status is counted."""
    if status in (429, 503):
        return "rejected"
    if 400 <= status < 500:
        return "client_error"
    return "failed"


# How often an engine replica publishes its gauges and flushes its gathered ``Counts`` to
# Ray (a thread, not the engine's steps): under Ray's export period, since Ray exports a
# gauge only while it keeps being set. A count reaches a scrape up to this plus Ray's
# export period after the step that made it.
ENGINE_PUBLISH_S = 2.0


def settle_s(report_period_s: float) -> float:
    """How long a scrape must stay unchanged before nothing counted earlier can still be on
    its way, given Ray's export period: an engine's flush, then an export, then a second."""
    return report_period_s + ENGINE_PUBLISH_S + 1
