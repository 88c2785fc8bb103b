"""The one configuration model of a pdserve cluster.

A cluster is described by one YAML file (default ``ray_configs/local.yaml``) loaded into
:class:`PDServeConfig`. Defaults live here and nowhere else; every other module receives
an already validated config object. Loading failures raise :class:`ConfigError` with one
line per problem, each naming the field path, so ``pdserve up`` can fail at start with a
message a person can act on.

This module is pure: pydantic and yaml only (no Ray, vLLM, torch or HTTP).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

DEFAULT_CONFIG_PATH = Path("ray_configs/local.yaml")


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


class _Strict(BaseModel):
    # A misspelt key is a bug in the config file, not something to ignore silently.
    model_config = ConfigDict(extra="forbid", frozen=True)


class TinyModelSpec(_Strict):
    """How to generate the local development model when its directory does not exist yet."""

    seed: int = 0
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(256, gt=0)
    max_position_embeddings: int = Field(8192, gt=0)
    init_std: float = Field(0.2, gt=0, description="weight init std (initializer_range)")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self


class ModelConfig(_Strict):
    """The served model: the name clients use and the Hugging Face directory behind it."""

    name: str = Field(min_length=1, description="served model name (the `model` field)")
    path: Path = Field(description="local Hugging Face model directory (weights + tokenizer)")
    generate: TinyModelSpec | None = Field(
        None, description="generate a tiny random model at `path` if it is missing (dev only)"
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        # Relative paths mean "from where pdserve was started"; every Ray worker must agree.
        return path.expanduser().absolute()


class EngineConfig(_Strict):
    """vLLM engine arguments shared by both pools (they must agree for KV to be portable)."""

    dtype: str = "auto"
    max_model_len: int = Field(4096, gt=0)
    block_size: int = Field(16, gt=0)
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    cpu_kvcache_space_gib: float | None = Field(
        None, gt=0, description="KV cache size on CPU engines (VLLM_CPU_KVCACHE_SPACE)"
    )
    seed: int = 0
    extra: dict[str, Any] = Field(
        default_factory=dict, description="further vLLM EngineArgs, passed through verbatim"
    )


class PoolConfig(_Strict):
    """One pool (prefill or decode): its replicas and what each replica reserves."""

    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    tensor_parallel_size: int = Field(1, ge=1)
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources, e.g. to pin a node type"
    )
    engine_overrides: dict[str, Any] = Field(
        default_factory=dict, description="vLLM EngineArgs that differ for this pool only"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment of the engine, e.g. CPU thread binding"
    )
    max_ongoing_requests: int = Field(256, ge=1)


class KVTransferConfig(_Strict):
    """How prefill replicas hand KV blocks to decode replicas (vLLM NixlConnector)."""

    connector: Literal["NixlConnector"] = "NixlConnector"
    buffer_device: Literal["cpu", "cuda"] = "cpu"
    side_channel_base_port: int = Field(
        15600, ge=1024, le=65000, description="first NIXL side-channel port on each node"
    )
    side_channel_port_span: int = Field(
        400, ge=1, description="ports tried above the base before giving up"
    )
    side_channel_host: str | None = Field(
        None, description="address peers use to reach an engine; default: the Ray node IP"
    )
    backends: list[str] = Field(default_factory=lambda: ["UCX"])
    progress_thread: bool = Field(
        True,
        description="NIXL's progress thread; it spins a core per engine, so CPU nodes turn "
        "it off (see kv_transfer/vllm_plugin.py)",
    )
    ucx_tls: str | None = Field(
        "tcp,self", description="UCX_TLS for engines; tcp is needed on machines without RDMA"
    )


class AdmissionConfig(_Strict):
    """Admission control of one router replica (see router/admission.py)."""

    token_budget: int = Field(
        262144, ge=1, description="in-flight prompt + max_tokens admitted at once"
    )
    max_queue: int = Field(256, ge=0, description="requests allowed to wait; beyond: 429")
    max_queue_per_key: int | None = Field(
        None, ge=0, description="one API key's (or user's) share of the queue; None: all"
    )
    max_wait_s: float = Field(30, gt=0, description="longest wait before 503")
    retry_after_s: int = Field(1, ge=1, description="Retry-After of 429 and 503 answers")


class RouterConfig(_Strict):
    """The HTTP ingress."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    num_cpus: float = Field(0, ge=0)
    replicas: int = Field(1, ge=1)
    max_ongoing_requests: int = Field(1024, ge=1)
    default_max_tokens: int = Field(256, ge=1, description="used when a request sets none")
    disaggregation_threshold_tokens: int = Field(
        0, ge=0,
        description="prompts shorter than this are prefilled by the decode engine "
        "(0: every request goes through the prefill pool)",
    )
    admission: AdmissionConfig = AdmissionConfig()


class RayConfig(_Strict):
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


class PDServeConfig(_Strict):
    """The whole cluster."""

    model: ModelConfig
    engine: EngineConfig = EngineConfig()
    prefill: PoolConfig = PoolConfig()
    decode: PoolConfig = PoolConfig()
    kv_transfer: KVTransferConfig = KVTransferConfig()
    router: RouterConfig = RouterConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _context_fits_generated_model(self) -> PDServeConfig:
        spec = self.model.generate
        if spec is not None and self.engine.max_model_len > spec.max_position_embeddings:
            raise ValueError(
                f"engine.max_model_len ({self.engine.max_model_len}) exceeds the generated "
                f"model's model.generate.max_position_embeddings "
                f"({spec.max_position_embeddings})"
            )
        return self

    @model_validator(mode="after")
    def _pools_share_kv_layout(self) -> PDServeConfig:
        # KV blocks are copied verbatim between pools, so anything that shapes a block
        # must be identical on both sides.
        layout_keys = {"block_size", "dtype", "max_model_len", "kv_cache_dtype"}
        for pool_name in ("prefill", "decode"):
            clash = layout_keys & getattr(self, pool_name).engine_overrides.keys()
            if clash:
                raise ValueError(
                    f"{pool_name}.engine_overrides may not set {sorted(clash)}: both pools "
                    "must use the same KV layout; set it under `engine`"
                )
        return self


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
