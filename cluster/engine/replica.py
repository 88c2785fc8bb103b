"""``EngineReplica``, the Serve deployment class both pools specialise (shell): one
``EngineHost`` per replica, its stats reports, health check and graceful shutdown.
``prefill/server.py`` and ``decode/server.py`` add the pool's request method.
"""

from __future__ import annotations

import logging
import time

from cluster.config import PDServeConfig
from cluster.engine.host import EngineHost
from cluster.engine.routing_stats import routing_stats_from
from kv_transfer.connector import Role

logger = logging.getLogger(__name__)


class EngineReplica:
    """What both pools' Serve deployments share: one engine per replica, its lifecycle.

    Subclasses add the pool's request method (``prefill`` or ``generate``).
    """

    role: Role

    def __init__(self, config: PDServeConfig, version: str):
        from cluster.engine.identity import current_replica_identity

        identity = current_replica_identity(config, config.pool_index(version, self.role))
        self._drain_timeout_s = config.pool(version, self.role).drain_timeout_s
        self._lease_s = config.kv_transfer.lease_s
        self._host = EngineHost.start(
            config,
            self.role,
            replica_id=identity.replica_id,
            side_channel_host=identity.side_channel_host,
            side_channel_ports=identity.side_channel_ports,
            version=version,
        )

    async def stats(self) -> dict:
        """The engine's statistics, and for how long it has held work without a step."""
        return {**self._host.stats.snapshot(),
                "engine_stalled_s": round(self._host.stalled_s(), 3)}

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """This replica's load for the pool's autoscaling policy (Serve polls it)."""
        return self._host.load.report(self._host.stats, time.monotonic())

    async def record_routing_stats(self) -> dict:
        """This replica's load for the pool's request router (Serve polls it every ~1 s)."""
        return routing_stats_from(self._host.stats, max_num_seqs=self._host.max_num_seqs,
                                  reported_at=time.time(), engine_dead=self._host.engine_dead,
                                  engine_stalled_s=self._host.stalled_s())

    async def check_health(self) -> None:
        await self._host.check_health()

    async def __del__(self) -> None:
        """Serve's graceful shutdown (scale-down, rollout); Serve has already let in-flight
        requests finish. A prefill replica also keeps its engine until decode engines have
        pulled the KV blocks it holds for them, so a scale-down loses no request."""
        host = getattr(self, "_host", None)
        if host is None:
            return
        self._host = None
        if self.role == "prefill" and not await host.wait_released(self._drain_timeout_s):
            logger.warning("prefill replica stopping with KV blocks still unclaimed after "
                           "%.0fs", self._drain_timeout_s)
        host.shutdown()
