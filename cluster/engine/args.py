"""vLLM engine arguments and environment for one replica of a pool (pure).

Both pools share ``config.engine`` (the KV layout must match for blocks to be portable);
a pool may override other arguments (``engine_overrides``) and add environment
(``env``, e.g. CPU thread binding). The shell turns the result into ``AsyncEngineArgs``.

The benchmark's baseline, vLLM's own OpenAI server, gets its command line and environment
from the same functions (``baseline_flags``, ``baseline_env``), so that it runs exactly
the engine settings pdserve's engines run.
"""

from __future__ import annotations

import json
from typing import Any

from cluster.config import PDServeConfig, PoolConfig
from cluster.digest import short_digest
from cluster.engine.plugin_env import NICE_ENV, WAIT_ENV
from kv_transfer.connector import PROGRESS_THREAD_ENV, SHARED_MEMORY_ENV, Role

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # the cores a CPU engine's threads run on
# torch's switch that turns every torch.compile into the plain function
TORCH_COMPILE_DISABLE_ENV = "TORCH_COMPILE_DISABLE"
# vLLM flags that are plain switches (store_true): False is their default and has no
# --no- form. Every other boolean EngineArgs field takes --x / --no-x (vLLM 0.32).
_SWITCH_ONLY_FLAGS = frozenset({"disable_log_stats", "aggregate_engine_logging"})


def engine_kwargs(
    config: PDServeConfig, role: Role, kv_transfer_config: dict[str, Any] | None,
    version: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``AsyncEngineArgs`` for a replica of ``role`` serving
    ``version`` (default: the primary model's version)."""
    engine = config.engine
    version = version or config.model.version
    pool = config.pool(version, role)
    kwargs: dict[str, Any] = {
        "model": str(config.versions[version].path),
        "served_model_name": version,
        "dtype": engine.dtype,
        "max_model_len": engine.max_model_len,
        "block_size": engine.block_size,
        "enforce_eager": engine.enforce_eager,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "max_num_seqs": engine.max_num_seqs,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "tensor_parallel_size": pool.tensor_parallel_size,
        "seed": engine.seed,
        "kv_cache_dtype": engine.kv_cache_dtype,
        # pdserve reads the engine's statistics for its own metrics and routing.
        "disable_log_stats": False,
    }
    step_cap = pool.max_num_batched_tokens or engine.max_num_batched_tokens
    if step_cap is not None:
        kwargs["max_num_batched_tokens"] = step_cap
        kwargs["enable_chunked_prefill"] = True
    reasoning_parser = config.versions[version].reasoning_parser
    if reasoning_parser is not None:  # structured outputs start where reasoning ends
        kwargs["reasoning_parser"] = reasoning_parser
    if engine.quantization is not None:
        kwargs["quantization"] = engine.quantization
    if kv_transfer_config is not None:
        kwargs["kv_transfer_config"] = kv_transfer_config
    if pool.speculative is not None:  # decode pools only (validated)
        kwargs["speculative_config"] = pool.speculative.engine_arg()
    kwargs.update(engine.extra)
    kwargs.update(pool.engine_overrides)
    return kwargs


def engine_env(
    config: PDServeConfig, role: Role, side_channel_host: str, side_channel_port: int,
    version: str | None = None,
) -> dict[str, str]:
    """Environment the engine's processes must inherit (set before the engine starts)."""
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": side_channel_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
    }
    if not config.kv_transfer.progress_thread:
        env[PROGRESS_THREAD_ENV] = "0"
    if config.kv_transfer.ucx_tls:
        env["UCX_TLS"] = config.kv_transfer.ucx_tls
    if config.kv_transfer.shared_memory:
        env[SHARED_MEMORY_ENV] = "1"
    env.update(engine_settings_env(config, role, version))
    return env


def engine_settings_env(config: PDServeConfig, role: Role,
                        version: str | None = None) -> dict[str, str]:
    """The part of ``engine_env`` that sets up the engine itself rather than its KV
    transfer: the CPU KV-cache size, then the pool's own ``env`` (last: it may override)."""
    env = {}
    if step_wait(config, role, version) == "sleep":
        env[WAIT_ENV] = "sleep"
    nice = scheduler_nice(config, role, version)
    if nice is not None:
        env[NICE_ENV] = str(nice)
    if config.engine.cpu_kvcache_space_gib is not None:
        # Whole GiB (the config refuses a fraction): vLLM 0.32 reads it with int().
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.engine.cpu_kvcache_space_gib)
    if config.engine.enforce_eager:
        # Eager leaves the model uncompiled, yet vLLM 0.32 still torch.compiles a few
        # ops on their first use (the sampler's rank count behind logprobs, for one): on
        # a CPU engine that is a C++ build of ~20 s inside one engine step, which every
        # request on the engine waits out. Eager here means no compilation at all.
        env[TORCH_COMPILE_DISABLE_ENV] = "1"
    env.update(config.pool(version or config.model.version, role).env)
    return env


