"""One check shared by every caller at a time, its answer kept briefly (shell: asyncio).

``/health`` is open (a balancer's probe carries no key) and asks every pool of every
version for an answer: a flood of probes would otherwise be a flood of calls into the
engine replicas. Concurrent probes share the check that is running, and its answer is
reused for ``fresh_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedCheck(Generic[T]):
    """``check()`` run at most once at a time; its result reused for ``fresh_s``."""

    def __init__(self, check: Callable[[], Awaitable[T]], fresh_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self._check, self._fresh_s, self._clock = check, fresh_s, clock
        self._last: tuple[float, T] | None = None
        self._running: asyncio.Future[T] | None = None

    async def result(self) -> T:
        if self._last is not None and self._clock() - self._last[0] < self._fresh_s:
            return self._last[1]
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())
        # shielded: one caller leaving (its client gone) must not end the others' check
        return await asyncio.shield(self._running)

    async def _run(self) -> T:
        try:
            result = await self._check()
            self._last = (self._clock(), result)
            return result
        finally:
            self._running = None
