"""How many replicas of each pool the routers in this process know, and how much they
measure the other router replicas send the pool (no Ray imports).

Serve's request router of a pool (router/replica_routers.py) drops a replica as soon as a
call to it fails with the actor dead, before the controller's next broadcast, and takes
the controller's list at each broadcast. It records the count here; the request flow
(router/flow.py) reads it to stop waiting on a pool that has no replica left. It also
records which replica each call went to, so that the flow can keep a retry off the
replica whose attempt failed.

A module of its own: Serve pickles the router module by value, so a dict kept there would
be a copy in the routers and another in the flow. This one is imported by reference.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

# Calls whose replica is remembered per deployment: far more than a router replica has in
# flight, so a failed call's is still there when its retry is made.
ROUTED_KEPT = 10_000

_known: dict[str, int] = {}
_others: dict[str, float] = {}
_routed: dict[str, OrderedDict[str, str]] = {}
_routed_lock = threading.Lock()     # the routers' loop thread writes, the flow's reads


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


def record_routed(deployment: str, request_id: str, replica: str) -> None:
    """A router of ``deployment`` sent the call of ``request_id`` to ``replica`` (the
    latest routing of an id wins)."""
    with _routed_lock:
        routed = _routed.setdefault(deployment, OrderedDict())
        routed.pop(request_id, None)
        routed[request_id] = replica
        while len(routed) > ROUTED_KEPT:
            routed.popitem(last=False)


def routed_to(deployment: str, request_id: str) -> str | None:
    """The replica of ``deployment`` the call of ``request_id`` was last sent to (None:
    not routed here, or long ago)."""
    with _routed_lock:
        return _routed.get(deployment, {}).get(request_id)
