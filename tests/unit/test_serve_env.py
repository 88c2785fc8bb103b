"""The node environment `pdserve up` and the cluster files give Serve's processes, and the
options the router's engine handles call with (cluster/serve_env.py, router/transport.py)."""

from __future__ import annotations

import pytest

from cluster.config import parse_config
from cluster.serve_env import GRPC_DATA_PLANE_ENV, HAPROXY_INGRESS_ENV, node_env, proxy_env
from router.transport import GRPC_OPTIONS, engine_handle


def test_the_grpc_data_plane_is_the_default():
    config = parse_config({"model": {"name": "m", "path": "/m"}})
    assert config.router.transport == "grpc"


def test_grpc_sets_serves_data_plane_variables_beside_the_proxy_middleware():
    env = node_env("grpc")
    assert env == {**proxy_env(), **GRPC_DATA_PLANE_ENV}
    assert env["RAY_SERVE_PROXY_USE_GRPC"] == "1"
    assert env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert env["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"


def test_ray_transport_leaves_serves_defaults_alone():
    assert node_env("ray") == proxy_env()


def test_an_unknown_transport_is_refused_by_the_config():
    with pytest.raises(ValueError, match="transport"):
        parse_config({"model": {"name": "m", "path": "/m"}, "router": {"transport": "tcp"}})


class RecordingHandle:
    def __init__(self, **options):
        self.options_given = options

    def options(self, **options):
        return RecordingHandle(**{**self.options_given, **options})


def test_engine_handles_call_over_grpc_with_plain_pickle():
    handle = engine_handle(RecordingHandle(), "grpc")
    assert handle.options_given == {"_by_reference": False, "request_serialization": "pickle",
                                    "response_serialization": "pickle"}
    assert handle.options_given == GRPC_OPTIONS


def test_engine_handles_over_ray_keep_their_options():
    assert engine_handle(RecordingHandle(), "ray").options_given == {}


def test_serves_python_proxy_is_the_default_ingress():
    config = parse_config({"model": {"name": "m", "path": "/m"}})
    assert config.router.ingress == "proxy"
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in node_env("grpc")


def test_haproxy_ingress_turns_on_rays_direct_ingress_beside_the_data_plane():
    env = node_env("grpc", "haproxy")
    assert env == {**proxy_env(), **GRPC_DATA_PLANE_ENV, **HAPROXY_INGRESS_ENV,
                   "RAY_SERVE_HAPROXY_STATS_PORT": "8404",      # Ray's own defaults
                   "RAY_SERVE_HAPROXY_METRICS_PORT": "9101",
                   "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "30.0"}
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"


def test_haproxy_starts_through_pdserves_command_where_the_node_has_it():
    """Ray starts the binary RAY_SERVE_HAPROXY_BINARY_PATH names: pdserve-haproxy, which
    puts pdserve's error page in place of Ray's (router/haproxy_edge.py)."""
    command = "/venv/bin/pdserve-haproxy"
    env = node_env("grpc", "haproxy", haproxy_command=command)
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == command
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in node_env("grpc", "haproxy")
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in node_env("grpc", "proxy",
                                                           haproxy_command=command)


def test_an_operators_haproxy_is_started_behind_pdserves_command():
    """An operator who had pointed Ray's variable at a binary of their own keeps it: Ray
    starts pdserve-haproxy, which starts theirs (PDSERVE_HAPROXY_BINARY)."""
    command, operators = "/venv/bin/pdserve-haproxy", "/opt/haproxy-3.0/bin/haproxy"
    env = node_env("grpc", "haproxy", haproxy_command=command, operators_haproxy=operators)
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == command
    assert env["PDSERVE_HAPROXY_BINARY"] == operators
    # pdserve's own command set by an earlier start is not an operator's choice
    again = node_env("grpc", "haproxy", haproxy_command=command, operators_haproxy=command)
    assert "PDSERVE_HAPROXY_BINARY" not in again
    assert "PDSERVE_HAPROXY_BINARY" not in node_env("grpc", "haproxy",
                                                    operators_haproxy=operators)


def test_a_clusters_haproxy_ports_are_its_own():
    """Ray keeps HAProxy's files apart per node, not its stats and metrics listeners: a
    second cluster on the host sets its own (router.haproxy)."""
    config = parse_config({"model": {"name": "m", "path": "/m"}, "router": {
        "ingress": "haproxy", "haproxy": {"stats_port": 8544, "metrics_port": 8545}}})
    env = node_env("grpc", config.router.ingress, config.router.haproxy)
    assert env["RAY_SERVE_HAPROXY_STATS_PORT"] == "8544"
    assert env["RAY_SERVE_HAPROXY_METRICS_PORT"] == "8545"
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "30.0"  # Ray's default
    assert "RAY_SERVE_HAPROXY_STATS_PORT" not in node_env("grpc", "proxy", config.router.haproxy)


def test_a_leaving_router_replicas_drain_is_the_clusters_choice():
    """Serve's controller keeps a leaving direct-ingress replica at least
    RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S; router.haproxy.min_drain_s sets it."""
    config = parse_config({"model": {"name": "m", "path": "/m"}, "router": {
        "ingress": "haproxy", "haproxy": {"min_drain_s": 2.5}}})
    env = node_env("grpc", config.router.ingress, config.router.haproxy)
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2.5"
    assert "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S" not in node_env(
        "grpc", "proxy", config.router.haproxy)
    with pytest.raises(ValueError, match="min_drain_s"):
        parse_config({"model": {"name": "m", "path": "/m"},
                      "router": {"haproxy": {"min_drain_s": -1}}})


def test_an_unknown_ingress_is_refused_by_the_config():
    with pytest.raises(ValueError, match="ingress"):
        parse_config({"model": {"name": "m", "path": "/m"}, "router": {"ingress": "nginx"}})


def test_a_haproxy_port_that_clashes_with_another_listener_is_refused():
    base = {"model": {"name": "m", "path": "/m"}}
    for router, ray, clash in (
            ({"ingress": "haproxy", "haproxy": {"stats_port": 8000}}, {}, "router.port"),
            ({"ingress": "haproxy", "haproxy": {"metrics_port": 8404}}, {},
             "router.haproxy.stats_port"),
            ({"ingress": "haproxy"}, {"metrics_export_port": 9101},
             "ray.metrics_export_port")):
        with pytest.raises(ValueError, match=clash):
            parse_config({**base, "router": router, "ray": ray})
    # with Serve's proxy, HAProxy's ports are not listened on: no clash
    parse_config({**base, "router": {"haproxy": {"stats_port": 8000}}})
