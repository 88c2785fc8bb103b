"""A vLLM general plugin: NIXL connector settings and fixes that vLLM does not expose.

vLLM loads ``vllm.general_plugins`` entry points in every engine process (front end,
engine core, workers) before the KV connector is created, so this is where an agent
setting can be changed without patching vLLM's sources. The plugin must stay importable
without vLLM or NIXL work: it only wraps factories.

``PDSERVE_NIXL_PROGRESS_THREAD=0`` turns NIXL's progress thread off. That thread polls
UCX with a zero timeout and so keeps one core at 100% per engine even when idle; on a
CPU-only node that core is the one the engine computes on. Without it, transfers are
progressed when vLLM checks their state on each engine step, which is enough for CPU
engines. Leave the thread on (the default) on GPU nodes with RDMA, where transfers should
progress independently of the engine loop.

``PDSERVE_KV_SHARED_MEMORY=1`` (``kv_transfer.shared_memory``) moves KV between engines
of one host through shared memory instead of UCX (``kv_transfer/shared_kv.py``): a
producer's KV cache is allocated as a memfd, through the allocation context a connector
may give (``get_mem_pool_context``), and every engine's NIXL agent is
``shared_memory_agent``'s subclass, which publishes that memory in its metadata and READs
a same-host peer's by copying.

Always: a KV connector's construction keeps the calling thread's CPU affinity. vLLM
0.32's NIXL worker on a CPU platform calls ``os.sched_setaffinity(0, ...)`` with the last
core of each NUMA node, meant to keep transfers off the cores that compute; but the thread
it pins is the one constructing it, the engine worker's main thread, which is also the
OpenMP thread that computes the model. A prefill engine bound to core 0 then computed on
core 1, beside the decode engine bound there (docs/design.md, "Engines compute on their
own cores").
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
