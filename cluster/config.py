"""The one configuration model of a pdserve cluster (pure).

A cluster is described by one YAML file (default ``ray_configs/local.yaml``) loaded into
:class:`PDServeConfig`. Defaults live here and nowhere else; every other module receives
an already validated config object. Loading failures raise :class:`ConfigError` with one
line per problem, each naming the field path, so ``pdserve up`` can fail at start with a
message a person can act on.

This module is pure: pydantic and yaml only (no Ray, vLLM, torch or HTTP).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from cluster.autoscaling.config import AutoscalingConfig, ReplicaBounds
from cluster.cores import parse_cores
from cluster.slo import SLOConfig
from cluster.strict import StrictModel

DEFAULT_CONFIG_PATH = Path("ray_configs/local.yaml")

# Version names become parts of deployment names and metric labels.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.]{0,31}$"


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


# vLLM arguments that pdserve sets from a typed field elsewhere in the config, and that
# field. An escape hatch (`engine.extra`, a pool's `engine_overrides`) is applied last, so
# setting one of these there would silently win over the typed field.
_OWNED_ELSEWHERE = {
    "model": "model.path / versions.<version>.path",
    "served_model_name": "model.name / served_models",
    "kv_transfer_config": "kv_transfer",
    "speculative_config": "decode.speculative",
}
# Anything that shapes a KV block or what it holds: blocks are copied verbatim between
# pools, so a decode engine must read them as the prefill engine that wrote them did.
_KV_LAYOUT_ARGS = frozenset({"block_size", "dtype", "max_model_len", "kv_cache_dtype",
                             "quantization"})
# Typed per pool: set by the pool's own field of the same name.
_POOL_TYPED_ARGS = ("tensor_parallel_size", "max_num_batched_tokens")
# EngineConfig fields that are not vLLM arguments (the rest are passed by name).
_ENGINE_NON_ARGS = frozenset({"extra", "cpu_kvcache_space_gib", "step_wait",
                              "scheduler_nice", "vllm_metrics", "stall_timeout_s"})


def _refuse(hatch: dict[str, Any], owners: dict[str, str]) -> dict[str, Any]:
    """``hatch`` unchanged, or ValueError naming each key that has a typed field."""
    taken = sorted(set(hatch) & set(owners))
    if taken:
        instead = "; ".join(f"{key!r} (set {owners[key]} instead)" for key in taken)
        raise ValueError(f"may not set what a typed field sets: {instead}")
    return hatch


class TinyTrainingSpec(StrictModel):
    """A short training run for the generated model, so that it has learned something: the
    cost levers (speculative decoding's acceptance, quantization's quality delta) mean
    nothing on random weights (cluster/tiny_training.py)."""

    corpus: Literal["python-stdlib"] = Field(
        "python-stdlib", description="text every machine has: the running Python's standard "
        "library sources (one file in ten held out for evaluation)"
    )
    steps: int = Field(300, ge=1, description="optimizer steps (~1 s each for the bench "
                       "model on 2 cores)")
    batch_size: int = Field(16, ge=1)
    seq_len: int = Field(256, ge=8, description="tokens (bytes) per training sequence")
    learning_rate: float = Field(3e-3, gt=0, description="AdamW's peak, after a linear "
                                 "warm-up over a tenth of the steps, cosine to a tenth")


class TinyModelSpec(StrictModel):
    """How to generate the local development model when its directory does not exist yet."""

    seed: int = 0
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(256, gt=0)
    max_position_embeddings: int = Field(8192, gt=0)
    init_std: float = Field(0.2, gt=0, description="weight init std (initializer_range); "
                            "0.2 makes random weights' output varied, training wants ~0.02")
    train: TinyTrainingSpec | None = Field(
        None, description="train the generated model briefly on local text (None: random "
        "weights, generated in seconds)"
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self


def _from_start_directory(path: Path) -> Path:
    # Relative paths mean "from where pdserve was started"; every Ray worker must agree.
    return path.expanduser().absolute()


# A checkpoint directory on the machines that run the engines.
LocalPath = Annotated[Path, AfterValidator(_from_start_directory)]


class QuantizeSpec(StrictModel):
    """Make a version's checkpoint by quantizing another local checkpoint (cluster/quantize.py)."""

    source: LocalPath = Field(description="the full-precision checkpoint's directory (made first "
                         "if another version generates it)")
    scheme: Literal["W8A8"] = Field(
        "W8A8", description="int8 weights per output channel, int8 activations per token "
        "at run time (compressed-tensors' W8A8 preset; vLLM's CPU build runs it on any x86)")