# engine.scheduler_nice "auto" on a pool without GPUs: ahead of the serving processes
# that share its cores (Ray starts every worker at nice 15), still behind what the system
# runs at -20.
CPU_SCHEDULER_NICE = -10


def step_wait(config: PDServeConfig, role: Role, version: str | None = None) -> str:
    """``engine.step_wait`` for the ``role`` pool: ``auto`` sleeps on a pool without GPUs,
    whose engines compute on the host cores a spinning wait would take."""
    wait = config.engine.step_wait
    if wait != "auto":
        return wait
    return "sleep" if _cpu_only(config, role, version) else "spin"


def scheduler_nice(config: PDServeConfig, role: Role, version: str | None = None) -> int | None:
    """``engine.scheduler_nice`` for the ``role`` pool (None: left as it is)."""
    nice = config.engine.scheduler_nice
    if nice != "auto":
        return nice
    return CPU_SCHEDULER_NICE if _cpu_only(config, role, version) else None


def _cpu_only(config: PDServeConfig, role: Role, version: str | None) -> bool:
    return config.pool(version or config.model.version, role).num_gpus == 0


def baseline_flags(config: PDServeConfig, role: Role = "decode") -> list[str]:
    """Command-line flags of vLLM's OpenAI server running the ``role`` pool's engine.

    The same ``engine_kwargs`` as that pool's replicas of the primary version (``extra``
    and the pool's overrides included), without KV transfer, and serving the model under
    the name clients ask for rather than the version's name.
    """
    kwargs = engine_kwargs(config, role, None)
    kwargs["served_model_name"] = config.model.name
    return cli_flags(kwargs)


def baseline_env(config: PDServeConfig, role: Role = "decode",
                 cpu_bind: str | None = None) -> dict[str, str]:
    """Environment of that baseline server: the pool's ``engine_settings_env``, except that
    its cores are the caller's choice (``cpu_bind``; None: unbound), not the pool's."""
    env = {k: v for k, v in engine_settings_env(config, role).items() if k != CPU_BIND_ENV}
    if cpu_bind:
        env[CPU_BIND_ENV] = cpu_bind
    return env


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """``AsyncEngineArgs`` keyword arguments as vLLM's command-line flags (``--kebab-case``)."""
    return [part for name, value in kwargs.items() for part in _flag(name, value)]


def _flag(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        if value:
            return [flag]
        return [] if name in _SWITCH_ONLY_FLAGS else ["--no-" + flag[2:]]
    if value is None:
        # on the command line, leaving a flag out means vLLM's default, which may not be None
        raise ValueError(f"engine argument {name}=None has no command-line form")
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    if isinstance(value, list | tuple):
        return [flag, *(str(item) for item in value)]
    return [flag, str(value)]


def pool_deployment_options(
    pool: PoolConfig, autoscaling_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Ray Serve deployment options of a pool's replicas.

    With ``autoscaling_config`` (cluster.autoscaling.serve_policy.autoscaling_config_for)
    the pool's policy sizes it, starting from ``replicas``; without, it has ``replicas``.
    A replica with tensor parallelism needs all its accelerators on one node: it gets a
    placement group of one bundle for the replica plus one per TP worker, packed strictly.
    """
    sizing: dict[str, Any] = ({"num_replicas": pool.replicas} if autoscaling_config is None
                              else {"autoscaling_config": autoscaling_config})
    options: dict[str, Any] = {
        **sizing,
        "max_ongoing_requests": pool.max_ongoing_requests,
        # Engines start in tens of seconds (minutes for a 70B model on GPUs).
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
        # A replica being replaced or scaled down finishes its streams first.
        "graceful_shutdown_timeout_s": pool.drain_timeout_s,
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


def stable_version(config: PDServeConfig, version: str, role: Role, code_version: str) -> str:
    """A deployment version for Serve that changes only with what the engine depends on.

    Serve gives every deployment a fresh random version on each deploy, which would
    restart every engine (minutes on GPUs) when only, say, a router setting changed. With
    this digest, ``pdserve deploy`` replaces an engine deployment's replicas only when its
    model, engine arguments, pool, KV transfer or the installed pdserve changed.
    """
    relevant = {
        "version": version,
        "role": role,
        "code": code_version,
        "model": config.versions[version].model_dump(mode="json", exclude={"prefill",
                                                                            "decode"}),
        "engine": config.engine.model_dump(mode="json"),
        "pool": config.pool(version, role).model_dump(mode="json"),
        "kv_transfer": config.kv_transfer.model_dump(mode="json"),
    }
    return short_digest(json.dumps(relevant, sort_keys=True))
