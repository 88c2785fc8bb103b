"""Where a replica's engine listens for NIXL peers (shell: reads Serve and Ray context)."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.config import PDServeConfig
from kv_transfer.ports import PortPlan, side_channel_ports_to_try


@dataclass(frozen=True)
class ReplicaIdentity:
    replica_id: str
    side_channel_host: str
    side_channel_ports: tuple[int, ...]  # its own first, then its pool's other slots


def current_replica_identity(config: PDServeConfig, pool_index: int) -> ReplicaIdentity:
    """Identity of the Serve replica this runs in; ports come from its per-node rank."""
    import ray
    from ray import serve

    context = serve.get_replica_context()
    kv = config.kv_transfer
    plan = PortPlan(base_port=kv.side_channel_base_port, span=kv.side_channel_port_span)
    rank = context.rank.local_rank if kv.port_rank == "node" else context.rank.rank
    return ReplicaIdentity(
        replica_id=context.replica_id.unique_id,
        side_channel_host=kv.side_channel_host or ray.util.get_node_ip_address(),
        side_channel_ports=tuple(side_channel_ports_to_try(plan, pool_index, rank)),
    )
