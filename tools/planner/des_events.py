"""The simulation's clock and event queue (pure: simulated seconds, no wall clock).

Actions run in the order of their times, those due at the same time in the order they
were scheduled.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventLoop:
    """A simulated clock (``now``) and the actions due on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` when the clock reaches ``when``."""
        heapq.heappush(self._events, (when, next(self._order), action))

    def run_events(self) -> None:
        """Run every action, each at its time, until none is left."""
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()
