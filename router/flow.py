"""The per-request path through the pools: prefill → KV transfer → decode (shell).

The router holds Serve handles to both pools. A request is prefilled on a prefill replica,
whose answer is a KV handle; a decode replica then pulls the blocks (NIXL, inside vLLM)
and streams tokens. Every exit path of the stream (finished, client gone, error) leaves
no engine working on, or holding KV for, a request nobody reads.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from cluster.engine.messages import EngineRequest, PrefillResult
from router.disaggregation import Route

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DisaggregatedFlow:
    """Runs requests through a prefill pool and a decode pool given as Serve handles."""

    def __init__(self, prefill_handle, decode_handle):
        self._prefill = prefill_handle
        self._decode = decode_handle.options(stream=True)
        self._decode_unary = decode_handle

    async def generate(
        self, request: EngineRequest, path: Route = "disaggregated"
    ) -> AsyncIterator[Any]:
        """Yield the request's vLLM ``RequestOutput`` deltas; the last is ``finished``.

        On the ``decode_local`` path the decode engine prefills the prompt itself.

        If the consumer stops early (client disconnect → cancellation or ``aclose``),
        the decode stream is cancelled, which aborts the request in the decode engine;
        the engine's connector then releases the prompt's blocks on the prefill side.
        """
        handle = None
        if path == "disaggregated":
            # Cancelling while this await is pending cancels the prefill call too (Serve
            # propagates cancellation), and vLLM aborts it and frees its blocks at once.
            prefill: PrefillResult = await self._prefill.prefill.remote(request)
            handle = prefill.handle
        stream = self._decode.generate.remote(request, handle)
        finished = False
        try:
            async for output in stream:
                finished = output.finished
                yield output
        finally:
            if not finished:
                stream.cancel()
                logger.info("request %s stopped before it finished; aborted",
                            request.request_id)

    async def pool_stats(self) -> dict[str, dict]:
        """Statistics of one replica of each pool (the one Serve routes the call to)."""
        return {
            "prefill": await self._prefill.stats.remote(),
            "decode": await self._decode_unary.stats.remote(),
        }


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """``first`` followed by the rest of a stream whose head was already taken."""
    yield first
    async for item in rest:
        yield item