class Checkpoint(StrictModel):
    """Where a model version's weights and tokenizer are."""

    path: LocalPath = Field(description="local Hugging Face model directory (weights + tokenizer)")
    generate: TinyModelSpec | None = Field(
        None, description="generate a tiny random model at `path` if it is missing (dev only)"
    )
    quantize: QuantizeSpec | None = Field(
        None, description="write a quantized copy of another checkpoint at `path` if it is "
        "missing or its source changed (dev and benchmarks)")
    tool_parser: str | None = Field(
        None, description="vLLM's tool-call parser for this model (e.g. hermes, llama3_json): "
        "requests with tools need one (tool_choice 'auto', 'required' or a named function; "
        "without a parser vLLM answers them 400)",
    )
    reasoning_parser: str | None = Field(
        None, description="vLLM's reasoning parser for this model (e.g. deepseek_r1, qwen3): "
        "chat answers carry the model's reasoning apart from its content, and structured "
        "outputs constrain only what follows the reasoning",
    )

    @model_validator(mode="after")
    def _one_maker(self) -> Checkpoint:
        if self.generate is not None and self.quantize is not None:
            raise ValueError("set `generate` or `quantize`, not both: a checkpoint is either "
                             "generated or made from another")
        return self


class ModelConfig(Checkpoint):
    """A single-version cluster in short: the served name and the one version behind it.

    ``model: {name, path, generate}`` is the same as ``versions: {<version>: {path,
    generate}}`` plus ``served_models: {<name>: {<version>: 100}}``. In a multi-version
    config it is derived: the first served name and its heaviest version (what the
    benchmark and the reference server use).
    """

    name: str = Field(min_length=1, description="served model name (the `model` field)")
    version: str = Field("v1", pattern=VERSION_PATTERN, description="the version's name")


