"""The KV-transfer layer: what passes between the prefill and decode pools.

The typed KV handle and the NIXL side-channel addressing that keeps replicas from colliding
(both pure), the vLLM connector configuration of each role, and ``vllm_plugin`` (a shell:
vLLM loads it in every engine process to set NIXL's agent options). The engines apply
them; vLLM's NixlConnector moves the blocks, over NIXL between hosts and, between engines
of one host, through ``shared_kv`` (the prefill engine's cache mapped by the decode
engine; which bytes to copy is ``copy_plan``, pure).
"""

from kv_transfer.connector import connector_config, engine_id_for
from kv_transfer.handle import KVHandle, prefill_request_params
from kv_transfer.ports import PortPlan, side_channel_port

__all__ = [
    "KVHandle",
    "PortPlan",
    "connector_config",
    "engine_id_for",
    "prefill_request_params",
    "side_channel_port",
]
