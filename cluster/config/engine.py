"""The engine sections of the config: vLLM's arguments and the two pools (pure).

``engine`` (shared by both pools: they must agree for KV to be portable), a pool's
``prefill`` / ``decode`` section and the decode pool's ``speculative`` decoding. The
escape hatches (``engine.extra``, a pool's ``engine_overrides``) refuse what a typed field
sets. Pure: pydantic only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cluster.autoscaling.config import ReplicaBounds
from cluster.strict import StrictModel

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
