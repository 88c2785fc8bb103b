"""The ``router`` section of the config: the HTTP ingress and what it does per request (pure).

Admission, authentication, request limits, retries, deadlines, the response cache and
HAProxy's listeners; replica choice is in :mod:`cluster.config.routing`. Pure: pydantic
only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from cluster.config.routing import RoutingConfig
from cluster.strict import StrictModel

# An unset max_queue_per_key gives each key this fraction of the queue.
DEFAULT_KEY_QUEUE_DIVISOR = 4


class AdmissionConfig(StrictModel):
    """Admission control of one router replica (see router/admission.py)."""

    token_budget: int = Field(
        262144, ge=1, description="in-flight prompt + max_tokens admitted at once"
    )
    max_queue: int = Field(256, ge=0, description="requests allowed to wait; beyond: 429")
    max_queue_per_key: int | None = Field(
        None, ge=0, description="one API key's (or user's) share of the queue; unset: a "
        "quarter of max_queue, so one client cannot fill it; null: all of it (one key "
        "calling for many users)",
    )
    max_running_share_per_key: float | None = Field(
        0.5, gt=0, le=1, description="share of token_budget one API key's (or user's) "
        "running requests may hold; beyond it the key's next request waits even when the "
        "budget has room (a key may always run one), so one client cannot hold the whole "
        "budget running (long streams it does not read, say) while others wait. Requests "
        "with neither an API key nor a user are not capped. null: all of it (one key "
        "calling for many users)",
    )
    max_wait_s: float = Field(30, gt=0, description="longest wait before 503")
    retry_after_s: int = Field(1, ge=1, description="Retry-After of 429 and 503 answers")
    long_prompt_tokens: int | None = Field(
        None, ge=1, description="prompts at least this long take the long lane (None: no lane)"
    )
    long_lane_share: float = Field(
        0.5, gt=0, le=1, description="share of token_budget the long lane may hold at once"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_key_share(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_queue_per_key" not in data:
            max_queue = data.get("max_queue", cls.model_fields["max_queue"].default)
            if isinstance(max_queue, int):  # anything else is refused by the field itself
                data = {**data, "max_queue_per_key": max(
                    1, max_queue // DEFAULT_KEY_QUEUE_DIVISOR)}
        return data


class AuthConfig(StrictModel):
    """Optional API-key authentication: on when any key is configured (router/auth.py)."""

    api_keys: list[SecretStr] = Field(
        default_factory=list, description="accepted keys (prefer api_keys_env in production)"
    )
    api_keys_env: str | None = Field(
        None, description="env var with further comma-separated accepted keys; named, it "
        "must hold one (the router refuses to start otherwise: auth fails closed)"
    )
    admin_keys: list[SecretStr] = Field(
        default_factory=list, description="keys for /admin/* (client keys never open it)"
    )
    admin_keys_env: str | None = Field(
        None, description="env var with further comma-separated admin keys; named, it must "
        "hold one"
    )
    shared_prefix_cache: bool = Field(
        False, description="let requests of different API keys share the engines' prefix "
        "caches; by default each key's cached prompts are its own (vLLM's cache_salt), since "
        "a hit shows in usage.prompt_tokens_details.cached_tokens and would tell one tenant "
        "what another sent, a block at a time"
    )


class RequestLimits(StrictModel):
    """What one request may be (router/limits.py): refused with 413 or 400 before any
    tokenizer or engine pays for it."""

    max_body_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="request bodies above this get 413 (2 MiB: "
        "an 8K-token prompt is ~32 KB of text, 200 KB even as JSON \\u escapes)",
    )
    max_stop_chars: int = Field(
        256, ge=1, description="longest stop string (each is matched at every decode step)"
    )
    max_user_chars: int = Field(
        256, ge=1, description="longest `user` field (a queue and sticky-version key)"
    )
    max_n: int = Field(
        16, ge=1, le=16384, description="most answers (`n`) one request may ask for: each "
        "is a sequence of its own in the decode engine (a slot of engine.max_num_seqs) and "
        "costs its max_tokens of admission budget (vLLM's own bound is 16,384)",
    )
    max_tokenizing_per_key: int = Field(
        4, ge=1, description="most /tokenize and /detokenize calls of one client key at once "
        "in one router replica; more are answered 429 with Retry-After (they take no "
        "admission budget, and would otherwise let one key spend the router's CPU)",
    )


class RetryConfig(StrictModel):
    """Retries after a replica or engine failure (router/retry.py)."""

    prefill_attempts: int = Field(
        2, ge=1, description="prefill tries on prefill replicas; after them the decode "
        "engine prefills the prompt itself")
    decode_attempts: int = Field(
        2, ge=1, description="decode runs started for a request before its first token")
    max_migrations: int = Field(
        2, ge=0, description="continuations on another decode replica after tokens were "
        "sent (0: a stream that loses its replica ends with an error event)")
    max_retry_s: float = Field(
        60, gt=0, description="no retry starts this long after the request arrived")
    prefill_cooldown_s: float = Field(
        10, ge=0, description="after the prefill pool failed a request, prompts are "
        "prefilled by the decode engines for this long instead of waiting for it")


class Deadlines(StrictModel):
    """How long the router waits for each stage before it counts the stage as failed
    (and retries it: router.retries). None: no deadline."""

    prefill_s: float | None = Field(
        60, gt=0, description="a prefill replica's answer (queueing included)")
    first_token_s: float | None = Field(
        60, gt=0, description="a decode engine's first output (its KV pull included)")
    token_gap_s: float | None = Field(
        30, gt=0, description="the longest wait between two outputs of a decode stream")
    body_s: float | None = Field(
        30, gt=0, description="a request's body, from the router taking the request to the "
        "body's last byte: a client that uploads slower is answered 408 (a slow upload "
        "holds one of the router replica's max_ongoing_requests meanwhile)")
    client_read_s: float | None = Field(
        60, gt=0, description="a client that stops reading its answer for this long is "
        "taken for gone, as one that disconnected: Serve's proxy ends the request (its "
        "engine work and admission ticket freed) instead of holding its events for a "
        "reader that never comes. Applied by pdserve's middleware in Serve's proxy (the "
        "proxy ingress; the variable PDSERVE_CLIENT_READ_S on a node started by hand)")
    request_s: float | None = Field(
        None, gt=0, description="a whole request, from the router taking it to its last "
        "output, retries included; when it passes nothing is retried (None: no limit, each "
        "stage keeps its own). Also Serve's proxy timeout, a few seconds later, so a "
        "request waiting in front of the router is bounded too")


class ResponseCacheConfig(StrictModel):
    """The router's cache of whole answers (router/cache_policy.py, router/response_cache.py):
    only for requests whose answer is determined (greedy or seeded, one choice), keyed by
    version, tenant and the canonical request; a hit spares both pools."""

    enabled: bool = Field(False, description="replay stored answers to identical requests")
    store: Literal["memory", "redis"] = Field(
        "memory", description="'memory': each router replica keeps its own (hits divide by "
        "the replica count); 'redis': one store shared by every router replica (redis_url)")
    redis_url: str | None = Field(
        None, description="the shared store, e.g. redis://cache.internal:6379/0; bound its "
        "memory in Redis itself (maxmemory with allkeys-lru)")
    max_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="the memory store's bound per router replica")
    max_entry_bytes: int = Field(
        1024 * 1024, ge=256, description="larger answers (with logprobs, say) are not stored")
    ttl_s: float = Field(600, gt=0, description="an entry is served for this long at most")

    @model_validator(mode="after")
    def _store_reachable(self) -> ResponseCacheConfig:
        if self.store == "redis" and not self.redis_url:
            raise ValueError("response_cache.store 'redis' needs response_cache.redis_url")
        if self.store == "memory" and self.redis_url:
            raise ValueError("response_cache.redis_url is set but store is 'memory'; set "
                             "store: redis to share entries between router replicas")
        return self


class HAProxyConfig(StrictModel):
    """HAProxy's own listeners on each node with ``router.ingress: haproxy`` (Ray's
    ``RAY_SERVE_HAPROXY_STATS_PORT`` and ``_METRICS_PORT``: Ray keeps HAProxy's files
    apart per node, but not these, so two clusters on one host need their own), and how
    long a leaving router replica drains."""

    stats_port: int = Field(8404, ge=1, le=65535, description="HAProxy's stats page")
    metrics_port: int = Field(9101, ge=1, le=65535,
                              description="HAProxy's Prometheus exporter")
    min_drain_s: float = Field(
        30.0, ge=0, description="a router replica that leaves (replaced, scaled in, shut "
        "down) keeps its HTTP server at least this long, so that whatever balances over "
        "the replicas stops sending to it first (Ray's "
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S; 30, Ray's default, is sized for "
        "a cloud load balancer's deregistration). Every replacement and `pdserve down` "
        "waits it out")


class RouterConfig(StrictModel):
    """The HTTP ingress."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    num_cpus: float = Field(0, ge=0)
    replicas: int = Field(1, ge=1)
    max_ongoing_requests: int = Field(1024, ge=1)
    max_queued_requests: int = Field(
        1024, ge=1, description="requests waiting in front of the router replicas (in "
        "Serve's proxy) beyond max_ongoing_requests each; beyond: Serve answers 503")
    drain_timeout_s: float = Field(
        300, gt=0, description="a router replica being replaced finishes its streams for "
        "at most this long"
    )
    default_max_tokens: int = Field(256, ge=1, description="used when a request sets none")
    version_stickiness: Literal["api_key", "user"] = Field(
        "api_key", description="what keeps a client on one model version of a weighted "
        "split or canary: 'api_key', its API key (a client cannot pick the version; "
        "without a key each request is drawn); 'user', its `user` field first, for a "
        "trusted caller (a gateway with one key for many users) whose users must be "
        "spread over the versions. With 'user', a client that chooses its `user` chooses "
        "its version, and can aim failures at one to steer the canary gate",
    )
    disaggregation_threshold_tokens: int = Field(
        512, ge=0,
        description="prompts shorter than this are prefilled by the decode engine "
        "(0: every request goes through the prefill pool); 512 from the sweep in "
        "docs/benchmarks.md",
    )
    stream_chunk_interval_ms: float = Field(
        20, ge=0, le=1000,
        description="a stream's tokens leave the decode replica at most once per this "
        "interval, those made meanwhile merged into one chunk (the first and the last "
        "at once; 0: every token as it is made); see docs/design.md, streaming in chunks",
    )
    stream_chunks_per_s: float = Field(
        400, ge=0, description="below this many chunks a second from one decode replica's "
        "streams together, every token leaves as its own chunk; above it each stream's "
        "chunks are spaced streams / this apart, at most stream_chunk_interval_ms (0: "
        "always that interval). Per-token streaming while a replica is lightly loaded, "
        "fewer chunks to relay when it is busy (decode/pacing.py)",
    )
    transport: Literal["grpc", "ray"] = Field(
        "grpc", description="how requests and streamed chunks cross Serve's hops: 'grpc', "
        "Serve's gRPC data plane (proxy -> router -> engine replicas, each process's "
        "replica code and handle routing on its main event loop); 'ray', Ray actor calls "
        "and object refs. A local cluster gets the node environment from `pdserve up`, "
        "`ray up`'s files export it (cluster/serve_env.py); see docs/design.md, 'Serve's "
        "data plane'",
    )
    ingress: Literal["proxy", "haproxy"] = Field(
        "proxy", description="what takes clients' HTTP on each node: 'proxy', Serve's "
        "Python proxy (with router/proxy_edge.py); 'haproxy', HAProxy balancing over the "
        "router replicas' own HTTP servers (Ray's direct ingress): one Python hop fewer "
        "per request and chunk, but HAProxy answers on its own, with no router replica "
        "up, a plain 500. See docs/design.md, 'HAProxy ingress'",
    )
    haproxy: HAProxyConfig = HAProxyConfig()
    admission: AdmissionConfig = AdmissionConfig()
    auth: AuthConfig = AuthConfig()
    routing: RoutingConfig = RoutingConfig()
    limits: RequestLimits = RequestLimits()
    retries: RetryConfig = RetryConfig()
    deadlines: Deadlines = Deadlines()
    response_cache: ResponseCacheConfig = ResponseCacheConfig()
