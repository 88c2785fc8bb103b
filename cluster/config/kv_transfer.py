"""The ``kv_transfer`` section of the config: how KV blocks cross from prefill to decode (pure).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cluster.strict import StrictModel


class KVTransferConfig(StrictModel):
    """How prefill replicas hand KV blocks to decode replicas (vLLM NixlConnector)."""

    connector: Literal["NixlConnector"] = "NixlConnector"
    buffer_device: Literal["cpu", "cuda"] = "cpu"
    load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute", description="a decode engine whose KV pull fails computes the prompt "
        "itself (recompute) instead of ending the request with finish_reason 'error' "
        "(vLLM's kv_load_failure_policy, whose own default is fail)",
    )
    lease_s: int = Field(
        30, ge=3, description="how long a prefill engine keeps a prompt's KV blocks that no "
        "decode engine has taken (vLLM's kv_lease_duration); a decode replica given the "
        "handle after two thirds of it prefills the prompt itself instead of pulling",
    )
    side_channel_base_port: int = Field(
        24600, ge=1024, le=65000, description="first NIXL side-channel port on each node; "
        "the range (a span per pool) must stay clear of Ray's worker ports, Serve's "
        "direct-ingress ports and the ephemeral ports outgoing connections take"
    )
    side_channel_port_span: int = Field(
        400, ge=1, description="ports tried above the base before giving up"
    )
    side_channel_host: str | None = Field(
        None, description="address peers use to reach an engine; default: the Ray node IP"
    )
    port_rank: Literal["node", "pool"] = Field(
        "node", description="which replica rank picks a side-channel port: its rank on its "
        "node, or in its pool (when several Ray nodes share an IP, as in the fake "
        "multi-node cluster)",
    )
    backends: list[str] = Field(default_factory=lambda: ["UCX"])
    progress_thread: bool = Field(
        True,
        description="NIXL's progress thread; it spins a core per engine, so CPU nodes turn "
        "it off (see kv_transfer/vllm_plugin.py)",
    )
    shared_memory: bool = Field(
        True, description="engines of one host move KV through shared memory: a prefill "
        "engine's KV cache is a memfd that a decode engine on its host maps and copies "
        "from (kv_transfer/shared_kv.py); engines of other hosts, or that cannot map it, "
        "move it over NIXL as ucx_tls says",
    )
    ucx_tls: str | None = Field(
        "tcp,cma,self", description="UCX_TLS for engines. UCX picks per peer among these: "
        "cma (the kernel copies from the other engine's memory: same host, no progress "
        "needed on the owner's side) when both engines share a host, tcp between hosts "
        "(and for connection set-up). null lets UCX choose from all it has (RDMA on GPU "
        "clusters); see `pdserve bench transfer`"
    )
