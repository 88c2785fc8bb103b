"""The OpenAI-compatible ingress deployment (shell).

Authenticates, picks the model version (canary weights, sticky per user), and hands the
request to vLLM's own OpenAI layer for that version (``router.vllm_frontend``): vLLM parses,
renders and validates it and writes the answer, while its engine client
(``router.engine_client``) runs it through admission and the pools. Every answer carries
the request id, the version and the router replica; every failure leaves as an OpenAI-style
JSON error, never a stack trace, and a failure before the first token keeps its status code
instead of becoming an error inside a 200 stream.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, Literal

import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.config import PDServeConfig
from cluster.metrics import outcome_for_status
from router.admission import client_key
from router.admission_gate import AdmissionGate, overloaded
from router.auth import admin_access, bearer_token, configured_keys, is_authorized
from router.calls import answer_within
from router.canary_rollout import RolloutClient
from router.decode_prefixes import DecodeCacheLink
from router.errors import (
    APIError,
    admin_key_required,
    bad_request,
    internal_error,
    method_not_allowed,
    model_not_found,
    request_timeout,
    route_not_found,
    service_unavailable,
    unauthorized,
)
from router.failures import error_response, failure_response, vllm_error_response
from router.flow import DisaggregatedFlow, prepend
from router.lifecycle import RequestLifecycle
from router.limits import (
    PerKeyConcurrency,
    check_body,
    check_declared_size,
    check_received_size,
)
from router.pool_view import known_replicas, other_routers, routed_to
from router.protocol import refuse_not_honoured
from router.proxy_edge import PreloadedBody
from router.response_cache import cache_store
from router.retry import RetryPolicy
from router.shared_check import SharedCheck
from router.sse import line_safe
from router.timing_metrics import RequestObserver, count_refusal, retry_counter
from router.transport import engine_handle
from router.versions import choose_version, sticky_key_for
from router.vllm_frontend import (
    Frontend,
    VersionFrontends,
    build_version,
    parse_json_body,
    parse_openai_request,
)

logger = logging.getLogger(__name__)

app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
app.add_middleware(PreloadedBody)  # a body sent ahead in the scope, see its docstring
# What vLLM's exception handlers, which the router reuses, read of their app.
app.state.args = SimpleNamespace(log_error_stack=False)

# /health: how long it waits for each pool, and how long its answer serves later probes.
HEALTH_WAIT_S = 5.0
HEALTH_FRESH_S = 1.0

Kind = Literal["chat", "completion"]
# vLLM's id prefixes: its answers are "chatcmpl-<id>" and "cmpl-<id>".
ID_PREFIX: dict[Kind, str] = {"chat": "chatcmpl", "completion": "cmpl"}


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
async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """A body vLLM's request models refuse: answered as vLLM's own server answers it."""
    from vllm.entrypoints.serve.exception_handling.handlers.validation import (
        validation_exception_handler,
    )

    count_refusal(400)
    return await validation_exception_handler(request, error)


@app.exception_handler(Exception)
async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    """Whatever escaped every other handler: logged here, answered without internals."""
    request_id = f"req-{uuid.uuid4().hex}"
    logger.error("request %s to %s failed: %r", request_id, request.url.path, error,
                 exc_info=error)
    count_refusal(500)
    return error_response(internal_error(request_id))


# Module-level helpers stand above the class: Serve captures it mid-import.
async def _read_body(request: Request, limit_bytes: int, timeout_s: float | None) -> bytes:
    """The body, refused with 413 from its declared length or, undeclared, once more than
    ``limit_bytes`` have arrived (never read whole first), and with 408 when it has not
    all arrived within ``timeout_s``."""
    check_declared_size(request.headers.get("content-length"), limit_bytes)
    chunks, received = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                received += len(chunk)
                check_received_size(received, limit_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise request_timeout(timeout_s) from None
    return b"".join(chunks)


def _parsed(kind: str, data: Any) -> Any:
    """vLLM's request model of ``kind``, or vLLM's answer to what its own checks refuse."""
    try:
        return parse_openai_request(kind, data)
    except RequestValidationError:
        raise  # answered by the handler above, as vLLM's server answers it
    except Exception as error:
        response = vllm_error_response(error)
        if response is None:
            raise
        count_refusal(response.status_code)
        return response


def _error_status(result: Any) -> int | None:
    """The status of an ``ErrorResponse`` vLLM's layer returned (None: not an error)."""
    error = getattr(result, "error", None)
    return int(error.code) if error is not None and hasattr(error, "code") else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _this_actor() -> tuple[str, str] | None:
    """This replica's Ray actor as (namespace, name); None outside a named actor.

    Serve names its replica actors in its own namespace; the runtime context's namespace
    is the job's, where that name does not resolve."""
    from ray.serve._private.constants import SERVE_NAMESPACE

    context = ray.get_runtime_context()
    name = context.get_actor_name() if context.get_actor_id() is not None else None
    return (SERVE_NAMESPACE, name) if name else None


