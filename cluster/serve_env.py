"""The environment a Ray node's processes start with for pdserve's Serve settings (pure).

Serve reads these variables once, when a process imports it, so they must be in the
environment of every process of the node from its start: `pdserve up` sets them before it
starts a local cluster, and `ray up`'s cluster files export them before `ray start`
(tests/component/test_cluster_files.py keeps the files in step with ``node_env``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.config import HAProxyConfig

# The environment variable through which Serve's proxies load middlewares, and ours
# (router/proxy_edge.py: Serve's own answers made OpenAI errors).
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "router.proxy_edge:proxy_middlewares"


# The proxy middleware's deadline on a client's reading, in seconds (router/proxy_edge.py).
CLIENT_READ_ENV = "PDSERVE_CLIENT_READ_S"


def proxy_env() -> dict[str, str]:
    """The environment a Ray node's processes need for Serve's proxy to load the
    middleware (set before the node starts: the proxy reads it once, at import)."""
    return {PROXY_CALLBACK_ENV: PROXY_CALLBACK}


# Serve's gRPC data plane (router.transport "grpc"; the variables of Ray 2.60's
# RAY_SERVE_THROUGHPUT_OPTIMIZED that pdserve wants, without its direct ingress):
GRPC_DATA_PLANE_ENV = {
    # Serve's proxy calls the router replicas over gRPC, not as Ray actor calls: a
    # streamed chunk is one message on an open stream instead of a Ray object reported
    # to and fetched by the proxy. (The router's own calls to the engine replicas choose
    # their transport per handle: router/transport.py.)
    "RAY_SERVE_PROXY_USE_GRPC": "1",
    # Replica code runs on the replica's main event loop and a handle's routing on its
    # caller's loop: no hand-off between two threads' loops for every request and chunk.
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    # Serve's per-request access log lines are written a thousand at a time (errors at once).
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
}


# HAProxy in front of the router replicas' own HTTP servers (router.ingress "haproxy"):
# Ray 2.60's direct ingress, with HAProxy as the node's balancer instead of Serve's Python
# proxy, so a request and each of its streamed chunks cross one Python process fewer.
HAPROXY_INGRESS_ENV = {
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
}
# The binary Ray starts as HAProxy: pdserve's command (router/haproxy_edge.py), which
# starts the one named by HAPROXY_REAL_BINARY_ENV where an operator chose one, else the
# HAProxy bundled with ray[serve].
HAPROXY_BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
HAPROXY_REAL_BINARY_ENV = "PDSERVE_HAPROXY_BINARY"
HAPROXY_COMMAND = "pdserve-haproxy"
# The least time a leaving router replica keeps serving under direct ingress (Serve's
# controller reads it: router.haproxy.min_drain_s).
DIRECT_INGRESS_DRAIN_ENV = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"


def node_env(transport: str, ingress: str = "proxy",
             haproxy: HAProxyConfig | None = None,
             haproxy_command: str | None = None,
             operators_haproxy: str | None = None,
             client_read_s: float | None = None) -> dict[str, str]:
    """The variables a node's processes need: the proxy's middleware always, those of
    Serve's gRPC data plane when ``transport`` (``router.transport``) is "grpc", and
    HAProxy's direct ingress when ``ingress`` (``router.ingress``) is "haproxy", with
    HAProxy's own ports and a leaving router replica's drain (``router.haproxy``;
    Ray's defaults when None) and, given its
    path on the node, ``pdserve-haproxy`` as the binary Ray starts (HAProxy behind
    pdserve's error page: router/haproxy_edge.py), which then starts
    ``operators_haproxy`` (what the operator had set Ray's variable to) if given.
    ``client_read_s`` (``router.deadlines.client_read_s``) is the proxy middleware's
    deadline on a client's reading; None leaves the middleware's default."""
    env = proxy_env()
    if client_read_s is not None:
        env[CLIENT_READ_ENV] = str(client_read_s)
    if transport == "grpc":
        env.update(GRPC_DATA_PLANE_ENV)
    if ingress == "haproxy":
        env.update(HAPROXY_INGRESS_ENV)
        # Imported here: pdserve-haproxy reads this module's names at every HAProxy start
        # and reload, and the config's models would triple its start-up.
        from cluster.config import HAProxyConfig

        settings = haproxy or HAProxyConfig()
        env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(settings.stats_port)
        env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(settings.metrics_port)
        env[DIRECT_INGRESS_DRAIN_ENV] = str(settings.min_drain_s)
        if haproxy_command is not None:
            env[HAPROXY_BINARY_ENV] = haproxy_command
            if operators_haproxy and operators_haproxy != haproxy_command:
                env[HAPROXY_REAL_BINARY_ENV] = operators_haproxy
    return env
