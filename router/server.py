"""The OpenAI-compatible ingress deployment (shell).

Parses and validates requests (``router.protocol``), tokenizes them (one tokenizer for
both pools, so both engines see identical token ids), runs them through the pools
(``router.flow``) and writes OpenAI responses or SSE streams (``router.openai_format``).
Every failure leaves as an OpenAI-style JSON error; no stack trace reaches a client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.config import PDServeConfig
from cluster.engine.messages import EngineRequest, TokenChunk
from cluster.metrics import Outcome
from router import openai_format as fmt
from router.admission import client_key
from router.admission_gate import AdmissionGate
from router.auth import accepted_digests, bearer_token, is_authorized
from router.canary_rollout import RolloutClient
from router.disaggregation import choose_path
from router.errors import (
    APIError,
    bad_request,
    method_not_allowed,
    model_not_found,
    route_not_found,
    service_unavailable,
    unauthorized,
)
from router.failures import error_response
from router.flow import DisaggregatedFlow, prepend
from router.lifecycle import RequestLifecycle
from router.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    check_token_ids,
    parse_request,
    resolve_max_tokens,
)
from router.timing_metrics import RequestObserver, count_refusal
from router.versions import choose_version, sticky_key_for

logger = logging.getLogger(__name__)

app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)


@app.exception_handler(APIError)
async def _api_error(_: Request, error: APIError) -> JSONResponse:
    count_refusal(error.status)
    return error_response(error)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    if error.status_code == 405:
        return error_response(method_not_allowed(request.method, request.url.path))
    return error_response(route_not_found(request.url.path))


@app.exception_handler(RequestValidationError)
async def _validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
    count_refusal(400)
    return error_response(bad_request(str(error.errors()[0].get("msg", "invalid request"))))


@dataclass
class _Version:
    """What the router holds per model version: its tokenizer and its two pools."""

    tokenizer: object
    vocab_size: int
    flow: DisaggregatedFlow


RequestBody = CompletionRequest | ChatCompletionRequest
PromptIds = Callable[[Any, _Version], list[int]]


def completion_prompt_ids(body: CompletionRequest, version: _Version) -> list[int]:
    """The prompt of ``/v1/completions``: text tokenized, or token ids checked."""
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        return version.tokenizer.encode(prompt)
    check_token_ids(prompt, version.vocab_size)
    return list(prompt)


def chat_prompt_ids(body: ChatCompletionRequest, version: _Version) -> list[int]:
    """The prompt of ``/v1/chat/completions``: the messages through the chat template."""
    try:
        text = version.tokenizer.apply_chat_template(
            body.template_messages(), tokenize=False, add_generation_prompt=True
        )
    except Exception as error:  # a template may refuse e.g. a role order it cannot render
        raise bad_request(f"messages cannot be rendered: {error}", "messages") from None
    return version.tokenizer.encode(text, add_special_tokens=False)


@serve.deployment
@serve.ingress(app)
class Router:
    def __init__(self, config: PDServeConfig, pools: dict[str, dict], rollout=None):
        from transformers import AutoTokenizer

        self._config = config
        self._versions: dict[str, _Version] = {}
        for name, version in config.versions.items():
            tokenizer = AutoTokenizer.from_pretrained(str(version.path))
            flow = DisaggregatedFlow(pools[name]["prefill"], pools[name]["decode"])
            self._versions[name] = _Version(tokenizer, len(tokenizer), flow)
        self._rollout = RolloutClient(
            rollout, config.served_models,
            config.canary.served_model if config.canary is not None else None)
        self._gate = AdmissionGate(config.router.admission)
        auth = config.router.auth
        self._api_keys = accepted_digests(
            (key.get_secret_value() for key in auth.api_keys),
            os.environ.get(auth.api_keys_env) if auth.api_keys_env else None,
        )
        self._random = random.Random()
        self._created = int(time.time())
        self._replica: str | None = None

    # ---- endpoints -------------------------------------------------------------------

    @app.get("/health")
    async def health(self) -> JSONResponse:
        checks = [asyncio.ensure_future(version.flow.pool_stats())
                  for version in self._versions.values()]
        done, pending = await asyncio.wait(checks, timeout=5)
        for check in pending:
            check.cancel()
        # any pool unreachable or slow means not ready for traffic
        if pending or any(check.exception() is not None for check in done):
            return error_response(service_unavailable("an engine pool is not available", 5))
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        self._authorize(request)
        data = [{
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "pdserve",
            "max_model_len": self._config.engine.max_model_len,
        } for name in self._config.served_models]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/admin/stats")
    async def stats(self, request: Request, version: str | None = None) -> JSONResponse:
        """Engine statistics of one version's pools (default: the primary version)."""
        self._authorize(request)
        chosen = self._versions.get(version or self._config.model.version)
        if chosen is None:
            raise bad_request(f"unknown version {version!r}", "version")
        return JSONResponse(await chosen.flow.pool_stats())

    @app.get("/admin/rollout")
    async def rollout(self, request: Request) -> JSONResponse:
        """The weights in force per served name, the canary gate's recent decisions and
        the router replica that answered (rollouts replace it)."""
        self._authorize(request)
        return JSONResponse({**await self._rollout.describe(),
                             "router_replica": self._replica_id})

    @app.get("/admin/admission")
    async def admission(self, request: Request) -> JSONResponse:
        """This router replica's admission state: the token budget in use and the queue."""
        self._authorize(request)
        return JSONResponse({**self._gate.snapshot(), "router_replica": self._replica_id})

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._handle(request, CompletionRequest, completion_prompt_ids,
                                  "completion", "cmpl")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._handle(request, ChatCompletionRequest, chat_prompt_ids,
                                  "chat", "chatcmpl")

    async def _handle(self, request: Request, schema: type[RequestBody],
                      prompt_ids_of: PromptIds, kind: fmt.Kind, id_prefix: str):
        """Both endpoints: authenticate, parse, choose the version, tokenize, serve."""
        arrival = time.monotonic()
        self._authorize(request)
        body = parse_request(await request.body(), schema)
        version_name, version = self._choose_version(request, body.model, body.user)
        prompt_ids = prompt_ids_of(body, version)
        key = client_key(request.headers.get("authorization"), body.user)
        return await self._serve(body, prompt_ids, kind, id_prefix, arrival, key, version_name)

    # ---- who, and which version ------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        """Raise 401 unless authentication is off or the request carries a valid key."""
        authorization = request.headers.get("authorization")
        if not is_authorized(authorization, self._api_keys):
            raise unauthorized(has_key=bearer_token(authorization) is not None)

    def _choose_version(self, request: Request, served_name: str,
                        user: str | None) -> tuple[str, _Version]:
        weights = self._rollout.weights(served_name)
        if weights is None:
            raise model_not_found(served_name)
        # Sticky per user, else per API key: one conversation stays on one version.
        sticky = sticky_key_for(user, request.headers.get("authorization"))
        name = choose_version(weights, sticky, self._random.random(), served_name=served_name)
        return name, self._versions[name]

    # ---- the serving path ------------------------------------------------------------

    @property
    def _replica_id(self) -> str:
        """This router replica (fixed for its life; answers carry it)."""
        if self._replica is None:
            self._replica = serve.get_replica_context().replica_id.unique_id
        return self._replica

    async def _serve(
        self, body: RequestBody, prompt_ids: list[int], kind: fmt.Kind, id_prefix: str,
        arrival: float, key: str, version_name: str,
    ):
        version = self._versions[version_name]
        max_tokens = resolve_max_tokens(
            len(prompt_ids),
            body.requested_max_tokens(),
            self._config.engine.max_model_len,
            self._config.router.default_max_tokens,
        )
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
        path = choose_path(len(prompt_ids), self._config.router.disaggregation_threshold_tokens)
        lifecycle = RequestLifecycle(self._gate, request_id, RequestObserver(
            body.model, version_name, path, arrival, len(prompt_ids),
            on_finish=self._rollout.record))
        # The most KV this request can come to hold: prompt plus every allowed token.
        refusal = await lifecycle.admit(len(prompt_ids) + max_tokens, key, len(prompt_ids))
        if refusal is not None:
            return refusal
        engine_request = EngineRequest(request_id, tuple(prompt_ids), body.sampling(max_tokens))
        chunks = lifecycle.observed(version.flow.generate(engine_request, path))
        # Wait for the first token before answering, so that a failure before any
        # output still gets a proper status code instead of an error inside a 200 stream.
        first, failure = await lifecycle.attempt(anext(chunks))
        if failure is not None:
            await chunks.aclose()
            return failure
        meta = fmt.ResponseMeta(
            request_id, body.model, int(time.time()), kind, body.return_token_ids
        )
        headers = {"x-request-id": request_id, "x-pdserve-version": version_name,
                   "x-pdserve-router": self._replica_id}
        if body.stream:
            events = self._events(meta, prompt_ids, first, chunks, body.include_usage, lifecycle)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        try:
            response, failure = await lifecycle.attempt(
                self._collect(meta, prompt_ids, first, chunks))
        finally:
            await chunks.aclose()  # ends the decode stream and frees the admission ticket
        if failure is not None:
            return failure
        lifecycle.finish("ok")
        return JSONResponse(response, headers=headers)

    async def _collect(self, meta, prompt_ids, first: TokenChunk, chunks) -> dict:
        texts, token_ids, last = [first.text], list(first.token_ids), first
        async for chunk in chunks:
            texts.append(chunk.text)
            token_ids.extend(chunk.token_ids)
            last = chunk
        return fmt.full_response(
            meta, "".join(texts), token_ids, prompt_ids, last.finish_reason,
            last.completion_tokens, last.cached_prompt_tokens,
        )

    async def _events(
        self, meta, prompt_ids, first: TokenChunk, chunks, include_usage: bool,
        lifecycle: RequestLifecycle,
    ) -> AsyncIterator[str]:
        outcome: Outcome = "cancelled"  # unless the stream reaches its end
        try:
            start = fmt.stream_start(meta, prompt_ids)
            if start:
                yield start
            last = first
            pending_prompt_ids = None if start else prompt_ids
            async for chunk in prepend(first, chunks):
                event = fmt.stream_chunk(meta, chunk, pending_prompt_ids)
                if event:
                    yield event
                    pending_prompt_ids = None
                last = chunk
            if include_usage:
                yield fmt.stream_usage(meta, last)
            outcome = "ok"
        except Exception as error:  # the status line is gone: report inside the stream
            yield fmt.stream_error(lifecycle.stream_failure(error).body())
        finally:
            lifecycle.finish(outcome)
            await chunks.aclose()
        yield fmt.DONE_EVENT
