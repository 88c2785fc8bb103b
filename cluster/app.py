"""Builds the Ray Serve application of a pdserve cluster from its config.

``build_app(config)`` wires the three deployments; ``app_builder`` is the import path for
Ray's own tooling: ``serve run cluster.app:app_builder config=ray_configs/local.yaml``.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from cluster.config import DEFAULT_CONFIG_PATH, PDServeConfig, load_config
from cluster.engine_config import pool_deployment_options
from cluster.tiny_model import ensure_model
from decode.server import DecodeServer
from prefill.server import PrefillServer
from router.server import Router

APP_NAME = "pdserve"

# Each pool owns a slice of NIXL side-channel ports on every node (kv_transfer.ports).
PREFILL_POOL_INDEX = 0
DECODE_POOL_INDEX = 1


def build_app(config: PDServeConfig) -> Application:
    prefill = PrefillServer.options(
        name="prefill", **pool_deployment_options(config.prefill)
    ).bind(config, PREFILL_POOL_INDEX)
    decode = DecodeServer.options(
        name="decode", **pool_deployment_options(config.decode)
    ).bind(config, DECODE_POOL_INDEX)
    return Router.options(
        name="router",
        num_replicas=config.router.replicas,
        max_ongoing_requests=config.router.max_ongoing_requests,
        ray_actor_options={"num_cpus": config.router.num_cpus},
    ).bind(config, prefill, decode)


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve run`` / ``serve deploy`` (args: ``config=<path>``)."""
    config = load_config(args.get("config", DEFAULT_CONFIG_PATH))
    ensure_model(config.model.path, config.model.generate)
    return build_app(config)
