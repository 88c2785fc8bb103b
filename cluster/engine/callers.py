"""Abort the requests of a router replica that died (shell: Ray actors, asyncio).

Each request names its caller (``EngineRequest.caller``), and ``CallerWatch`` pings the
callers of an engine replica's requests in flight every ``period_s``: a caller Ray reports
dead (``ActorDiedError``) has its requests aborted in the engine; one that is slow to
answer, or whose name does not resolve at its first check, is left alone. Why:
docs/design.md, "Retries, migration and deadlines".
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

Caller = tuple[str, str]  # (namespace, actor name)

# Whether the caller's actor is alive: True, False (dead), or None (no answer in time).
Liveness = Callable[[Caller], Awaitable[bool | None]]


class CallerWatch:
    """The requests in flight on an engine, by caller; aborts those of dead callers."""

    def __init__(self, abort: Callable[[str], Awaitable[None]], *,
                 alive: Liveness | None = None, period_s: float = 2.0):
        """``abort(request_id)`` stops a request in the engine; ``alive`` checks a caller
        (default: Ray's actor lookup and ping, ``RayLiveness``)."""
        self._abort = abort
        self._alive = alive or RayLiveness().alive
        self._period_s = period_s
        self._requests: dict[str, Caller] = {}
        self._task: asyncio.Task | None = None

    def track(self, request_id: str, caller: Caller | None) -> None:
        """Watch ``request_id`` until ``untrack``; a request without a caller is not watched."""
        if caller is None:
            return
        self._requests[request_id] = tuple(caller)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def untrack(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    async def check_once(self) -> list[str]:
        """Check every caller of a request in flight once; abort (and return) the
        requests of those that died."""
        aborted = []
        for caller in set(self._requests.values()):
            if await self._alive(caller) is not False:
                continue
            orphans = [request_id for request_id, of in self._requests.items() if of == caller]
            logger.warning("router replica %s died; aborting its %d request(s) in flight: %s",
                           caller[1], len(orphans), ", ".join(orphans))
            for request_id in orphans:
                self.untrack(request_id)
                await self._abort(request_id)
            aborted.extend(orphans)
        return aborted

    async def _watch(self) -> None:
        # Checked at once when requests arrive: a new caller is looked up while it is
        # surely alive (it has just sent a request), then pinged every period.
        while self._requests:
            try:
                await self.check_once()
            except Exception:  # a failed check must not end the watch
                logger.exception("checking the callers of requests in flight failed")
            await asyncio.sleep(self._period_s)


class RayLiveness:
    """Whether a named Ray actor is alive, by looking it up and pinging it. Remembers the
    ``remembered`` callers seen last: router replicas come and go over weeks, and one whose
    requests all ended is never asked about again (so never found dead and forgotten)."""

    def __init__(self, timeout_s: float = 5.0, remembered: int = 256):
        self._timeout_s = timeout_s
        self._remembered = remembered
        self._handles: OrderedDict[Caller, object] = OrderedDict()  # resolved once
        self._warned: OrderedDict[Caller, None] = OrderedDict()

    def _remember(self, seen: OrderedDict, caller: Caller, value: object) -> None:
        seen[caller] = value
        seen.move_to_end(caller)
        while len(seen) > self._remembered:
            seen.popitem(last=False)

    def _unresolved(self, caller: Caller) -> None:
        if caller not in self._warned:
            self._remember(self._warned, caller, None)
            logger.warning("caller %s/%s does not resolve to a Ray actor; its requests "
                           "are not watched", *caller)

    async def alive(self, caller: Caller) -> bool | None:
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError

        namespace, name = caller
        handle = self._handles.get(caller)
        if handle is None:
            try:  # a blocking call to Ray's control store
                handle = await asyncio.to_thread(ray.get_actor, name, namespace=namespace)
            except ValueError:
                # Never resolved: the caller died before its first check, or the name is
                # wrong. Aborting on a wrong name would end every request, so: unknown.
                self._unresolved(caller)
                return None
            self._remember(self._handles, caller, handle)
        try:
            # Every actor answers __ray_ready__, whatever its class; a dead one raises.
            async with asyncio.timeout(self._timeout_s):
                await handle.__ray_ready__.remote()
        except ActorDiedError:
            self._handles.pop(caller, None)
            return False
        except (ActorUnavailableError, TimeoutError):  # may come back
            return None
        return True