def _routed_to(deployments: dict[str, str], stage: str, request_id: str) -> str | None:
    """The replica of ``stage``'s pool (its deployment in ``deployments``) that Serve's
    router here sent the call of ``request_id`` to."""
    return routed_to(deployments[stage], request_id)


@serve.deployment
@serve.ingress(app)
class Router:
    def __init__(self, config: PDServeConfig, pools: dict[str, dict], rollout=None):
        self._config = config
        self._versions: dict[str, VersionFrontends] = {}
        # each version's pool -> its Serve deployment (whose replicas this process knows)
        self._deployments = {name: {pool: pools[name][pool].deployment_name
                                    for pool in ("prefill", "decode")}
                             for name in config.versions}
        self._cache_store = cache_store(config.router.response_cache)
        self._tokenizing = PerKeyConcurrency(config.router.limits.max_tokenizing_per_key)
        caller = _this_actor()
        for name in config.versions:
            flow = DisaggregatedFlow(
                engine_handle(pools[name]["prefill"], config.router.transport),
                engine_handle(pools[name]["decode"], config.router.transport),
                retry=RetryPolicy.from_config(config.router.retries,
                                              config.router.deadlines.request_s),
                deadlines=config.router.deadlines,
                on_retry=retry_counter(name, functools.partial(self._fault_seen, name)),
                caller=caller, prefill_replicas=functools.partial(
                    known_replicas, pools[name]["prefill"].deployment_name),
                decode_cache=DecodeCacheLink(pools[name]["decode"].deployment_name),
                routed_to=functools.partial(_routed_to, {
                    stage: pools[name][stage].deployment_name
                    for stage in ("prefill", "decode")}))
            served = [served for served, weights in config.served_models.items()
                      if weights.get(name) is not None]
            self._versions[name] = build_version(config, name, flow, served, self._cache_store)
        self._rollout = RolloutClient(
            rollout, config.served_models,
            config.canary.served_model if config.canary is not None else None)
        self._gate = AdmissionGate(config.router.admission)
        self._health = SharedCheck(self._pools_down, fresh_s=HEALTH_FRESH_S)
        self._api_keys, self._admin_keys = configured_keys(config.router.auth, os.environ)
        self._random = random.Random()
        self._created = int(time.time())
        self._replica: str | None = None
        # vLLM, torch and transformers leave a large heap of objects that live as long as
        # the replica; a full collection over it stalls the event loop for seconds on a
        # busy core (refusals fired late, requests waited). Frozen, GC skips them, as
        # vLLM's engine does after its start.
        from vllm.utils.gc_utils import freeze_gc_heap

        freeze_gc_heap()

    # ---- endpoints -------------------------------------------------------------------

    @app.get("/health")
    async def health(self) -> JSONResponse:
        """200 when every pool of every version answers; else 503 naming those that do
        not (no replica, or none answering within 5 s). Probes at once share one check,
        and its answer serves for a second (router/shared_check.py)."""
        down = await self._health.result()
        if down:
            return error_response(service_unavailable(
                f"no engine replica answers in: {', '.join(down)}", 5))
        return JSONResponse({"status": "ok"})

    async def _pools_down(self) -> list[str]:
        """The pools none of whose replicas answers within HEALTH_WAIT_S."""
        async def answers(flow, role: str) -> bool:
            try:  # never cancelled: router/calls.py
                await answer_within(flow.pool_answers(role), HEALTH_WAIT_S)
                return True
            except Exception:
                return False

        pools = [(f"{role}-{name}", version.client.flow, role)
                 for name, version in self._versions.items()
                 for role in ("prefill", "decode")]
        up = await asyncio.gather(*(answers(flow, role) for _, flow, role in pools))
        return sorted(pool for (pool, _, _), ok in zip(pools, up, strict=True) if not ok)

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
        """Engine statistics of one version's pools (default: the primary version), each
        with how many of the pool's replicas this router replica routes to
        (``routed_replicas``: Serve's running ones; null before its first request there)
        and how many requests a load-report period it measures the other router replicas
        send the pool (``other_routers_per_period``: about 0 for a router alone; from one
        up, it draws its first choice: docs/design.md, "Replica choice")."""
        self._authorize_admin(request)
        name = version or self._config.model.version
        chosen = self._versions.get(name)
        if chosen is None:
            raise bad_request(f"unknown version {version!r}", "version")
        stats = await chosen.client.flow.pool_stats()
        return JSONResponse({pool: {
            **stats[pool], "routed_replicas": known_replicas(deployment),
            "other_routers_per_period": _rounded(other_routers(deployment))}
            for pool, deployment in self._deployments[name].items()})

    @app.get("/admin/rollout")
    async def rollout(self, request: Request) -> JSONResponse:
        """The weights in force per served name, the canary gate's recent decisions and
        the router replica that answered (rollouts replace it)."""
        self._authorize_admin(request)
        return JSONResponse({**await self._rollout.describe(),
                             "router_replica": self._replica_id})

    @app.get("/admin/admission")
    async def admission(self, request: Request) -> JSONResponse:
        """This router replica's admission state: the token budget in use and the queue."""
        self._authorize_admin(request)
        return JSONResponse({**self._gate.snapshot(), "router_replica": self._replica_id})

    @app.get("/admin/cache")
    async def cache(self, request: Request) -> JSONResponse:
        """This router replica's response cache: its store (entries and bytes for the
        memory store) and the answers being computed for waiting requests, per version."""
        self._authorize_admin(request)
        if self._cache_store is None:
            return JSONResponse({"enabled": False, "router_replica": self._replica_id})
        in_flight = {name: version.client.cache.in_flight
                     for name, version in self._versions.items()}
        return JSONResponse({"enabled": True, **self._cache_store.describe(),
                             "in_flight": in_flight, "router_replica": self._replica_id})

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._openai(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._openai(request, "chat")

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> JSONResponse:
        """vLLM's ``/tokenize``: a prompt or chat messages as the engines would see them."""
        return await self._tokenization(request, "tokenize")

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> JSONResponse:
        """vLLM's ``/detokenize``: token ids back to text."""
        return await self._tokenization(request, "detokenize")

    def _fault_seen(self, version: str, request_id: str) -> None:
        """A stage of a request of ``version`` failed: its canary sample says so."""
        self._versions[version].client.note_fault(request_id)

    # ---- who, and which version ------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        """Raise 401 unless authentication is off or the request carries a valid key."""
        authorization = request.headers.get("authorization")
        if not is_authorized(authorization, self._api_keys):
            raise unauthorized(has_key=bearer_token(authorization) is not None)

    def _authorize_admin(self, request: Request) -> None:
        """Raise 401 or 403 unless the request may use the admin endpoints."""
        authorization = request.headers.get("authorization")
        status = admin_access(authorization, self._admin_keys, self._api_keys)
        if status == 403:
            raise admin_key_required()
        if status == 401:
            raise unauthorized(has_key=bearer_token(authorization) is not None)

    def _choose_version(self, request: Request, served_name: str | None,
                        user: str | None) -> tuple[str, str, Frontend]:
        """The version that answers (sticky: router.version_stickiness) and the frontend
        of the served name the client asked for (default: the primary one)."""
        served_name = served_name or self._config.model.name
        weights = self._rollout.weights(served_name)
        if weights is None:
            raise model_not_found(served_name)
        # Sticky per API key (or per user, where the config trusts it): one conversation
        # stays on one version, and a client cannot pick the version it meets.
        sticky = sticky_key_for(user, request.headers.get("authorization"),
                                self._config.router.version_stickiness)
        name = choose_version(weights, sticky, self._random.random(), served_name=served_name)
        return name, served_name, self._versions[name].by_name[served_name]

    # ---- the serving path ------------------------------------------------------------

    @property
    def _replica_id(self) -> str:
        """This router replica (fixed for its life; answers carry it)."""
        if self._replica is None:
            self._replica = serve.get_replica_context().replica_id.unique_id
        return self._replica

    async def _openai(self, request: Request, kind: Kind):
        """Chat and completions: vLLM's layer runs the request, pdserve keeps the books."""
        arrival = time.monotonic()
        self._authorize(request)
        data = await self._json_body(request)
        refuse_not_honoured(data)
        body = _parsed(kind, data)
        if isinstance(body, JSONResponse):
            return body
        version_name, served_name, frontend = self._choose_version(
            request, body.model, body.user)
        key = uuid.uuid4().hex
        body.request_id = key  # vLLM's ids become "<prefix>-<key>": the client finds ours
        request_id = f"{ID_PREFIX[kind]}-{key}"
        lifecycle = RequestLifecycle(self._gate, request_id, RequestObserver(
            served_name, version_name, arrival, on_finish=self._rollout.record),
            client_key(request.headers.get("authorization"), body.user))
        headers = {"x-request-id": request_id, "x-pdserve-version": version_name,
                   "x-pdserve-router": self._replica_id}
        client = self._versions[version_name].client
        client.register(key, lifecycle)
        try:
            result = await (frontend.chat.create_chat_completion(body) if kind == "chat"
                            else frontend.completion.create_completion(body))
        except Exception as error:  # vLLM's layer re-raised it: the recorded failure is
            client.unregister(key)    # the original (router/failures.py, for_vllms_layer)
            return self._failed(lifecycle.failure or error, lifecycle, headers)
        except BaseException:
            client.unregister(key)
            lifecycle.finish("cancelled")
            raise
        if isinstance(result, AsyncIterator):
            return await self._stream(result, lifecycle, headers,
                                      lambda: client.unregister(key))
        client.unregister(key)
        return self._answer(result, lifecycle, {**headers, **lifecycle.cache_header()})

    def _answer(self, result: Any, lifecycle: RequestLifecycle,
                headers: dict[str, str]) -> JSONResponse:
        """A unary answer, or the error vLLM's layer formatted for a failure."""
        if lifecycle.failure is not None:
            return self._failed(lifecycle.failure, lifecycle, headers)
        status = _error_status(result)
        lifecycle.answered()
        lifecycle.finish("ok" if status is None else outcome_for_status(status))
        return JSONResponse(result.model_dump(), status_code=status or 200, headers=headers)

    def _failed(self, error: BaseException, lifecycle: RequestLifecycle,
                headers: dict[str, str]) -> JSONResponse:
        """The answer to a failure before any output, counted by its status."""
        response = failure_response(error, lifecycle.request_id)
        lifecycle.finish(outcome_for_status(response.status_code))
        response.headers.update(headers)
        return response

    async def _stream(self, events: AsyncIterator[str], lifecycle: RequestLifecycle,
                      headers: dict[str, str], done) -> Any:
        """Wait for the first event before answering 200: a refusal or a failure before
        any output then keeps its own status code instead of an error inside a stream."""
        try:
            first = await anext(events)
        except BaseException:
            done()
            lifecycle.finish("cancelled")
            raise
        if lifecycle.failure is not None:
            await events.aclose()
            done()
            return self._failed(lifecycle.failure, lifecycle, headers)
        lifecycle.answered()
        relayed = self._relay(prepend(first, events), lifecycle, done)
        return StreamingResponse(relayed, media_type="text/event-stream",
                                 headers={**headers, **lifecycle.cache_header()})

    async def _relay(self, events: AsyncIterator[str], lifecycle: RequestLifecycle,
                     done) -> AsyncIterator[str]:
        """The SSE events as vLLM's layer writes them, counted once however they end."""
        completed = False
        try:
            async for event in events:
                yield line_safe(event)
            completed = True
        finally:
            await events.aclose()
            done()
            if lifecycle.failure is not None:  # vLLM reported it inside the stream
                status = failure_response(lifecycle.failure, lifecycle.request_id).status_code
                lifecycle.finish(outcome_for_status(status))
            # a client that left stops the relay before its end
            lifecycle.finish("ok" if completed else "cancelled")

    async def _json_body(self, request: Request) -> Any:
        """The body as JSON within the configured limits (413 or 400 otherwise)."""
        limits = self._config.router.limits
        data = parse_json_body(await _read_body(request, limits.max_body_bytes,
                                                self._config.router.deadlines.body_s))
        check_body(data, max_stop_chars=limits.max_stop_chars,
                   max_user_chars=limits.max_user_chars, max_n=limits.max_n)
        return data

    async def _tokenization(self, request: Request, which: str) -> JSONResponse:
        self._authorize(request)
        # Counted from before the body is read: a slow upload is a call in progress too.
        key = client_key(request.headers.get("authorization"), None)
        if not self._tokenizing.enter(key):
            raise overloaded(429, 1, f"too many /{which} calls of this client at once "
                             "(router.limits.max_tokenizing_per_key); retry after a "
                             "moment", "too_many_concurrent_calls")
        try:
            body = _parsed(which, await self._json_body(request))
            if isinstance(body, JSONResponse):
                return body
            *_, frontend = self._choose_version(request, body.model, None)
            handler = (frontend.tokenization.create_tokenize if which == "tokenize"
                       else frontend.tokenization.create_detokenize)
            try:
                result = await handler(body, None)
            except Exception as error:
                response = vllm_error_response(error)
                if response is None:
                    raise
                return response
        finally:
            self._tokenizing.leave(key)
        return JSONResponse(result.model_dump(), status_code=_error_status(result) or 200)
