"""What clients meet first: Serve's HTTP proxy, made to speak like the API (shell).

``ProxyEdge`` wraps the proxy's ASGI app (installed through Serve's
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``, see ``cluster.serve_env.proxy_env``): it drops
the trusted-balancer headers, turns the proxy's plain-text errors and lost answers into
OpenAI errors (a cut event stream gets an error event), and reads a small POST body ahead
into the scope, where ``PreloadedBody``, wrapping the router's app, hands it over. What the
router answers itself passes through untouched. Why: docs/design.md, "What Serve's proxy
answers by itself is made an OpenAI error" and "A request's body travels with it, in the
scope".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from cluster.serve_env import CLIENT_READ_ENV
from router.limits import declared_length

logger = logging.getLogger(__name__)

_TYPE_BY_STATUS = {408: "timeout", 429: "rate_limit_exceeded", 500: "internal_error",
                   503: "service_unavailable"}
# Serve's per-request hints (ray.serve._private.constants), for a balancer, not clients.
PROXY_HINT_HEADERS = (b"x-request-timeout-seconds", b"x-request-disconnect-disabled")
LOST_REPLICA_MESSAGE = ("The router replica serving this request was lost before it "
                        "answered; send the request again.")
# Seconds a client waits before sending a request whose router replica was lost: by then
# Serve (or HAProxy) sends it to a replica that is up.
LOST_REPLICA_RETRY_AFTER_S = 1
CUT_STREAM_MESSAGE = "The router replica serving this stream was lost; the stream is incomplete."
# The scope key a request's body travels under, and the largest body read ahead: a chat
# of 8K prompt tokens is ~40 KB of JSON; a larger body streams to the router as before.
PRELOADED_BODY = "pdserve.preloaded_body"
PRELOAD_MAX_BYTES = 1 << 20
# How long the proxy waits for a body before passing the request on without it: a client
# sends its body with its headers; a slow upload is read by the router under the
# request's own timeouts, not held here where none applies.
PRELOAD_WAIT_S = 0.5
# How long a client may leave a chunk of its answer unread before it is taken for gone
# (router.deadlines.client_read_s, through CLIENT_READ_ENV): its events would otherwise
# pile up in the proxy, and its request hold an engine, for a reader that never comes.
CLIENT_READ_S = 60.0


def proxy_middlewares() -> list[Any]:
    """Serve's proxy callback: the middlewares to wrap its ASGI app in."""
    from starlette.middleware import Middleware

    return [Middleware(ProxyEdge)]


def error_body(status: int, message: str) -> bytes:
    """An OpenAI error body for a status the proxy chose."""
    kind = _TYPE_BY_STATUS.get(status, "api_error")
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": kind}}).encode()


def is_plain_error(start: dict[str, Any]) -> bool:
    """A response start that is an error in something other than JSON."""
    if start["status"] < 400:
        return False
    content_type = dict(start.get("headers") or []).get(b"content-type", b"")
    return not content_type.startswith(b"application/json")


