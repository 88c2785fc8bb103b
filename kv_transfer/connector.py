"""vLLM connector configuration for each role, and the KV plugin's settings (pure)."""

from __future__ import annotations

from typing import Any, Literal

Role = Literal["prefill", "decode"]

# The environment through which kv_transfer/vllm_plugin.py takes its settings.
PROGRESS_THREAD_ENV = "PDSERVE_NIXL_PROGRESS_THREAD"
SHARED_MEMORY_ENV = "PDSERVE_KV_SHARED_MEMORY"

# vLLM deprecated kv_both for disaggregation: producer on the prefill side, consumer on
# the decode side, so each engine only does the half of the protocol it needs.
_KV_ROLE: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def engine_id_for(pool: str, replica_id: str, host: str, port: int) -> str:
    """A NIXL engine id unique across the cluster and readable in logs.

    vLLM uses the engine id as the key of its handshake cache, so two replicas with the
    same id would corrupt each other's transfers.
    """
    return f"{pool}-{replica_id}-{host}-{port}"


def connector_config(
    role: Role,
    engine_id: str,
    *,
    connector: str = "NixlConnector",
    buffer_device: str = "cpu",
    backends: list[str] | None = None,
    load_failure_policy: str = "recompute",
    lease_s: int = 30,
) -> dict[str, Any]:
    """The ``kv_transfer_config`` argument of a vLLM engine of the given role.

    ``lease_s``: how long a prefill engine keeps blocks no decode engine has taken; both
    roles read it (the decode engine renews leases at a sixth of it).
    """
    return {
        "kv_connector": connector,
        "kv_role": _KV_ROLE[role],
        "kv_buffer_device": buffer_device,
        "engine_id": engine_id,
        "kv_connector_extra_config": {"backends": list(backends or ["UCX"]),
                                      "kv_lease_duration": lease_s},
        "kv_load_failure_policy": load_failure_policy,
    }
