"""The root of a pdserve cluster's configuration: the whole file and its loading (pure).

A cluster is described by one YAML file (default ``ray_configs/local.yaml``) loaded into
:class:`PDServeConfig`. Defaults live in this package and nowhere else; every other module
receives an already validated config object. Loading failures raise :class:`ConfigError`
with one line per problem, each naming the field path, so ``pdserve up`` can fail at start
with a message a person can act on.

Each section's models live in a module of their own in this package (``cluster.config``
re-exports what the rest of the project imports). Pure: pydantic and yaml only (no Ray,
vLLM, torch or HTTP).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from cluster.autoscaling.config import AutoscalingConfig, ReplicaBounds
from cluster.config.canary import CanaryConfig
from cluster.config.engine import EngineConfig, PoolConfig
from cluster.config.kv_transfer import KVTransferConfig
from cluster.config.model import VERSION_PATTERN, Checkpoint, ModelConfig, VersionConfig
from cluster.config.ray import RayConfig
from cluster.config.router import RouterConfig
from cluster.slo import SLOConfig
from cluster.strict import StrictModel

DEFAULT_CONFIG_PATH = Path("ray_configs/local.yaml")


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


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
