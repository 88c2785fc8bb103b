"""What Serve's proxy answers by itself reaches clients as OpenAI errors
(router/proxy_edge.py), driven with stand-in ASGI apps for the proxy."""

from __future__ import annotations

import asyncio
import json

from router.proxy_edge import (
    PROXY_CALLBACK,
    PROXY_CALLBACK_ENV,
    ProxyEdge,
    proxy_env,
    without_proxy_hints,
)


def run(app, scope_type: str = "http") -> list[dict]:
    """The messages the middleware sent for one request to ``app``."""
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(ProxyEdge(app)({"type": scope_type}, receive, send))
    return sent


def answering(*messages):
    async def app(scope, receive, send):
        for message in messages:
            await send(message)
    return app


def start(status: int, content_type: bytes | None, *extra) -> dict:
    headers = [(b"content-type", content_type)] if content_type else []
    return {"type": "http.response.start", "status": status, "headers": [*headers, *extra]}


def body(data: bytes, more: bool = False) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


def headers_of(message: dict) -> dict[bytes, bytes]:
    return dict(message["headers"])


def test_the_proxys_plain_text_503_becomes_an_openai_error_keeping_retry_after():
    sent = run(answering(start(503, b"text/plain; charset=utf-8", (b"retry-after", b"2")),
                         body(b"Request dropped due to backpressure ", more=True),
                         body(b"(num_queued_requests=8, max_queued_requests=8).")))
    first, last = sent
    assert first["status"] == 503
    assert headers_of(first)[b"retry-after"] == b"2"
    assert headers_of(first)[b"content-type"] == b"application/json"
    assert int(headers_of(first)[b"content-length"]) == len(last["body"])
    error = json.loads(last["body"])["error"]
    assert error["type"] == "service_unavailable"
    assert error["message"] == ("Request dropped due to backpressure "
                                "(num_queued_requests=8, max_queued_requests=8).")
    assert set(error) == {"message", "type", "param", "code"}


def test_the_proxys_timeout_is_an_openai_408():
    sent = run(answering(start(408, b"text/plain"), body(b"Request abc timed out after 5s.")))
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["type"] == "timeout"


def test_no_answer_at_all_is_a_retryable_503():
    sent = run(answering())  # the router replica died before it answered
    assert sent[0]["status"] == 503 and headers_of(sent[0])[b"retry-after"] == b"1"
    assert json.loads(sent[1]["body"])["error"]["code"] == "service_unavailable"


def test_a_stream_cut_short_ends_with_an_error_event_not_silence():
    sent = run(answering(start(200, b"text/event-stream"), body(b"data: {}\n\n", more=True)))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body",
                                         "http.response.body"]
    last = sent[-1]
    assert last["body"].startswith(b"data: {") and last["body"].endswith(b"\n\n")
    assert "error" in json.loads(last["body"][len(b"data: "):])
    assert not last.get("more_body")  # the response is complete, without [DONE]


def test_the_routers_own_answers_pass_unchanged():
    for messages in (
        [start(429, b"application/json", (b"retry-after", b"3")), body(b'{"error": {}}')],
        [start(200, b"text/event-stream"), body(b"data: [DONE]\n\n")],
        [start(200, b"application/json"), body(b"{}")],
    ):
        assert run(answering(*messages)) == messages


def test_other_protocols_are_not_touched():
    assert run(answering(), scope_type="websocket") == []
    assert run(answering(), scope_type="lifespan") == []


def test_the_environment_names_the_callback_serve_imports():
    assert proxy_env() == {PROXY_CALLBACK_ENV: PROXY_CALLBACK}
    module, name = PROXY_CALLBACK.split(":")
    middlewares = getattr(__import__(module, fromlist=[name]), name)()
    assert [m.cls for m in middlewares] == [ProxyEdge]


def test_a_client_cannot_lift_the_proxys_timeout_or_disconnect_handling():
    seen = {}

    async def app(scope, receive, send):
        seen["headers"] = scope["headers"]
        await send(start(200, b"application/json"))
        await send(body(b"{}"))

    headers = [(b"x-request-timeout-seconds", b"0"), (b"authorization", b"Bearer k"),
               (b"X-Request-Disconnect-Disabled", b"?1")]
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    asyncio.run(ProxyEdge(app)({"type": "http", "headers": headers}, receive, send))
    assert seen["headers"] == [(b"authorization", b"Bearer k")]
    plain = {"type": "http", "headers": [(b"authorization", b"Bearer k")]}
    assert without_proxy_hints(plain) is plain
