"""The decode deployment: a vLLM engine as NIXL KV consumer.

``generate`` takes the tokenized prompt and, when the request was prefilled remotely, the
``KVHandle``; the engine's NixlConnector pulls the blocks from the prefill engine (the
decode engine computes only what was not transferred, e.g. a trailing partial block) and
tokens stream back as vLLM ``RequestOutput`` deltas. Without a handle the decode engine prefills the
prompt itself (the decode-local path).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from cluster.engine.messages import EngineRequest, Progress
from cluster.engine.replica import EngineReplica
from decode.pacing import hold_before_next, stream_interval
from decode.params import decode_params
from decode.progress import with_progress
from kv_transfer.handle import KVHandle


@serve.deployment
class DecodeServer(EngineReplica):
    role = "decode"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._paced_streams = 0  # streams being sent now, which set their pace

    async def generate(
        self, request: EngineRequest, handle: KVHandle | None
    ) -> AsyncIterator[Any]:
        """Stream vLLM ``RequestOutput`` deltas of ``request``; cancelling aborts it.

        A handle past its claim deadline is not pulled: the engine prefills the prompt.
        Each output leaves without the prompt's token ids: the router has them, and they
        would otherwise cross Ray with every token. A stream's outputs leave at most once
        per the interval decode/pacing.py gives for this replica's streams now (at most
        ``request.chunk_interval_s``): while this generator waits, vLLM merges the outputs
        it makes into the next delta. An answer sent in one piece is
        preceded by a ``Progress`` every ``request.progress_interval_s`` its engine works
        on (decode/progress.py).
        """
        if handle is not None and not handle.claimable_at(now := time.time()):
            await self._host.give_up_late_handle(
                request.request_id, handle.to_params(), release=handle.lease_running_at(now))
            handle = None
        params = decode_params(request.sampling,
                               handle.to_params() if handle is not None else None)
        outputs = self._host.generate(request, params)
        if request.progress_interval_s is not None:  # an answer sent in one piece
            outputs = with_progress(outputs, request.progress_interval_s,
                                    self._host.stalled_s)
        paced = request.chunk_interval_s > 0  # a stream (an answer in one piece is not)
        self._paced_streams += paced
        try:
            async for output in outputs:
                if isinstance(output, Progress):
                    yield output
                    continue
                output.prompt_token_ids = None
                output.prompt = None
                sent_at = time.monotonic()
                yield output
                interval = stream_interval(request.chunk_interval_s, self._paced_streams,
                                           request.chunks_per_s)
                hold = hold_before_next(sent_at, time.monotonic(), interval, output.finished)
                if hold:
                    await asyncio.sleep(hold)
        finally:
            self._paced_streams -= paced

    async def release_handle(self, request_id: str, handle: KVHandle) -> None:
        """Give up ``handle``: its prefill engine frees the blocks at once (the decode that
        was to pull them failed before its first token, and the retry prefills anew)."""
        await self._host.reject_transfer(request_id, handle.to_params())
