"""What `build_app` asks of Ray Serve for the router deployment (no cluster started)."""

from __future__ import annotations

from cluster.app import build_app
from cluster.config import parse_config


def test_the_router_is_bounded_in_front_as_well_as_inside():
    config = parse_config({"model": {"name": "m", "path": "/models/m"},
                           "router": {"max_ongoing_requests": 64, "max_queued_requests": 77,
                                      "drain_timeout_s": 12}})
    router = build_app(config)._bound_deployment
    options = router._deployment_config
    assert router.name == "router"
    assert (options.max_ongoing_requests, options.max_queued_requests) == (64, 77)
    assert options.graceful_shutdown_timeout_s == 12
