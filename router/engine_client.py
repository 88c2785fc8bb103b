"""The engine vLLM's OpenAI serving classes talk to, carried out by pdserve's pools (shell).

vLLM's serving layer renders and validates a request, builds its ``SamplingParams`` and
calls ``generate``; here that call goes through pdserve instead of one local engine: the
router's admission (now that the prompt's token count and ``max_tokens`` are known), the
per-request choice of path (prefill pool + NIXL, or decode-local) and the decode pool's
stream of ``RequestOutput`` deltas. Each request the router serves is registered under its
id while vLLM's layer runs it, so ``generate`` finds its admission and metrics.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any

from cluster.engine.messages import EngineRequest
from router.admission import KEY_TENANT
from router.decode_prefixes import DecodeCacheLink
from router.disaggregation import PathChoice, Route, choose_path_with_cache
from router.errors import service_unavailable
from router.failures import for_vllms_layer
from router.flow import DisaggregatedFlow, continuation
from router.lifecycle import RequestLifecycle
from router.protocol import check_token_ids
from router.response_cache import (
    LeaderGone,
    Recording,
    ResponseCache,
    generated_tokens,
    replayed_output,
)
from router.retry import continuation_differs

logger = logging.getLogger(__name__)


def request_key(request_id: str) -> str:
    """The router's id inside vLLM's: "chatcmpl-<id>", "chatcmpl-<id>_<input index>" or
    "cmpl-<id>-<prompt index>" (the router's ids are hex: no "-" or "_")."""
    return request_id.split("-")[1].split("_")[0]


def kv_cost(token_ids: Sequence[int], sampling_params: Any) -> int:
    """What admission charges a request: the most KV it can come to hold, its prompt plus
    every token each of its choices may generate."""
    return len(token_ids) + sampling_params.max_tokens * sampling_params.n


def prefix_cache_salt(tenant: str, shared: bool) -> str | None:
    """The engines' prefix-cache salt for a request of ``tenant`` (``admission.client_key``):
    its hashed API key, unless caches are shared. A request without a key (authentication
    off) shares the cache: a ``user`` field is the client's to choose, so salting by it
    would isolate nobody."""
    return tenant if tenant.startswith(KEY_TENANT) and not shared else None


class PDEngineClient:
    """The part of vLLM's ``EngineClient`` its chat, completion and tokenization serving
    classes use (they read these attributes and call ``generate``)."""

    def __init__(self, vllm_config: Any, renderer: Any, flow: DisaggregatedFlow, *,
                 disaggregation_threshold: int, stream_chunk_interval_s: float = 0.0,
                 stream_chunks_per_s: float = 0.0,
                 cache: ResponseCache | None = None,
                 decode_cache: DecodeCacheLink | None = None,
                 shared_prefix_cache: bool = False,
                 validate: Callable[[Any], None] = lambda sampling_params: None):
        """``validate(sampling_params)`` raises what an engine's input processor would
        raise of them (router/vllm_frontend.py), before any engine sees the request;
        ``decode_cache``: the decode pool's prefix belief, when the path counts only the
        tokens the decode engine lacks (``router.routing.decode.cache_aware_path``);
        ``shared_prefix_cache``: requests of different keys may hit each other's cached
        prompts (else each key's are salted with it: ``prefix_cache_salt``)."""
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer
        self.input_processor = None  # beam search only; refused before it is reached
        self.errored = False         # a pool that fails answers per request instead
        self.dead_error = RuntimeError("the engine pools are unavailable")
        self.flow = flow
        self._threshold = disaggregation_threshold
        self._chunk_interval_s = stream_chunk_interval_s
        self._chunks_per_s = stream_chunks_per_s
        self._vocab_size = self.model_config.get_vocab_size()
        self._requests: dict[str, RequestLifecycle] = {}
        self.cache = cache
        self._decode_cache = decode_cache
        self._shared_prefix_cache = shared_prefix_cache
        self._validate = validate

    def register(self, key: str, lifecycle: RequestLifecycle) -> None:
        """A request vLLM's layer is about to run (a stream: until it ends)."""
        self._requests[key] = lifecycle

    def unregister(self, key: str) -> None:
        self._requests.pop(key, None)

    def note_fault(self, request_id: str) -> None:
        """A stage of the request with vLLM's (or a retry's) ``request_id`` failed."""
        lifecycle = self._requests.get(request_key(request_id))
        if lifecycle is not None:
            lifecycle.faulted()

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        """vLLM asks before rendering; pdserve admits in ``generate``, token count known."""

    async def notify_kv_transfer_request_rejected(self, *args: Any, **kwargs: Any) -> None:
        """Only for requests that arrive with KV of their own, which clients cannot send."""

    async def generate(self, prompt: Mapping[str, Any], sampling_params: Any, request_id: str,
                       *, reasoning_ended: bool | None = None,
                       reasoning_parser_kwargs: dict[str, Any] | None = None,
                       **_: Any) -> AsyncIterator[Any]:
        """Admit the rendered request, run it through the pools, yield ``RequestOutput``s:
        deltas when vLLM's layer asked for them, else one final output (the decode engine
        sends it whole; several pieces, should it send them, are merged)."""
        lifecycle = self._requests[request_key(request_id)]
        lifecycle.rendered()
        # one tuple from here on: the decode pool's prefix belief hashes it once for the
        # path choice, the decode router's ranking and its record (replica_choice.ChainMemo)
        token_ids = tuple(prompt["prompt_token_ids"])
        try:
            check_token_ids(token_ids, self._vocab_size)
            self._validate(sampling_params)
        except Exception as error:  # refused (APIError, vLLM's VLLMValidationError,
            # ValueError): a stream would carry it as a 500 event, so the router answers
            lifecycle.record_failure(error)
            raise
        cost = kv_cost(token_ids, sampling_params)
        path = self.route(token_ids, sampling_params)
        route = path.route
        # The prompts of one batched request run one after another: Serve gives the calls a
        # request makes its own internal id, and two streams of one id at once lose one.
        request = EngineRequest(request_id, token_ids, sampling_params,
                                reasoning_ended, reasoning_parser_kwargs,
                                chunk_interval_s=self._chunk_interval(sampling_params),
                                chunks_per_s=self._chunks_per_s,
                                decode_replica=path.decode_replica,
                                cache_salt=prefix_cache_salt(lifecycle.tenant,
                                                             self._shared_prefix_cache))
        key = self._cache_key(lifecycle, request)
        async with lifecycle.turn:
            if key is None:
                run = self._run(lifecycle, request, cost, route)
            else:
                run = self._through_cache(key, lifecycle, request, cost, route)
            async with aclosing(run) as outputs:
                async for output in outputs:
                    yield output

    def _cache_key(self, lifecycle: RequestLifecycle, request: EngineRequest) -> str | None:
        """The response cache's key for ``request``; None when it bypasses the cache (off,
        or an answer the request does not determine)."""
        if self.cache is None:
            return None
        key = self.cache.key_for(lifecycle.tenant, request.prompt_token_ids, request.sampling,
                                 {"reasoning_ended": request.reasoning_ended,
                                  "reasoning_parser_kwargs": request.reasoning_parser_kwargs})
        if key is None:
            lifecycle.cache_result("bypass")
            self.cache.count("bypass")
        return key

    async def _through_cache(self, key: str, lifecycle: RequestLifecycle,
                             request: EngineRequest, cost: int,
                             route: Route) -> AsyncIterator[Any]:
        """The stored answer (a hit: the pools and admission are spared), or the outputs of
        an identical request computing it now, streamed as they come (single flight),
        else the pools' answer, recorded for the identical requests to come."""
        from vllm.sampling_params import RequestOutputKind

        prompt = list(request.prompt_token_ids)
        lookup = await self.cache.lookup(key)
        if lookup.entry is not None:
            lifecycle.cache_result("hit")
            lifecycle.served_from_cache(len(prompt))
            self.cache.count("hit", len(prompt), generated_tokens(lookup.entry))
            yield replayed_output(lookup.entry, request.request_id, prompt)
            return
        if lookup.leader is not None:
            deltas = request.sampling.output_kind == RequestOutputKind.DELTA
            async for output in self._follow(lookup.leader, lifecycle, request, deltas):
                yield output
            return
        lifecycle.cache_result("miss")
        self.cache.count("miss")
        try:
            async with aclosing(self._run(lifecycle, request, cost, route)) as outputs:
                async for output in outputs:
                    lookup.recording.add(output)
                    yield output
        finally:
            lookup.recording.close()

    async def _follow(self, leader: Recording, lifecycle: RequestLifecycle,
                      request: EngineRequest, deltas: bool) -> AsyncIterator[Any]:
        """An identical request's outputs as they come. If it stops short (its client
        left, its pools failed it), this request goes on by itself: from its start if it
        has passed nothing on yet, else as a continuation of the tokens it passed on (as
        a migrated stream does: exact for greedy answers)."""
        prompt = list(request.prompt_token_ids)
        lifecycle.cache_result("hit")
        lifecycle.served_from_cache(len(prompt))
        sent: list[int] = []
        try:
            async with aclosing(leader.follow(request.request_id, deltas)) as outputs:
                async for output in outputs:
                    sent.extend(output.outputs[0].token_ids)
                    yield output
            self.cache.count("hit", len(prompt), len(sent))
            return
        except LeaderGone:
            pass
        if sent and (differs := continuation_differs(request.sampling)):
            refusal = service_unavailable(  # as a migrated stream's (router/flow.py)
                f"the answer this stream followed stopped and it cannot be continued "
                f"exactly ({differs}); retry")
            lifecycle.record_failure(refusal)
            raise for_vllms_layer(refusal, request.request_id)
        logger.info("request %s: the identical request it followed stopped after %d "
                    "tokens; it goes on by itself", request.request_id, len(sent))
        lifecycle.cache_result("miss")  # what a unary answer's header will say
        rest = continuation(request, sent, attempt=1) if sent else request
        path = self.route(list(rest.prompt_token_ids), rest.sampling)
        rest = dataclasses.replace(rest, decode_replica=path.decode_replica)
        route = path.route
        cost = kv_cost(rest.prompt_token_ids, rest.sampling)
        async with aclosing(self._run(lifecycle, rest, cost, route)) as outputs:
            async for output in outputs:
                output.prompt_token_ids = prompt
                output.request_id = request.request_id
                yield output

    async def _run(self, lifecycle: RequestLifecycle, request: EngineRequest, cost: int,
                   route: Route) -> AsyncIterator[Any]:
        from vllm.sampling_params import RequestOutputKind

        token_ids = list(request.prompt_token_ids)
        ticket = await lifecycle.admit(cost, len(token_ids), route)
        deltas = request.sampling.output_kind == RequestOutputKind.DELTA
        outputs = self.flow.generate(request, route, one_piece=not deltas,
                                     on_prefilled=lifecycle.prefilled)
        final = None
        try:
            async for output in outputs:
                lifecycle.observe(output)
                output.prompt_token_ids = token_ids
                if deltas:
                    yield output
                elif final is None:
                    final = output
                else:
                    final.add(output, aggregate=True)
            if final is not None:
                yield final
        except Exception as error:
            lifecycle.record_failure(error)  # what the router answers before a first output
            raise for_vllms_layer(error, request.request_id) from error
        except BaseException:
            # The client went away (vLLM's layer closed the stream), unless a failure of
            # another prompt of the batch made vLLM cancel this one: that failure counts.
            if lifecycle.failure is None:
                lifecycle.finish("cancelled")
            raise
        finally:
            lifecycle.release(ticket)
            await outputs.aclose()

    def _chunk_interval(self, sampling_params: Any) -> float:
        """A stream's chunks are paced (decode/pacing.py); a unary answer is one output."""
        from vllm.sampling_params import RequestOutputKind

        if sampling_params.output_kind == RequestOutputKind.DELTA:
            return self._chunk_interval_s
        return 0.0

    def route(self, token_ids: Sequence[int], sampling_params: Any) -> PathChoice:
        """Per-request disaggregation, and the requests the prefill pool cannot serve.

        ``n`` > 1: each choice on the decode engine would pull the same remote blocks,
        which the prefill engine frees after the first pull. Prompt logprobs (and chat
        ``echo``) make the decode engine recompute the prompt anyway. Both are prefilled
        by the decode engine. The rest go by the tokens the decode engine would compute:
        the prompt, less the head a decode replica holds (router/disaggregation.py).
        """
        if sampling_params.n > 1 or sampling_params.prompt_logprobs is not None:
            return PathChoice("decode_local")
        holder, held = (None, 0)
        if self._decode_cache is not None and len(token_ids) >= self._threshold > 0:
            holder, held = self._decode_cache.holder(token_ids)
        return choose_path_with_cache(len(token_ids), self._threshold, holder, held)
