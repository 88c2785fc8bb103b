"""Each of the router's calls to an engine pool gets a Serve request id of its own
(router/transport.py): inside a replica's request Serve would give them all the id of
the request being served, and its request router indexes waiting calls by that id, so
two calls of one request to one pool at once could leave one of them, and its routing
task, waiting for good."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from ray.serve import context

from router.transport import engine_handle


class IdRecordingHandle:
    """A Serve handle as the router uses it: ``options``, a method attribute, ``remote``,
    each call noting the request id Serve would give it (what ``get_request_metadata``
    reads)."""

    def __init__(self, seen: list[str]):
        self.seen = seen
        self.deployment_name = "decode-v1"

    def options(self, **_: object) -> IdRecordingHandle:
        return self

    def __getattr__(self, name: str) -> IdRecordingHandle:
        return self

    def remote(self, *args: object) -> str:
        self.seen.append(context._get_serve_request_context()._internal_request_id)
        return "response"


def test_calls_inside_a_request_do_not_inherit_its_id_and_the_request_keeps_it():
    seen: list[str] = []
    handle = engine_handle(IdRecordingHandle(seen), "grpc")
    token = context._serve_request_context.set(
        context._RequestContext(request_id="client-id", _internal_request_id="served"))
    try:
        assert handle.options(stream=True).generate.remote("request") == "response"
        assert handle.release_handle.remote("request", "handle") == "response"
        assert context._get_serve_request_context()._internal_request_id == "served"
        assert context._get_serve_request_context().request_id == "client-id"
    finally:
        context._serve_request_context.reset(token)
    assert seen == ["", ""]  # empty: Serve generates a fresh id for each
    assert handle.deployment_name == "decode-v1"  # plain attributes pass through
