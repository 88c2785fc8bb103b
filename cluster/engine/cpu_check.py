"""Refuse an engine whose quantization settings this machine's CPU cannot run (shell).

The rules are in cluster/engine/cpu_support.py; this reads the machine (architecture,
/proc/cpuinfo) and the checkpoint (``config.json``) they apply to. An engine replica checks
on its own node before vLLM starts, and `pdserve up` checks a local cluster before Ray
starts, so the message reaches the operator instead of a stack trace from the kernels.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from cluster.config import PDServeConfig
from cluster.engine import cpu_support
from kv_transfer.connector import Role

ROLES: tuple[Role, ...] = ("prefill", "decode")


class EngineUnsupported(RuntimeError):
    """This machine cannot run the engine as configured (the message says why)."""


def local_processor() -> cpu_support.Processor:
    """This machine's processor (no flags where /proc/cpuinfo cannot be read)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return cpu_support.Processor(platform.machine(), cpu_support.cpuinfo_flags(cpuinfo))


def engine_refusals(config: PDServeConfig, role: Role, version: str,
                    cpu: cpu_support.Processor) -> list[str]:
    """Why ``role``'s engine of ``version`` cannot run on ``cpu`` (empty: it can). Pools
    with GPUs compute there and are not checked."""
    if config.pool(version, role).num_gpus:
        return []
    hf_config = json.loads((config.versions[version].path / "config.json").read_text())
    quantization = config.engine.quantization or cpu_support.checkpoint_quantization(hf_config)
    return [f"{role} pool of version {version}: {reason}" for reason in
            cpu_support.engine_refusals(kv_cache_dtype=config.engine.kv_cache_dtype,
                                        head_size=cpu_support.head_size(hf_config),
                                        quantization=quantization, cpu=cpu,
                                        dtype=config.engine.dtype)]


def check_engine(config: PDServeConfig, role: Role, version: str) -> None:
    """Raise EngineUnsupported if this machine cannot run ``role``'s engine of ``version``."""
    reasons = engine_refusals(config, role, version, local_processor())
    if reasons:
        raise EngineUnsupported("; ".join(reasons))


def local_cluster_refusals(config: PDServeConfig) -> list[str]:
    """Every engine of a local cluster (all on this machine) that this CPU cannot run."""
    cpu = local_processor()
    return [reason for version in config.versions for role in ROLES
            for reason in engine_refusals(config, role, version, cpu)]
