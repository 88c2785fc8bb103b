"""A vLLM general plugin: NIXL agent settings that vLLM does not expose itself.

vLLM loads ``vllm.general_plugins`` entry points in every engine process (front end,
engine core, workers) before the KV connector is created, so this is where an agent
setting can be changed without patching vLLM's sources.

``PDSERVE_NIXL_PROGRESS_THREAD=0`` turns NIXL's progress thread off. That thread polls
UCX with a zero timeout and so keeps one core at 100% per engine even when idle; on a
CPU-only node that core is the one the engine computes on. Without it, transfers are
progressed when vLLM checks their state on each engine step, which is enough for CPU
engines and TCP. Leave the thread on (the default) on GPU nodes with RDMA, where
transfers should progress independently of the engine loop.

The plugin must stay importable without vLLM or NIXL work: it only wraps a factory.
"""

from __future__ import annotations

import os
import sys

PROGRESS_THREAD_ENV = "PDSERVE_NIXL_PROGRESS_THREAD"
_NIXL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"


def register() -> None:
    """Entry point (``vllm.general_plugins``); idempotent, may run in several processes."""
    if os.environ.get(PROGRESS_THREAD_ENV, "1") != "0":
        return
    from vllm.distributed import nixl_utils

    original = nixl_utils.nixl_agent_config
    if original is None or getattr(original, "_pdserve_wrapped", False):
        return

    def agent_config_without_progress_thread(*args, **kwargs):
        kwargs["enable_prog_thread"] = False
        return original(*args, **kwargs)

    agent_config_without_progress_thread._pdserve_wrapped = True
    nixl_utils.nixl_agent_config = agent_config_without_progress_thread
    # The NIXL worker module binds the name at import; patch it too if already loaded.
    worker_module = sys.modules.get(_NIXL_WORKER_MODULE)
    if worker_module is not None:
        worker_module.nixl_agent_config = agent_config_without_progress_thread
