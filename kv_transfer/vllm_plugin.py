"""A vLLM general plugin: NIXL connector settings and fixes that vLLM does not expose.

vLLM loads ``vllm.general_plugins`` entry points in every engine process before the KV
connector is created; the plugin only wraps factories, so it stays importable without
vLLM or NIXL work. ``PDSERVE_NIXL_PROGRESS_THREAD=0`` turns NIXL's progress thread off,
``PDSERVE_KV_SHARED_MEMORY=1`` installs ``kv_transfer/shared_kv.py``, and a connector's
construction always keeps the calling thread's CPU affinity. Why: docs/design.md, "NIXL's
progress thread is off on CPU nodes (a vLLM general plugin)", "Same-host KV moves through
the prefill engine's shared cache, between hosts by NIXL" and "Engines compute on their
own cores".
"""

from __future__ import annotations

import logging
import os
import sys

from kv_transfer.connector import PROGRESS_THREAD_ENV, SHARED_MEMORY_ENV

_NIXL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"

logger = logging.getLogger("vllm.pdserve")  # vLLM's handlers print it in the engine logs


def register() -> None:
    """Entry point (``vllm.general_plugins``); idempotent, may run in several processes."""
    _keep_thread_affinity_across_connectors()
    if os.environ.get(PROGRESS_THREAD_ENV, "1") == "0":
        _turn_progress_thread_off()
    if os.environ.get(SHARED_MEMORY_ENV) == "1":
        _share_kv_through_memory()


def _keep_thread_affinity_across_connectors() -> None:
    if not hasattr(os, "sched_getaffinity"):
        return
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    original = KVConnectorFactory.create_connector.__func__
    if getattr(original, "_pdserve_wrapped", False):
        return

    def create_connector(cls, *args, **kwargs):
        before = os.sched_getaffinity(0)
        try:
            return original(cls, *args, **kwargs)
        finally:
            if os.sched_getaffinity(0) != before:
                os.sched_setaffinity(0, before)
                logger.info("pdserve: the KV connector moved this thread to other cores; "
                            "put back on %s", sorted(before))

    create_connector._pdserve_wrapped = True
    KVConnectorFactory.create_connector = classmethod(create_connector)


def _turn_progress_thread_off() -> None:
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


def _share_kv_through_memory() -> None:
    from vllm.distributed import nixl_utils
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
        NixlBaseConnector,
    )

    base = nixl_utils.NixlWrapper  # vLLM's loader: sets UCX's environment, imports NIXL
    if base is None or getattr(base, "_pdserve_wrapped", False):
        return
    from kv_transfer.shared_kv import SharedKvAllocation, shared_memory_agent

    agent_class = shared_memory_agent(base)
    agent_class._pdserve_wrapped = True
    nixl_utils.NixlWrapper = agent_class
    worker_module = sys.modules.get(_NIXL_WORKER_MODULE)
    if worker_module is not None:  # it binds the name at import
        worker_module.NixlWrapper = agent_class

    from vllm.platforms import current_platform

    original = NixlBaseConnector.get_mem_pool_context

    def get_mem_pool_context(self):
        # Only a producer's cache is read by others; a decode engine's stays private. A
        # GPU engine's cache is not host memory: NIXL moves it (NVLink, RDMA), and its
        # worker's own memory pool (sleep mode) stays in place.
        context = original(self)
        if (context is None and current_platform.is_cpu()
                and self._kv_transfer_config.kv_role == "kv_producer"):
            return SharedKvAllocation()
        return context

    NixlBaseConnector.get_mem_pool_context = get_mem_pool_context
