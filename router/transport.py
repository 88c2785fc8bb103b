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

from typing import Any

GRPC_OPTIONS = {"_by_reference": False, "request_serialization": "pickle",
                "response_serialization": "pickle"}


def engine_handle(handle: Any, transport: str) -> Any:
    """``handle`` (an engine pool's Serve handle) calling over ``transport``."""
    if transport == "grpc":
        return handle.options(**GRPC_OPTIONS)
    return handle
