"""The prefill deployment: a vLLM engine as NIXL KV producer.

``prefill`` runs the prompt (one forward pass over it, chunked by vLLM's scheduler when
long), keeps the KV blocks pinned for a remote decode engine and returns a ``KVHandle``
saying where they are. The blocks are freed when the decode engine has read them, when it
rejects them, or when their lease expires.
"""

from __future__ import annotations

import time

from ray import serve

from cluster.engine.messages import EngineRequest, PrefillResult
from cluster.engine.replica import EngineReplica
from kv_transfer.handle import KVHandle
from prefill.params import prefill_params


@serve.deployment
class PrefillServer(EngineReplica):
    role = "prefill"

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        """Compute the prompt's KV and return where it waits for a decode engine."""
        final = None
        async for output in self._host.generate(request, prefill_params()):
            final = output
        if final is None:  # the engine ended the stream without an output
            raise RuntimeError(f"prefill of {request.request_id} produced no output")
        params = final.kv_transfer_params
        # The lease started when the engine finished the prompt, a moment ago.
        handle = (KVHandle.model_validate(params).with_lease(time.time(), self._lease_s)
                  if params else None)
        return PrefillResult(
            handle=handle,
            prompt_tokens=len(request.prompt_token_ids),
            cached_prompt_tokens=final.num_cached_tokens or 0,
        )