class EngineConfig(StrictModel):
    """vLLM engine arguments shared by both pools (they must agree for KV to be portable)."""

    dtype: str = "auto"
    max_model_len: int = Field(4096, gt=0)
    block_size: int = Field(16, gt=0)
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    cpu_kvcache_space_gib: int | None = Field(
        None, gt=0, description="KV cache size on CPU engines (VLLM_CPU_KVCACHE_SPACE), in "
        "whole GiB: vLLM 0.32 reads it as an integer and fails at start on a fraction",
    )
    seed: int = 0
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="the KV cache's element type (vLLM's kv_cache_dtype). fp8 halves "
        "KV bytes, in memory and over NIXL between the pools; CPU engines need AVX-512 or "
        "AMX and a head size divisible by 32 (checked where each engine starts)",
    )
    quantization: str | None = Field(
        None, description="vLLM's quantization method for every version's weights; None: "
        "each checkpoint's own (its config.json's quantization_config), which is what a "
        "quantized checkpoint needs. Set it to insist on one method",
    )
    step_wait: Literal["auto", "spin", "sleep"] = Field(
        "auto", description="how an engine's scheduler and worker processes wait for each "
        "other's step: vLLM spins (`spin`, fine where host cores are spare), `sleep` polls "
        "with 0.1 ms sleeps and leaves the core to the process computing (CPU nodes), and "
        "drops the engine core's 1 ms pause after a step without a model run when a "
        "request's KV has arrived; `auto`: sleep on pools without GPUs "
        "(cluster/engine/vllm_plugin.py)",
    )
    scheduler_nice: int | Literal["auto"] | None = Field(
        "auto", ge=-20, le=19, description="the nice value of each engine's scheduler "
        "process (vLLM's engine core; its worker keeps the replica's): every step waits "
        "for it, so it should not queue behind the serving processes it shares cores "
        "with. `auto`: -10 on pools without GPUs, else unchanged; None: unchanged. Raising "
        "a priority needs CAP_SYS_NICE; without it the engine logs a warning and runs on",
    )
    vllm_metrics: bool = Field(
        False, description="also export vLLM's own engine metrics (`vllm:*`, as "
        "`ray_vllm_*`) through Ray's metrics, as Ray Serve LLM does. Off: pdserve's own "
        "`pdserve_engine_*` metrics cover the engines, and vLLM's logger costs each engine "
        "replica CPU on every step (docs/benchmarks.md, \"Engine metrics off the step\")",
    )
    stall_timeout_s: float | None = Field(
        60, gt=0, description="an engine that holds requests and has not stepped for this "
        "long is taken for hung: its replica kills its engine processes and fails its "
        "health check, so that Serve replaces it and the routers' retries move its "
        "requests (cluster/engine/stall.py). Well above the longest step a pool makes "
        "(a chunked prefill step on CPU takes seconds); None: never",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="further vLLM EngineArgs, passed through verbatim; not those with a "
        "typed field (block_size, max_num_batched_tokens, ...: set the field instead)",
    )

    @field_validator("extra")
    @classmethod
    def _extra_untyped(cls, extra: dict[str, Any]) -> dict[str, Any]:
        per_pool = {name: f"prefill.{name} / decode.{name}" for name in _POOL_TYPED_ARGS}
        shared = {name: f"engine.{name}" for name in cls.model_fields
                  if name not in _ENGINE_NON_ARGS}
        return _refuse(extra, {**per_pool, **shared, **_OWNED_ELSEWHERE})


class SpeculativeConfig(StrictModel):
    """Speculative decoding on the decode pool's engines (vLLM's ``speculative_config``).

    Prompt lookup (``ngram``) only: it proposes the tokens that followed the last few
    tokens where they occur earlier in the context, with no model of its own. A draft
    model or EAGLE head would have to run on the prefill pool too (vLLM's NIXL handshake
    refuses engines whose drafters differ) and its KV is not transferred, so the decode
    engine would prefill every prompt again. Suffix decoding needs the arctic-inference
    package, published only as a source distribution that does not build here
    (docs/cost.md). Greedy output is unchanged by construction: a draft token is kept only
    where the target model picks it.
    """

    method: Literal["ngram"] = Field("ngram", description="'ngram': prompt lookup")
    num_speculative_tokens: int = Field(
        4, ge=1, le=16, description="draft tokens verified per decode step")
    prompt_lookup_min: int = Field(2, ge=1, description="shortest n-gram looked up")
    prompt_lookup_max: int = Field(4, ge=1, description="longest n-gram looked up")

    @model_validator(mode="after")
    def _lookup_ordered(self) -> SpeculativeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        return self

    def engine_arg(self) -> dict[str, Any]:
        """The ``speculative_config`` engine argument."""
        return self.model_dump()