def without_proxy_hints(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` without the headers that would lift the proxy's timeout or its handling
    of a client that left."""
    headers = scope.get("headers") or []
    kept = [(name, value) for name, value in headers
            if name.lower() not in PROXY_HINT_HEADERS]
    return scope if len(kept) == len(headers) else {**scope, "headers": kept}


def _json_start(status: int, body: bytes, headers: list | None = None) -> dict[str, Any]:
    kept = [(name, value) for name, value in headers or []
            if name.lower() not in (b"content-type", b"content-length")]
    return {"type": "http.response.start", "status": status,
            "headers": [*kept, (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]}


def client_read_s(env: dict[str, str]) -> float | None:
    """The deadline on a client's reading that ``env`` sets (None: none)."""
    value = env.get(CLIENT_READ_ENV)
    if value is None:
        return CLIENT_READ_S
    return None if value.lower() in ("", "none", "0") else float(value)


class ProxyEdge:
    """ASGI middleware around Serve's proxy app (see the module docstring)."""

    def __init__(self, app: Any, read_s: float | None = None):
        self.app = app
        self.read_s = read_s if read_s is not None else client_read_s(dict(os.environ))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = without_proxy_hints(scope)
        if scope.get("method") == "POST":
            scope, receive = await preload_body(scope, receive)
        relay = _Relay(send, self.read_s)
        await self.app(scope, relay.receive_from(receive), relay.send)
        await relay.finish()


def _content_length(scope: dict[str, Any]) -> bytes | None:
    return next((value for name, value in scope.get("headers") or []
                 if name.lower() == b"content-length"), None)


async def preload_body(scope: dict[str, Any], receive: Any, limit: int = PRELOAD_MAX_BYTES,
                       wait_s: float = PRELOAD_WAIT_S) -> tuple[dict[str, Any], Any]:
    """``scope`` with the whole body under ``PRELOADED_BODY`` when it is at most
    ``limit`` bytes and has arrived within ``wait_s``, and a receive that gives the app
    what was read, then the client's own messages. A body declared longer is not read.
    One still arriving after ``wait_s`` goes on without it: the app starts, under its own
    timeouts, and its receive waits until the reading is over (the body's end, ``limit``
    bytes, or the client gone); what is read beyond ``limit`` comes as it arrives."""
    declared = declared_length(_content_length(scope))
    if declared is not None and declared > limit:
        return scope, receive
    reading = asyncio.ensure_future(_read_body(receive, limit))
    try:
        done, _ = await asyncio.wait({reading}, timeout=wait_s)
    except asyncio.CancelledError:  # the request was dropped (a shutdown): so is its read
        reading.cancel()
        raise
    body = reading.result()[1] if done else None
    if body is not None:
        scope = {**scope, PRELOADED_BODY: body}
    return scope, _replaying(reading, receive)


async def _read_body(receive: Any, limit: int) -> tuple[list[dict[str, Any]], bytes | None]:
    """The messages read until the body ended, passed ``limit`` bytes or the client
    left, and the body if it ended within the limit."""
    read: list[dict[str, Any]] = []
    size = 0
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return read, None
        size += len(message.get("body", b""))
        if size > limit:
            return read, None
        if not message.get("more_body", False):
            return read, b"".join(part.get("body", b"") for part in read)


def _replaying(reading: Any, receive: Any) -> Any:
    """A receive that gives what ``reading`` read (waiting for it, if it is still
    reading), then the client's own messages."""
    pending: list[dict[str, Any]] | None = None

    async def replay() -> dict[str, Any]:
        nonlocal pending
        if pending is None:
            pending = list((await reading)[0])
        return pending.pop(0) if pending else await receive()
    return replay


class PreloadedBody:
    """ASGI middleware around the router's app: a request whose body came in the scope
    (``preload_body``, in the proxy or the router replica's own HTTP server) reads it from
    there. After the body the app's receive gives only what follows it (the client's
    disconnect): the proxy still queues the body, and Serve's receive would hand it over a
    second time."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = scope.get(PRELOADED_BODY) if scope["type"] == "http" else None
        if body is None:
            await self.app(scope, receive, send)
            return
        await self.app(scope, _after_body(body, receive), send)


def _after_body(body: bytes, receive: Any) -> Any:
    given = False

    async def receive_after_body() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
    return receive_after_body


class _Relay:
    """Forwards one response's messages, holding back a plain-text error to rewrite it.

    A body chunk the client does not take within ``read_s`` (its connection's buffers
    full: it stopped reading) makes the client gone: the app's receive then says the
    client disconnected, which Serve's proxy answers by cancelling the request, and what
    the app still sends is dropped."""

    def __init__(self, send: Any, read_s: float | None = None):
        self._send = send
        self._read_s = read_s
        self._gone = asyncio.Event()
        self._started = False
        self._complete = False
        self._streaming = False
        self._held_start: dict[str, Any] | None = None
        self._held_text = b""

    def receive_from(self, receive: Any) -> Any:
        """``receive``, or the client's disconnect once it is taken for gone."""
        async def receive_or_gone() -> dict[str, Any]:
            if self._gone.is_set():
                return {"type": "http.disconnect"}
            message = asyncio.ensure_future(receive())
            gone = asyncio.ensure_future(self._gone.wait())
            try:
                await asyncio.wait({message, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not message.done():
                    message.cancel()
            if message.done() and not message.cancelled():
                return message.result()
            return {"type": "http.disconnect"}
        return receive_or_gone

    async def send(self, message: dict[str, Any]) -> None:
        if self._gone.is_set():
            return  # nobody reads it
        if message["type"] == "http.response.start":
            self._started = True
            if is_plain_error(message):
                self._held_start = message
                return
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            self._streaming = content_type.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body":
            self._complete = not message.get("more_body", False)
            if self._held_start is not None:
                self._held_text += message.get("body", b"")
                if self._complete:
                    await self._send_rewritten()
                return
            await self._send_read(message)
            return
        await self._send(message)

    async def _send_read(self, message: dict[str, Any]) -> None:
        """Send a body chunk, within ``read_s`` of the client taking it."""
        if self._read_s is None:
            await self._send(message)
            return
        try:
            async with asyncio.timeout(self._read_s):
                await self._send(message)
        except TimeoutError:
            logger.warning("a client left its answer unread for %.0f s: taken for gone, "
                           "its request ended", self._read_s)
            self._gone.set()

    async def _send_rewritten(self) -> None:
        start, text = self._held_start, self._held_text.decode(errors="replace").strip()
        body = error_body(start["status"], text or f"HTTP {start['status']}")
        await self._send(_json_start(start["status"], body, start.get("headers")))
        await self._send({"type": "http.response.body", "body": body})

    async def finish(self) -> None:
        """After the app returned: answer what it left unanswered or unfinished."""
        if self._gone.is_set():
            return
        if self._held_start is not None and not self._complete:
            await self._send_rewritten()
        elif not self._started:
            body = error_body(503, LOST_REPLICA_MESSAGE)
            await self._send(_json_start(
                503, body, [(b"retry-after", str(LOST_REPLICA_RETRY_AFTER_S).encode())]))
            await self._send({"type": "http.response.body", "body": body})
        elif not self._complete and self._streaming:
            event = b"data: " + error_body(503, CUT_STREAM_MESSAGE) + b"\n\n"
            await self._send({"type": "http.response.body", "body": event})
