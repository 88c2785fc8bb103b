"""The one configuration model of a pdserve cluster (pure).

A cluster is described by one YAML file (default ``ray_configs/local.yaml``) loaded into
:class:`PDServeConfig` (``root.py``), whose sections have a module each: ``model.py``
(checkpoints and versions), ``engine.py`` (vLLM's arguments and the pools),
``kv_transfer.py``, ``canary.py``, ``router.py`` (the ingress), ``routing.py`` (replica
choice) and ``ray.py``. ``reference.py`` renders them all as ``docs/config.md``
(``pdserve config --describe``).

This package is pure: pydantic and yaml only (no Ray, vLLM, torch or HTTP). It re-exports
what the rest of the project imports from ``cluster.config``; the submodules are imported
by absolute name, so the import checks (tests/unit/test_purity.py) and the engine's code
version (cluster/app.py, ``engine_sources``) follow them.
"""

from cluster.config.canary import CanaryConfig
from cluster.config.engine import PoolConfig, SpeculativeConfig
from cluster.config.model import Checkpoint, QuantizeSpec, TinyModelSpec, TinyTrainingSpec
from cluster.config.root import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    PDServeConfig,
    load_config,
    parse_config,
)
from cluster.config.router import (
    AdmissionConfig,
    AuthConfig,
    Deadlines,
    HAProxyConfig,
    ResponseCacheConfig,
    RetryConfig,
)
from cluster.config.routing import DecodeRoutingConfig, PrefillRoutingConfig, RoutingConfig
from cluster.slo import SLOConfig

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "AdmissionConfig",
    "AuthConfig",
    "CanaryConfig",
    "Checkpoint",
    "ConfigError",
    "Deadlines",
    "DecodeRoutingConfig",
    "HAProxyConfig",
    "PDServeConfig",
    "PoolConfig",
    "PrefillRoutingConfig",
    "QuantizeSpec",
    "ResponseCacheConfig",
    "RetryConfig",
    "RoutingConfig",
    "SLOConfig",
    "SpeculativeConfig",
    "TinyModelSpec",
    "TinyTrainingSpec",
    "load_config",
    "parse_config",
]