class PoolConfig(StrictModel):
    """One pool (prefill or decode): its replicas and what each replica reserves."""

    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    tensor_parallel_size: int = Field(1, ge=1)
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources, e.g. to pin a node type"
    )
    engine_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM EngineArgs that differ for this pool only (e.g. max_num_seqs); "
        "not the KV layout, nor what a typed field of the pool sets",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment of the engine, e.g. CPU thread binding"
    )
    max_ongoing_requests: int = Field(256, ge=1)
    min_replicas: int | None = Field(
        None, ge=0, description="this pool's bounds under autoscaling; an end left out "
        "is the autoscaling section's (autoscaling.prefill / autoscaling.decode)")
    max_replicas: int | None = Field(None, ge=1)
    drain_timeout_s: float = Field(
        300, gt=0, description="a replica leaving (scale-down, rollout) finishes its "
        "in-flight requests for at most this long"
    )
    max_num_batched_tokens: int | None = Field(
        None, gt=0,
        description="token cap of one engine step for this pool; prompts longer than it are "
        "prefilled in chunks (chunked prefill), so one long prompt cannot stall a step",
    )
    speculative: SpeculativeConfig | None = Field(
        None, description="decode pools only: speculative decoding without a draft model "
        "(docs/cost.md); None: off")

    @field_validator("engine_overrides")
    @classmethod
    def _overrides_untyped(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        layout = sorted(_KV_LAYOUT_ARGS & overrides.keys())
        if layout:
            raise ValueError(f"may not set {layout}: both pools must use the same KV layout; "
                             "set it under `engine`")
        owners = {name: f"this pool's `{name}`" for name in _POOL_TYPED_ARGS}
        return _refuse(overrides, {**owners, **_OWNED_ELSEWHERE})

    def bounds(self, default: ReplicaBounds) -> ReplicaBounds:
        """This pool's replica bounds under autoscaling: its own ends over ``default``."""
        return default.overridden(self.min_replicas, self.max_replicas)


class VersionConfig(Checkpoint):
    """One model version: its weights and, optionally, pools sized apart from the default."""

    prefill: PoolConfig | None = Field(None, description="this version's prefill pool")
    decode: PoolConfig | None = Field(None, description="this version's decode pool")


class KVTransferConfig(StrictModel):
    """How prefill replicas hand KV blocks to decode replicas (vLLM NixlConnector)."""

    connector: Literal["NixlConnector"] = "NixlConnector"
    buffer_device: Literal["cpu", "cuda"] = "cpu"
    load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute", description="a decode engine whose KV pull fails computes the prompt "
        "itself (recompute) instead of ending the request with finish_reason 'error' "
        "(vLLM's kv_load_failure_policy, whose own default is fail)",
    )
    lease_s: int = Field(
        30, ge=3, description="how long a prefill engine keeps a prompt's KV blocks that no "
        "decode engine has taken (vLLM's kv_lease_duration); a decode replica given the "
        "handle after two thirds of it prefills the prompt itself instead of pulling",
    )
    side_channel_base_port: int = Field(
        24600, ge=1024, le=65000, description="first NIXL side-channel port on each node; "
        "the range (a span per pool) must stay clear of Ray's worker ports, Serve's "
        "direct-ingress ports and the ephemeral ports outgoing connections take"
    )
    side_channel_port_span: int = Field(
        400, ge=1, description="ports tried above the base before giving up"
    )
    side_channel_host: str | None = Field(
        None, description="address peers use to reach an engine; default: the Ray node IP"
    )
    port_rank: Literal["node", "pool"] = Field(
        "node", description="which replica rank picks a side-channel port: its rank on its "
        "node, or in its pool (when several Ray nodes share an IP, as in the fake "
        "multi-node cluster)",
    )
    backends: list[str] = Field(default_factory=lambda: ["UCX"])
    progress_thread: bool = Field(
        True,
        description="NIXL's progress thread; it spins a core per engine, so CPU nodes turn "
        "it off (see kv_transfer/vllm_plugin.py)",
    )
    shared_memory: bool = Field(
        True, description="engines of one host move KV through shared memory: a prefill "
        "engine's KV cache is a memfd that a decode engine on its host maps and copies "
        "from (kv_transfer/shared_kv.py); engines of other hosts, or that cannot map it, "
        "move it over NIXL as ucx_tls says",
    )
    ucx_tls: str | None = Field(
        "tcp,cma,self", description="UCX_TLS for engines. UCX picks per peer among these: "
        "cma (the kernel copies from the other engine's memory: same host, no progress "
        "needed on the owner's side) when both engines share a host, tcp between hosts "
        "(and for connection set-up). null lets UCX choose from all it has (RDMA on GPU "
        "clusters); see `pdserve bench transfer`"
    )


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


