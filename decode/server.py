"""The decode deployment: a vLLM engine as NIXL KV consumer.

``generate`` takes the tokenized prompt and, when the request was prefilled remotely, the
``KVHandle``; the engine's NixlConnector pulls the blocks from the prefill engine (the
decode engine computes only what was not transferred, e.g. a trailing partial block) and
tokens stream back as ``TokenChunk`` deltas. Without a handle the decode engine prefills the
prompt itself (the decode-local path).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ray import serve

from cluster.engine.host import EngineReplica
from cluster.engine.messages import EngineRequest, TokenChunk
from kv_transfer.handle import KVHandle


@serve.deployment
class DecodeServer(EngineReplica):
    role = "decode"

    async def generate(
        self, request: EngineRequest, handle: KVHandle | None
    ) -> AsyncIterator[TokenChunk]:
        """Stream the completion of ``request``; cancelling the stream aborts it."""
        params = handle.to_params() if handle is not None else None
        prompt_tokens = len(request.prompt_token_ids)
        completion_tokens = 0
        async for output in self._host.generate(request, kv_transfer_params=params):
            completion = output.outputs[0]
            completion_tokens += len(completion.token_ids)
            yield TokenChunk(
                text=completion.text,
                token_ids=tuple(completion.token_ids),
                completion_tokens=completion_tokens,
                prompt_tokens=prompt_tokens,
                finish_reason=completion.finish_reason if output.finished else None,
                cached_prompt_tokens=output.num_cached_tokens or 0,
                stop_reason=completion.stop_reason,
            )
