"""What Serve's proxy answers by itself reaches clients as OpenAI errors, and a request's
body travels to the router inside its scope (router/proxy_edge.py), driven with stand-in
ASGI apps for the proxy and the router."""

from __future__ import annotations

import asyncio
import json

from cluster.serve_env import PROXY_CALLBACK, PROXY_CALLBACK_ENV, proxy_env
from router.proxy_edge import (
    PRELOAD_MAX_BYTES,
    PRELOADED_BODY,
    PreloadedBody,
    ProxyEdge,
    preload_body,
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


# -- a request's body sent ahead in the scope ------------------------------------------------

DISCONNECT = {"type": "http.disconnect"}


def request(data: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": data, "more_body": more}


def client(*messages):
    """A client's receive that gives ``messages``, then its disconnect for ever; the
    messages it gave are counted in ``given``."""
    pending = list(messages)

    async def receive():
        receive.given += 1
        return pending.pop(0) if pending else DISCONNECT
    receive.given = 0
    return receive


def through_the_proxy(scope: dict, receive, reads: int) -> tuple[dict, list[dict]]:
    """The scope and the first ``reads`` messages a stand-in for Serve's proxy app gets
    from ``ProxyEdge``."""
    seen: dict = {}

    async def proxy_app(scope, receive, send):
        seen["scope"] = scope
        seen["messages"] = [await receive() for _ in range(reads)]
        await send(start(200, b"application/json"))
        await send(body(b"{}"))

    async def send(message):
        pass

    asyncio.run(ProxyEdge(proxy_app)(scope, receive, send))
    return seen["scope"], seen["messages"]


def post(*headers) -> dict:
    return {"type": "http", "method": "POST", "headers": list(headers)}


def test_a_posts_body_travels_in_the_scope_and_the_proxy_still_reads_it_all():
    sent = [request(b'{"model": ', more=True), request(b'"m"}')]
    scope, messages = through_the_proxy(post(), client(*sent), reads=3)
    assert scope[PRELOADED_BODY] == b'{"model": "m"}'
    # Serve's proxy queues what it reads for the replica: the same messages, in order.
    assert messages == [*sent, DISCONNECT]


def test_a_body_declared_longer_than_the_limit_is_not_read_ahead():
    receive = client(request(b"x"))
    declared = (b"content-length", str(PRELOAD_MAX_BYTES + 1).encode())

    async def proxy_app(scope, receive_, send):
        assert receive.given == 0, "the body was read before the proxy got the request"
        assert PRELOADED_BODY not in scope
        await send(start(200, b"application/json"))
        await send(body(b"{}"))

    async def send(message):
        pass

    asyncio.run(ProxyEdge(proxy_app)(post(declared), receive, send))


def test_a_body_found_longer_than_the_limit_is_passed_on_as_it_came():
    sent = [request(b"abc", more=True), request(b"def", more=True), request(b"g")]
    scope, replay = asyncio.run(preload_body(post(), client(*sent), limit=4))
    assert PRELOADED_BODY not in scope
    assert asyncio.run(_read(replay, 4)) == [*sent, DISCONNECT]


def test_a_client_that_leaves_mid_body_sends_no_body_ahead():
    sent = [request(b"abc", more=True), DISCONNECT]
    scope, replay = asyncio.run(preload_body(post(), client(*sent)))
    assert PRELOADED_BODY not in scope
    assert asyncio.run(_read(replay, 2)) == sent


def test_only_a_post_is_read_ahead():
    scope, messages = through_the_proxy({"type": "http", "method": "GET", "headers": []},
                                        client(request(b"")), reads=1)
    assert PRELOADED_BODY not in scope and messages == [request(b"")]


def test_the_router_takes_the_body_from_the_scope_then_only_the_disconnect():
    # Behind it, Serve's receive hands the proxy's queued body over once more.
    behind = client(request(b"queued copy", more=True), request(b""))
    got: list[dict] = []

    async def router_app(scope, receive, send):
        got.extend([await receive(), await receive()])

    scope = {**post(), PRELOADED_BODY: b'{"model": "m"}'}
    asyncio.run(PreloadedBody(router_app)(scope, behind, None))
    assert got == [request(b'{"model": "m"}'), DISCONNECT]


def test_the_router_reads_a_body_not_sent_ahead_as_before():
    sent = [request(b"abc", more=True), request(b"def")]
    got: list[dict] = []

    async def router_app(scope, receive, send):
        got.extend([await receive(), await receive()])

    asyncio.run(PreloadedBody(router_app)(post(), client(*sent), None))
    assert got == sent


async def _read(receive, count: int) -> list[dict]:
    return [await receive() for _ in range(count)]


def test_a_slow_upload_is_passed_on_without_waiting_for_its_body():
    # The client sent its headers and the first part of its body, the rest later: the
    # request goes on after the wait, and the app still reads every part, in order.
    more = asyncio.Event()

    async def slow_client():
        slow_client.calls += 1
        if slow_client.calls == 1:
            return request(b"abc", more=True)
        if slow_client.calls == 2:
            await more.wait()
            return request(b"def")
        return DISCONNECT
    slow_client.calls = 0

    async def scenario():
        # Returns while the body's second part has not been sent (``more`` is unset).
        scope, replay = await preload_body(post(), slow_client, wait_s=0.01)
        assert PRELOADED_BODY not in scope
        more.set()
        return [await replay(), await replay(), await replay()]

    assert asyncio.run(scenario()) == [request(b"abc", more=True), request(b"def"), DISCONNECT]


def test_a_client_that_stops_reading_is_taken_for_gone_and_its_request_ended():
    """A chunk the client does not take within read_s: the proxy's app hears the client
    disconnect (Serve's proxy then cancels the request) and what it sends after is
    dropped; nothing is added at the end (no one would read it)."""
    taken: list[dict] = []
    heard: list[dict] = []

    async def send(message):
        if message["type"] == "http.response.body" and len(taken) > 1:
            await asyncio.Event().wait()   # the client's buffers are full: never returns
        taken.append(message)

    async def receive():
        await asyncio.Event().wait()       # a client that stays connected
        return {}

    async def proxy(scope, receive, send):  # Serve's proxy: a stream, and its watcher
        watcher = asyncio.ensure_future(receive())
        await send(start(200, b"text/event-stream"))
        for index in range(3):
            await send(body(b"data: %d\n\n" % index, more=True))
        heard.append(await asyncio.wait_for(watcher, 5))

    edge = ProxyEdge(proxy, read_s=0.05)
    asyncio.run(asyncio.wait_for(edge({"type": "http", "method": "GET", "headers": []},
                                      receive, send), 10))
    assert heard == [{"type": "http.disconnect"}]
    assert [m["type"] for m in taken] == ["http.response.start", "http.response.body"]


def test_a_reading_client_meets_no_deadline_and_the_setting_comes_from_the_environment():
    from router.proxy_edge import CLIENT_READ_S, client_read_s

    sent = run(answering(start(200, b"text/event-stream"), body(b"data: 1\n\n", more=True),
                         body(b"")))
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b""]
    assert client_read_s({}) == CLIENT_READ_S
    assert client_read_s({"PDSERVE_CLIENT_READ_S": "12.5"}) == 12.5
    assert client_read_s({"PDSERVE_CLIENT_READ_S": "none"}) is None