class CanaryConfig(StrictModel):
    """A canary rollout of one served name: the gate steps the candidate's share up."""

    served_model: str = Field(min_length=1, description="the served name being rolled out")
    baseline: str = Field(description="the version serving today")
    candidate: str = Field(description="the version being rolled out")
    steps: list[int] = Field(default_factory=lambda: [5, 25, 50, 100],
                             description="candidate shares (percent), one per promotion")
    window_s: float = Field(300, gt=0, description="outcomes compared over this window")
    min_requests: int = Field(50, ge=1, description="candidate requests needed to decide")
    max_error_rate_delta: float = Field(
        0.01, ge=0, description="roll back when the candidate's error rate exceeds the "
        "baseline's by more than this (absolute)"
    )
    max_ttft_p95_ratio: float = Field(
        1.2, ge=1, description="roll back when the candidate's p95 TTFT exceeds the "
        "baseline's times this (at least 1: below, a candidate as fast as the baseline "
        "would roll back)")
    max_itl_p95_ratio: float = Field(
        1.2, ge=1, description="the same for p95 inter-token latency")
    interval_s: float = Field(10, gt=0, description="how often the gate decides")
    evaluation_command: list[str] | None = Field(
        None, description="argv run before each promotion; a non-zero exit vetoes it"
    )
    evaluation_timeout_s: float = Field(600, gt=0)
    rollback_on_veto: bool = Field(
        False, description="a veto of the evaluation command rolls back instead of holding")
    max_samples_per_version: int = Field(
        10_000, ge=1, description="outcomes the gate keeps per version (the newest): bounds "
        "its memory; at high traffic the window's statistics are those of the newest")

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if not steps or steps != sorted(set(steps)) or steps[0] <= 0 or steps[-1] != 100:
            raise ValueError("steps must rise strictly from above 0 to 100")
        return steps


class PoolRoutingConfig(StrictModel):
    """What both pools' routers share: the prefix index that says which replica's prefix
    cache holds a prompt's head, and when a load report is too old to trust."""

    max_blocks: int = Field(
        64, ge=0, description="leading KV blocks of a prompt hashed for affinity (bounds "
        "the router's work per request)")
    index_capacity: int = Field(
        100_000, ge=1, description="KV blocks of prefixes the router remembers; size it "
        "around the pool's total prefix-cache blocks")
    stale_after_s: float = Field(
        5.0, gt=0, description="a replica whose last load report is older ranks last")
    spread: bool = Field(
        True, description="when other router replicas send to the pool too, draw the "
        "first choice by each replica's share of the requests expected before the next "
        "load report, as one dispatcher would fill the pool (routers that cannot see "
        "each other's sends would otherwise all pick the same least loaded replica); "
        "false: always the least loaded. One router alone ranks the same either way")


class PrefillRoutingConfig(PoolRoutingConfig):
    """How the prefill pool's router weighs prefix-cache affinity against queued work
    (``router/replica_choice.py``; the block size is ``engine.block_size``)."""

    max_imbalance_tokens: int = Field(
        4096, ge=0, description="most queued prefill tokens a replica holding the prompt's "
        "prefix may have beyond the shortest queue and still be preferred for it")


