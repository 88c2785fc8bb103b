"""vLLM engine arguments and environment for one replica of a pool (pure).

Both pools share ``config.engine`` (the KV layout must match for blocks to be portable);
a pool may override other arguments (``engine_overrides``) and add environment
(``env``, e.g. CPU thread binding). The shell turns the result into ``AsyncEngineArgs``.
"""

from __future__ import annotations

from typing import Any

from cluster.config import PDServeConfig, PoolConfig
from kv_transfer.connector import Role
from kv_transfer.vllm_plugin import PROGRESS_THREAD_ENV


def pool_config(config: PDServeConfig, role: Role) -> PoolConfig:
    return config.prefill if role == "prefill" else config.decode


def engine_kwargs(
    config: PDServeConfig, role: Role, kv_transfer_config: dict[str, Any] | None
) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``AsyncEngineArgs`` for a replica of ``role``."""
    engine = config.engine
    pool = pool_config(config, role)
    kwargs: dict[str, Any] = {
        "model": str(config.model.path),
        "served_model_name": config.model.name,
        "dtype": engine.dtype,
        "max_model_len": engine.max_model_len,
        "block_size": engine.block_size,
        "enforce_eager": engine.enforce_eager,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "max_num_seqs": engine.max_num_seqs,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "tensor_parallel_size": pool.tensor_parallel_size,
        "seed": engine.seed,
        # pdserve reads the engine's statistics for its own metrics and routing.
        "disable_log_stats": False,
    }
    if engine.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = engine.max_num_batched_tokens
    if kv_transfer_config is not None:
        kwargs["kv_transfer_config"] = kv_transfer_config
    kwargs.update(engine.extra)
    kwargs.update(pool.engine_overrides)
    return kwargs


def engine_env(
    config: PDServeConfig, role: Role, side_channel_host: str, side_channel_port: int
) -> dict[str, str]:
    """Environment the engine's processes must inherit (set before the engine starts)."""
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": side_channel_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
    }
    if config.engine.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = _gib_str(config.engine.cpu_kvcache_space_gib)
    if not config.kv_transfer.progress_thread:
        env[PROGRESS_THREAD_ENV] = "0"
    if config.kv_transfer.ucx_tls:
        env["UCX_TLS"] = config.kv_transfer.ucx_tls
    env.update(pool_config(config, role).env)
    return env


def _gib_str(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def pool_deployment_options(pool: PoolConfig) -> dict[str, Any]:
    """Ray Serve deployment options of a pool's replicas.

    A replica with tensor parallelism needs all its accelerators on one node: it gets a
    placement group of one bundle for the replica plus one per TP worker, packed strictly.
    """
    options: dict[str, Any] = {
        "num_replicas": pool.replicas,
        "max_ongoing_requests": pool.max_ongoing_requests,
        # Engines start in tens of seconds (minutes for a 70B model on GPUs).
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
    }
    if pool.tensor_parallel_size == 1:
        options["ray_actor_options"] = {
            "num_cpus": pool.num_cpus,
            "num_gpus": pool.num_gpus,
            "resources": dict(pool.resources),
        }
        return options
    worker_bundle: dict[str, float] = {"GPU": 1, **pool.resources} if pool.num_gpus else {
        "CPU": 1, **pool.resources
    }
    options["ray_actor_options"] = {"num_cpus": pool.num_cpus}
    options["placement_group_bundles"] = [{"CPU": pool.num_cpus}] + [
        dict(worker_bundle) for _ in range(pool.tensor_parallel_size)
    ]
    options["placement_group_strategy"] = "STRICT_PACK"
    return options
