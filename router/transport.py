"""How the router's calls reach the engine replicas: Serve's gRPC data plane or Ray
actor calls (shell: applies ``router.transport`` to Serve handles).

Over gRPC a call is one request on a gRPC channel from the router's process straight to
the replica's, and each streamed output one message on it; as a Ray actor call each output
is an object the replica reports to the router's worker, which then fetches it. Measured
on this project's two-core machine (docs/benchmarks.md, "Serve's data plane"), gRPC halves
the router's and the proxy's CPU per streamed token. The payloads are pdserve's and
vLLM's own classes (``EngineRequest``, vLLM's ``RequestOutput``), importable on both
sides, so they are pickled rather than cloudpickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

GRPC_OPTIONS = {"_by_reference": False, "request_serialization": "pickle",
                "response_serialization": "pickle"}


def engine_handle(handle: Any, transport: str) -> Any:
    """``handle`` (an engine pool's Serve handle) calling over ``transport``, each call
    under an id of its own (``OwnCallIds``)."""
    if transport == "grpc":
        handle = handle.options(**GRPC_OPTIONS)
    return OwnCallIds(handle)


@contextlib.contextmanager
def own_call_id() -> Iterator[None]:
    """Handle calls made inside this block get a Serve request id of their own.

    Inside a replica's request, Serve gives every handle call the id of the request being
    served (so that cancelling it cancels them), and its request router indexes the calls
    waiting for a replica by that id: two calls of one request to one pool at once (a KV
    handle's release beside the retry's decode call) then share one index entry. The
    waiting call whose entry the other one took is never handed a replica, and its routing
    task retries it for good; once every routing task is caught so, nothing reaches the
    pool again (seen: every decode call of a two-replica cluster hung from an engine's
    death on, while both replicas were healthy). The router cancels each of its calls
    itself when it stops waiting (router/flow.py), so Serve's propagation is not needed.
    """
    from ray.serve import context

    current = context._serve_request_context.get()
    if current is None or not current._internal_request_id:
        yield
        return
    token = context._serve_request_context.set(
        dataclasses.replace(current, _internal_request_id=""))
    try:
        yield
    finally:
        context._serve_request_context.reset(token)


class OwnCallIds:
    """A Serve handle whose calls (``handle.method.remote(...)``) each get a request id
    of their own (``own_call_id``); ``options`` keeps the wrapping."""

    def __init__(self, handle: Any):
        self._handle = handle

    def options(self, **kwargs: Any) -> OwnCallIds:
        return OwnCallIds(self._handle.options(**kwargs))

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        with own_call_id():
            return self._handle.remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._handle, name)
        # Serve's handle answers a method name with a handle calling that method.
        return OwnCallIds(attribute) if hasattr(attribute, "remote") else attribute