class DecodeRoutingConfig(PoolRoutingConfig):
    """How the decode pool's router picks the least loaded replica (the share of sequence
    slots in use, of the engine's ``max_num_seqs``, plus weighted KV-cache use), less the
    prefix affinity of a replica that holds the prompt's head."""

    max_blocks: int = Field(
        512, ge=0, description="leading KV blocks of a prompt hashed for affinity and for "
        "the cache-aware path (bounds the router's work per request: ~0.2 us a block); a "
        "conversation longer than this counts its tail as uncached. 512: 8K tokens in "
        "blocks of 16, ~0.1 ms of hashing")
    kv_weight: float = Field(
        1.0, ge=0, description="weight of KV-cache use against the share of sequence slots "
        "(1: a full cache weighs as much as max_num_seqs running sequences)")
    kv_high_water: float = Field(
        0.95, gt=0, le=1, description="KV-cache use above which a replica ranks after the "
        "others (another sequence there would force preemption)")
    prefix_affinity_slots: float = Field(
        1.0, ge=0, description="what holding a prompt's whole head in its prefix cache is "
        "worth to a replica, in sequence slots (it pulls only the rest over NIXL); below "
        "the load terms: a stream goes at most this many streams past the least loaded "
        "replica (0: no affinity)")
    cache_aware_path: bool = Field(
        True, description="compare only the prompt tokens missing from the prefix cache of "
        "the decode replica believed to hold the longest head of the prompt with "
        "router.disaggregation_threshold_tokens, and send a request under it to that "
        "replica decode-local: the next turn of a conversation, whose prompt and answer "
        "that engine computed, skips the prefill pool and the transfer (false: the whole "
        "prompt's length decides); docs/design.md, 'The next turn stays on its decode "
        "engine'")


class RoutingConfig(StrictModel):
    """Replica choice of the two engine pools (Serve request routers)."""

    prefill: PrefillRoutingConfig = PrefillRoutingConfig()
    decode: DecodeRoutingConfig = DecodeRoutingConfig()


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


class RayConfig(StrictModel):
    """How `pdserve up` reaches Ray: start a local cluster or join one (`address`)."""

    address: str | None = Field(None, description="e.g. 'auto' to join `ray up`'s cluster")
    num_cpus: int | None = Field(None, ge=1, description="logical CPUs of a local cluster")
    node_ip_address: str | None = Field(
        None, description="IP of a local cluster's node (127.0.0.1 keeps it on loopback)"
    )
    metrics_export_port: int | None = Field(
        8080, ge=1024, le=65535,
        description="where a local cluster's node serves Prometheus /metrics (None: Ray picks)",
    )
    serving_cores: str | None = Field(
        None, description="the cores a local cluster's own processes run on (Ray, Serve's "
        "proxy, the router, the pools' replicas and engine schedulers), e.g. '0'; each "
        "engine computes on its pool's VLLM_CPU_OMP_THREADS_BIND cores. Keep the decode "
        "engines' cores out of it, so nothing takes their steps' time (docs/design.md, "
        "'Engines compute on their own cores'). None: every core",
    )

    @field_validator("serving_cores")
    @classmethod
    def _a_core_list(cls, cores: str | None) -> str | None:
        if cores is not None:
            parse_cores(cores)  # ValueError: pydantic reports it under the field's path
        return cores


# Port ranges a host's other processes take ports from, at their defaults, and the room
# they leave for side channels.
_PORTS_TAKEN_BY_OTHERS = (
    (10002, 19999, "Ray's worker ports (`ray start --min-worker-port/--max-worker-port`)"),
    (30000, 31000, "Serve's direct-ingress HTTP ports (router.ingress: haproxy; "
                   "RAY_SERVE_DIRECT_INGRESS_MIN/MAX_HTTP_PORT)"),
    (32768, 60999, "the ephemeral ports of outgoing connections (Linux's ip_local_port_range)"),
)
_SIDE_CHANNEL_ROOM = "1024-10001, 20000-29999 or 31001-32767"


