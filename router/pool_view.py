"""How many replicas of each pool the routers in this process know, and how much they
measure the other router replicas send the pool (no Ray imports).

Serve's request router of a pool (router/replica_routers.py) drops a replica as soon as a
call to it fails with the actor dead, before the controller's next broadcast, and takes
the controller's list at each broadcast. It records the count here; the request flow
(router/flow.py) reads it to stop waiting on a pool that has no replica left.

A module of its own: Serve pickles the router module by value, so a dict kept there would
be a copy in the routers and another in the flow. This one is imported by reference.
"""

from __future__ import annotations

_known: dict[str, int] = {}
_others: dict[str, float] = {}


def record(deployment: str, replicas: int) -> None:
    """A router of ``deployment`` now knows ``replicas`` replicas (the latest word wins:
    every router of a deployment gets the same broadcasts)."""
    _known[deployment] = replicas


def known_replicas(deployment: str) -> int | None:
    """How many replicas of ``deployment`` a router here knows (None: none told yet).
    Safe from any thread: Serve's routers run on a loop of their own."""
    return _known.get(deployment)


def record_others(deployment: str, per_period: float) -> None:
    """The router of ``deployment`` measures that the other router replicas send it
    ``per_period`` requests a report period (``router.replica_choice.OtherRouters``)."""
    _others[deployment] = per_period


def other_routers(deployment: str) -> float | None:
    """What the other router replicas send ``deployment`` a report period, as this
    process's router measures it (None: it has not routed there yet)."""
    return _others.get(deployment)
