"""Builds the Ray Serve application of a pdserve cluster from its config.

``build_app(config)`` wires the three deployments; ``app_builder`` is the import path for
Ray's own tooling: ``serve run cluster.app:app_builder config=ray_configs/local.yaml``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ray.serve import Application, Deployment

from cluster.autoscaling.serve_policy import autoscaling_config_for
from cluster.checkpoints import ensure_checkpoints
from cluster.config import DEFAULT_CONFIG_PATH, PDServeConfig, load_config
from cluster.digest import short_digest
from cluster.engine.args import engine_kwargs, pool_deployment_options, stable_version
from decode.server import DecodeServer
from kv_transfer.connector import Role
from prefill.server import PrefillServer
from router.canary_rollout import RolloutController
from router.replica_routers import request_router_config
from router.server import Router


def build_app(config: PDServeConfig) -> Application:
    """The router in front of a prefill and a decode deployment per model version.

    Deployments are named ``prefill-<version>`` and ``decode-<version>``, so a version
    added to or removed from the config is a deployment added or removed, and the others
    keep running (and keep their streams) through ``serve deploy``.
    """
    code_version = _code_version()  # read the engine sources once per build
    pools = {
        version: {
            role: _engine_deployment(config, version, role, code_version).bind(config, version)
            for role in ("prefill", "decode")
        }
        for version in config.versions
    }
    rollout = None
    if config.canary is not None:
        rollout = RolloutController.options(
            name="rollout", num_replicas=1, ray_actor_options={"num_cpus": 0}
        ).bind(config)
    return Router.options(
        name="router",
        num_replicas=config.router.replicas,
        max_ongoing_requests=config.router.max_ongoing_requests,
        # Bounded in front of the router too: nothing waits in the proxy without limit.
        max_queued_requests=config.router.max_queued_requests,
        graceful_shutdown_timeout_s=config.router.drain_timeout_s,
        ray_actor_options={"num_cpus": config.router.num_cpus},
    ).bind(config, pools, rollout)


def _engine_deployment(config: PDServeConfig, version: str, role: Role,
                       code_version: str) -> Deployment:
    server = PrefillServer if role == "prefill" else DecodeServer
    pool = config.pool(version, role)
    bounds = config.scaling_bounds(version, role)
    # Each pool's own policy; under `serve deploy` of `pdserve serve-config` output, an
    # application-level policy (coupled pools) takes precedence over these.
    scaling = None if bounds is None else autoscaling_config_for(
        role, bounds, config.autoscaling, config.slo, initial_replicas=pool.replicas)
    # the engine arguments this pool's replicas start with (pool overrides included)
    engine = engine_kwargs(config, role, None, version)
    deployment = server.options(
        name=f"{role}-{version}", **pool_deployment_options(pool, scaling),
        # prefix affinity (prefill) and least-loaded (decode) instead of power-of-two
        request_router_config=request_router_config(
            role, config.router.routing, block_size=engine["block_size"],
            max_num_seqs=engine["max_num_seqs"]),
    )
    # Serve's public API no longer takes a version; without one, every deploy restarts
    # every engine. test_rollout checks that an unchanged engine keeps its replica.
    deployment._version = stable_version(config, version, role, code_version)
    return deployment


# What an engine replica runs: these folders and every project module they import. A change
# to any of them must replace the engine replicas; anything else (the router) must not.
ENGINE_PACKAGES = ("cluster/engine", "prefill", "decode", "kv_transfer")
PROJECT_PACKAGES = ("cluster", "router", "prefill", "decode", "kv_transfer")
ROOT = Path(__file__).resolve().parents[1]


def engine_sources(root: Path = ROOT) -> list[Path]:
    """The engine packages' files and, transitively, the project modules they import."""
    pending = [f for package in ENGINE_PACKAGES for f in (root / package).rglob("*.py")]
    seen: set[Path] = set()
    while pending:
        source = pending.pop()
        if source in seen:
            continue
        seen.add(source)
        pending.extend(_imported_project_files(source, root))
    return sorted(seen)


def _imported_project_files(source: Path, root: Path) -> list[Path]:
    """Project files that ``source`` imports anywhere (lazy imports in functions too)."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(source.read_bytes())):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.append(node.module)
            modules.extend(f"{node.module}.{alias.name}" for alias in node.names)
    files = []
    for module in modules:
        if module.split(".")[0] not in PROJECT_PACKAGES:
            continue
        base = root.joinpath(*module.split("."))
        files.extend(f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file())
    return files


def _code_version() -> str:
    """A digest of the engine side's source: new code means new engine replicas."""
    # each file's path, then its bytes, in order: the same digest as hashing them one by one
    return short_digest(b"".join(str(source.relative_to(ROOT)).encode() + source.read_bytes()
                                 for source in engine_sources()))


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve run`` / ``serve deploy`` (args: ``config=<path>``; other
    arguments, e.g. ``config_digest`` from cluster.serve_config, only version the app)."""
    config = load_config(args.get("config", DEFAULT_CONFIG_PATH))
    ensure_checkpoints(config)
    return build_app(config)