class PDServeConfig(StrictModel):
    """The whole cluster.

    Either ``model`` (one version) or ``versions`` + ``served_models`` (several versions
    at once, weighted per served name) describe what is served; after validation both are
    filled in (see ``_one_version_in_short``).
    """

    model: ModelConfig
    versions: dict[str, VersionConfig] = Field(
        description="model versions, each with its own prefill and decode deployments"
    )
    served_models: dict[str, dict[str, int]] = Field(
        description="served name -> {version: weight}, e.g. chat: {v1: 95, v2: 5}"
    )
    slo: SLOConfig = Field(
        SLOConfig(), description="latency objectives: what autoscaling scales for, the "
        "dashboard draws and the benchmark counts as goodput")
    canary: CanaryConfig | None = None
    autoscaling: AutoscalingConfig | None = Field(
        None, description="size each pool by its own policy (None: fixed `replicas`)")
    engine: EngineConfig = EngineConfig()
    prefill: PoolConfig = PoolConfig()
    decode: PoolConfig = PoolConfig()
    kv_transfer: KVTransferConfig = KVTransferConfig()
    router: RouterConfig = RouterConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="before")
    @classmethod
    def _one_version_in_short(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        model, versions = data.get("model"), data.get("versions")
        if model is not None and versions is None:
            if not isinstance(model, dict):
                return data
            version = model.get("version", "v1")
            data["versions"] = {version: {k: model[k] for k in Checkpoint.model_fields
                                          if k in model}}
            data.setdefault("served_models", {model.get("name"): {version: 100}})
        elif model is None and isinstance(versions, dict) and versions:
            data["model"] = _primary_model(versions, data.get("served_models"))
        return data

    @model_validator(mode="after")
    def _served_models_name_versions(self) -> PDServeConfig:
        for name, weights in self.served_models.items():
            unknown = sorted(set(weights) - set(self.versions))
            if unknown:
                raise ValueError(f"served_models.{name} names unknown versions {unknown}")
            if any(w < 0 for w in weights.values()) or not any(weights.values()):
                raise ValueError(f"served_models.{name}: weights must be >= 0, one > 0")
        for version in self.versions:
            if not re.match(VERSION_PATTERN, version):
                raise ValueError(f"version name {version!r} must match {VERSION_PATTERN}")
        if self.canary is not None:
            canary = self.canary
            weights = self.served_models.get(canary.served_model)
            if weights is None or set(weights) != {canary.baseline, canary.candidate}:
                raise ValueError("canary: served_model must map to exactly the baseline "
                                 "and the candidate in served_models")
            share = 100 * weights[canary.candidate] / sum(weights.values())
            if share != 0 and share not in canary.steps:
                raise ValueError(f"canary: the candidate's share ({share:g}%) must be 0 or "
                                 f"one of the steps {canary.steps}")
        return self

    def pool(self, version: str, role: str) -> PoolConfig:
        """The pool of ``role`` ('prefill' or 'decode') that serves ``version``."""
        own = getattr(self.versions[version], role)
        return own if own is not None else getattr(self, role)

    def scaling_bounds(self, version: str, role: str) -> ReplicaBounds | None:
        """The replica bounds of a version's pool under autoscaling (None: fixed size)."""
        if self.autoscaling is None or not self.autoscaling.enabled:
            return None
        return self.pool(version, role).bounds(getattr(self.autoscaling, role).bounds)

    def _pool_path(self, version: str, role: str) -> str:
        """Where the pool of ``pool(version, role)`` is written in the config file."""
        own = getattr(self.versions[version], role) is not None
        return f"versions.{version}.{role}" if own else role

    def pool_index(self, version: str, role: str) -> int:
        """A stable small number per (version, role): its slice of side-channel ports."""
        return 2 * list(self.versions).index(version) + (0 if role == "prefill" else 1)

    @model_validator(mode="after")
    def _context_fits_generated_model(self) -> PDServeConfig:
        for name, version in self.versions.items():
            spec = version.generate
            if spec is not None and self.engine.max_model_len > spec.max_position_embeddings:
                raise ValueError(
                    f"engine.max_model_len ({self.engine.max_model_len}) exceeds the "
                    f"generated model's max_position_embeddings "
                    f"({spec.max_position_embeddings}) of version {name}"
                )
        return self

    @model_validator(mode="after")
    def _listeners_apart(self) -> PDServeConfig:
        # On one node every listener needs a port of its own: a clash is a process that
        # cannot start (HAProxy's stats page on the metrics port, say), found only then.
        ports = {"router.port": self.router.port,
                 "ray.metrics_export_port": self.ray.metrics_export_port}
        if self.router.ingress == "haproxy":
            ports["router.haproxy.stats_port"] = self.router.haproxy.stats_port
            ports["router.haproxy.metrics_port"] = self.router.haproxy.metrics_port
        taken: dict[int, str] = {}
        for name, port in ports.items():
            if port is not None and port in taken:
                raise ValueError(f"{name} ({port}) is also {taken[port]}")
            taken[port] = name
        return self

    @model_validator(mode="after")
    def _side_channels_clear_of_other_listeners(self) -> PDServeConfig:
        # Any Ray worker process may hold a port of Ray's worker range, a router replica one
        # of Serve's direct-ingress range, and any outgoing connection one of the ephemeral
        # range: an engine whose side-channel port is taken cannot start, found only when
        # it tries (a flaky start, not an error at load).
        kv = self.kv_transfer
        pools, span = 2 * len(self.versions), kv.side_channel_port_span
        first = kv.side_channel_base_port
        last = first + span * pools - 1
        for low, high, whose in _PORTS_TAKEN_BY_OTHERS:
            if first <= high and low <= last:
                raise ValueError(
                    f"kv_transfer.side_channel_base_port: the side-channel ports {first}-"
                    f"{last} ({pools} pools of side_channel_port_span {span}) overlap "
                    f"{whose} ({low}-{high}), where another process may "
                    f"already listen; choose a base and span whose range lies within "
                    f"{_SIDE_CHANNEL_ROOM} (the default base is 24600)")
        return self

    @model_validator(mode="after")
    def _speculation_on_decode_pools_only(self) -> PDServeConfig:
        # A prefill engine makes one token per request: there is nothing to speculate on.
        for version in self.versions:
            if self.pool(version, "prefill").speculative is not None:
                raise ValueError(f"{self._pool_path(version, 'prefill')}.speculative: "
                                 "speculative decoding runs on the decode pool only")
        return self

    @model_validator(mode="after")
    def _scaling_bounds_ordered(self) -> PDServeConfig:
        # A pool's own end may cross the autoscaling section's other end: refused here,
        # when the file is loaded, rather than when the app is built.
        for version in self.versions:
            for role in ("prefill", "decode"):
                try:
                    self.scaling_bounds(version, role)
                except ValidationError as error:
                    problem = error.errors()[0]["msg"].removeprefix("Value error, ")
                    raise ValueError(f"{self._pool_path(version, role)}: its replica bounds "
                                     f"over autoscaling.{role}'s: {problem}") from None
        return self


def _primary_model(versions: dict, served_models: Any) -> dict:
    """The derived ``model`` of a multi-version config: first served name, heaviest version."""
    if not isinstance(served_models, dict) or not served_models:
        raise ValueError("a config with `versions` needs `served_models`")
    name, weights = next(iter(served_models.items()))
    version = max(weights, key=lambda v: weights[v]) if isinstance(weights, dict) else None
    spec = versions.get(version) if version is not None else None
    if not isinstance(spec, dict):
        raise ValueError(f"served_models.{name} must map to declared versions")
    return {"name": name, "version": version,
            **{k: spec[k] for k in Checkpoint.model_fields if k in spec}}


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: ``field.path: message``."""
    lines = []
    for problem in error.errors():
        location = ".".join(str(part) for part in problem["loc"]) or "<root>"
        lines.append(f"  {location}: {problem['msg']}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> PDServeConfig:
    """Validate an already parsed YAML/JSON document."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return PDServeConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(f"{source} is invalid:\n{format_validation_error(error)}") from None


def load_config(path: str | Path = DEFAULT_CONFIG_PATH) -> PDServeConfig:
    """Read and validate a config file; relative model paths resolve against the cwd."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    return parse_config(data, source=str(path))
