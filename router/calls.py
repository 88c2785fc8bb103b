"""Bounded waits on Serve handle calls that never cancel the call (shell: asyncio).

Cancelling a Serve call that still waits for a replica (its pool emptied while Serve
replaces it) was followed, in the fault suite, by the next call to that deployment waiting
for a replica long after new ones were up: a decode retry waited out its 300 s deadline
while the new replicas answered fresh requests at once. A call its caller stops waiting
for is left to finish in the background instead (a KV handle's release, statistics, the
rollout controller's sync: none of them harms anything when it lands late).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

_LEFT: set[asyncio.Future] = set()  # calls given up on, kept until they end


async def answer_within(call: Awaitable[T], timeout_s: float) -> T:
    """``call``'s answer; ``TimeoutError`` after ``timeout_s`` seconds, the call left
    running (never cancelled)."""
    future = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({future}, timeout=timeout_s)
    if not done:
        _LEFT.add(future)
        future.add_done_callback(_forget)
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    return future.result()


def _forget(future: asyncio.Future) -> None:
    _LEFT.discard(future)
    if not future.cancelled():
        future.exception()  # retrieved: a late failure is nobody's to raise
