"""The liveness check of the callers engines watch (cluster/engine/callers.py,
``RayLiveness``), with Ray's actor lookup stood in for."""

from __future__ import annotations

import asyncio

from cluster.engine.callers import RayLiveness


def test_ray_liveness_remembers_only_the_callers_seen_last(monkeypatch):
    """Router replicas come and go; one whose requests all ended is never asked about
    again, so what the liveness check keeps of callers is bounded (the oldest forgotten)."""
    import ray

    class Ready:
        async def _ready(self):
            return True

        def remote(self):
            return self._ready()

    class Handle:
        __ray_ready__ = Ready()

    looked_up = []

    def get_actor(name, namespace=None):
        looked_up.append(name)
        if name.startswith("gone"):
            raise ValueError(name)
        return Handle()

    monkeypatch.setattr(ray, "get_actor", get_actor)
    liveness = RayLiveness(remembered=3)

    async def ask(names):
        return [await liveness.alive(("serve", name)) for name in names]

    assert asyncio.run(ask(["a", "b", "c", "d", "gone1", "gone2", "gone3", "gone4"])) == \
        [True] * 4 + [None] * 4
    assert asyncio.run(ask(["d", "a"])) == [True, True]
    assert looked_up.count("d") == 1 and looked_up.count("a") == 2  # "a" was forgotten
