"""Fake time for tests of the asyncio shells: a clock that moves only when told to.

No real time passes: ``FakeClock.sleep`` ends when the test advances the clock past the
sleeper's end, and ``eventually`` waits for observable state by yielding to the event loop,
within a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

DEADLINE_S = 5.0  # real seconds a test waits for a state the event loop reaches at once


class FakeClock:
    """``clock()`` gives ``now``; ``await clock.sleep(s)`` lasts until ``now`` reaches its end."""

    def __init__(self, now: float = 0.0):
        self.now = now
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        entry = (self.now + seconds, wake)
        self._sleepers.append(entry)
        try:
            await wake
        finally:
            self._sleepers.remove(entry)

    @property
    def wake_times(self) -> list[float]:
        """When the tasks asleep now will wake, earliest first."""
        return sorted(at for at, wake in self._sleepers if not wake.done())

    def advance_to(self, now: float) -> None:
        """Set the time to ``now`` (never backwards) and wake the sleepers whose end it is."""
        assert now >= self.now, "the clock only goes forward"
        self.now = now
        for at, wake in self._sleepers:
            if at <= now and not wake.done():
                wake.set_result(None)

    def advance(self, seconds: float) -> None:
        self.advance_to(self.now + seconds)


async def eventually(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    """Let the event loop run until ``condition()`` holds; fail after ``timeout_s``."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)  # a turn of the loop, not a wait for time to pass

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"not reached within {timeout_s}s: {condition}") from None


async def settled(task: asyncio.Future, timeout_s: float = DEADLINE_S):
    """``task``'s result (or exception), waiting at most ``timeout_s``."""
    return await asyncio.wait_for(task, timeout_s)
