"""NIXL side-channel ports: unique for every engine on a node, stable across restarts (pure).

Each engine's NixlConnector listens on ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (plus its
tensor-parallel rank, one port per worker), and peers reach it there to exchange block
layouts. Two replicas on one node must not share a port, or the second engine fails to
bind (or, worse, a decode engine handshakes with the wrong prefill engine). Ports are
derived from (pool, replica rank), both known before the engine starts, so a restarted
replica takes its predecessor's port instead of leaking a new one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PortPlan:
    """How the port range above ``base_port`` is carved up.

    Each pool (a role of a model version) owns a slice of ``span`` ports; within it each
    replica owns ``ports_per_replica`` consecutive ports (one per tensor-parallel worker).
    """

    base_port: int
    span: int
    ports_per_replica: int = 1

    def __post_init__(self) -> None:
        if self.ports_per_replica < 1 or self.span < self.ports_per_replica:
            raise ValueError("span must hold at least one replica's ports")
        if self.base_port < 1024:
            raise ValueError("base_port must not be a privileged port")

    @property
    def max_replicas_per_pool(self) -> int:
        return self.span // self.ports_per_replica


def side_channel_port(plan: PortPlan, pool_index: int, replica_rank: int) -> int:
    """The first side-channel port of replica ``replica_rank`` of pool ``pool_index``.

    Raises ``ValueError`` when the rank does not fit the pool's slice or the port would
    leave the valid range, so a misconfiguration fails at start, not at the first transfer.
    """
    if pool_index < 0 or replica_rank < 0:
        raise ValueError("pool_index and replica_rank must be non-negative")
    if replica_rank >= plan.max_replicas_per_pool:
        raise ValueError(
            f"replica rank {replica_rank} does not fit a span of {plan.span} ports "
            f"({plan.max_replicas_per_pool} replicas per pool); raise "
            "kv_transfer.side_channel_port_span"
        )
    port = plan.base_port + pool_index * plan.span + replica_rank * plan.ports_per_replica
    if port + plan.ports_per_replica - 1 > 65535:
        raise ValueError(f"side-channel port {port} is out of range; lower the base port")
    return port


def side_channel_ports_to_try(plan: PortPlan, pool_index: int,
                              replica_rank: int) -> list[int]:
    """The replica's own side-channel port, then the pool's other slots in order.

    Serve may give a running replica another rank (it keeps ranks contiguous as replicas
    come and go) while its engine keeps listening where it started, so a replica given
    that replica's old rank later finds its port held by a live engine: it takes the
    next free slot of its pool's slice instead of waiting for a port that will not be
    let go. The others are tried from the top of the slice down: ranks are given from 0 up,
    so a slot near the top is nobody's own port while its replica is still starting.
    """
    own = side_channel_port(plan, pool_index, replica_rank)
    return [own, *(side_channel_port(plan, pool_index, rank)
                   for rank in reversed(range(plan.max_replicas_per_pool))
                   if rank != replica_rank)]
