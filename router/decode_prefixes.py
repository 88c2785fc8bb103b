"""The decode pools' prefix-cache beliefs, shared by their routers and the request flow (shell).

Serve's request router of a decode pool (router/replica_routers.py) records where each
request went; the request flow (router/flow.py) records what it finished with; the engine
client (router/engine_client.py) asks which replica holds the longest head of a new
prompt, to decide its path (router/disaggregation.py). The routers run on a loop thread
of their own, so every access takes the lock.

A module of its own, imported by reference (as router/pool_view.py): Serve pickles the
router module by value, so state kept there would be one copy in the routers and another
in the flow. No Ray imports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from router.replica_choice import DecodeCacheBelief

T = TypeVar("T")

_lock = threading.Lock()
_beliefs: dict[str, DecodeCacheBelief] = {}


class DecodeCacheLink:
    """One decode deployment's belief, as its routers, the request flow and the engine
    client use it; every access under the lock (none before a router installed one)."""

    def __init__(self, deployment: str):
        self.deployment = deployment

    def install(self, belief: DecodeCacheBelief) -> None:
        """A router of the deployment keeps ``belief``, unless one with the same settings
        is kept already: each handle of a pool has a router of its own (a stream's, a
        unary call's), made when first used, and all of them share one belief."""
        with _lock:
            kept = _beliefs.get(self.deployment)
            if kept is None or kept.settings != belief.settings:
                _beliefs[self.deployment] = belief

    def _apply(self, action: Callable[[DecodeCacheBelief], T], default: T) -> T:
        with _lock:
            belief = _beliefs.get(self.deployment)
            return default if belief is None else action(belief)

    def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Per replica, the leading blocks of ``token_ids`` it holds."""
        return self._apply(lambda belief: belief.match(token_ids), {})

    def holder(self, token_ids: Sequence[int]) -> tuple[str | None, int]:
        """The replica believed to hold the longest head of ``token_ids`` and how many
        tokens of it; ``(None, 0)`` before the pool's router exists or when none does."""
        return self._apply(lambda belief: belief.holder(token_ids), (None, 0))

    def routed(self, request_id: str, token_ids: Sequence[int], replica: str) -> None:
        self._apply(lambda belief: belief.routed(request_id, token_ids, replica), None)

    def finished(self, request_id: str, sequence: Sequence[int],
                 prompt: Sequence[int] = ()) -> None:
        """``request_id`` finished with ``sequence`` (``prompt`` and the answer) on its
        replica."""
        self._apply(lambda belief: belief.finished(request_id, sequence, prompt), None)

    def forget(self, replica: str) -> None:
        self._apply(lambda belief: belief.forget(replica), None)
