"""Signs of life on an answer sent in one piece (shell: asyncio).

vLLM returns a unary request's answer only when it is whole, so its router would see
nothing for the whole generation and could bound the wait only by one deadline covering
every token (``first_token_s + token_gap_s * max_tokens``: hours). Instead the decode
replica sends a ``Progress`` every ``progress_interval_s`` in which its engine stepped,
and the router holds the answer to its gap deadline like a stream's tokens
(docs/design.md, "Retries, migration and deadlines").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from cluster.engine.messages import Progress


async def with_progress(outputs: AsyncIterator[Any], interval_s: float,
                        stalled_s: Callable[[], float]) -> AsyncIterator[Any]:
    """``outputs``, with a ``Progress`` after each ``interval_s`` without one in which the
    engine stepped (``stalled_s()``: how long it has held requests without a step). A
    hung engine sends none, so the router's deadline passes as for a hung stream.

    The next output is awaited in a task kept across the waits (a timeout must not
    cancel it: that would abort the request); closing this generator cancels it, which
    aborts the request in the engine as cancelling the plain iteration does."""
    pending = asyncio.ensure_future(anext(outputs))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                if stalled_s() < interval_s:
                    yield Progress()
                continue
            try:
                output = pending.result()
            except StopAsyncIteration:
                return
            yield output
            pending = asyncio.ensure_future(anext(outputs))
    finally:
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        await outputs.aclose()  # ended already, or left at an output: ends it now
