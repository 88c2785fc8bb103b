"""A Ray Serve config file for a pdserve config (shell): the declarative deploy path.

``pdserve up`` / ``pdserve deploy`` use ``serve.run``, which in Ray Serve 2.60 cannot carry
an application-level autoscaling policy. ``serve deploy`` of a Serve config file can:
``pdserve serve-config --config X > serve.yaml`` writes one whose application builds the
same app (``cluster.app:app_builder``) and, when ``autoscaling.couple_pools`` is on, sizes
both pools together with ``AppAutoscalingPolicy``. The config's digest is an argument of
the application, because Serve rebuilds an application only when its arguments change:
an edited file at the same path would otherwise not be rolled out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster.autoscaling.serve_policy import app_autoscaling_policy
from cluster.config import PDServeConfig
from cluster.digest import short_digest

APP_NAME = "pdserve"  # the Serve application, whichever way it is deployed
APP_IMPORT_PATH = "cluster.app:app_builder"


# Serve's proxy gives up this long after the router's own request deadline: the router
# answers first (OpenAI-shaped); the proxy's timeout only bounds a request still waiting
# in front of a router replica.
PROXY_TIMEOUT_MARGIN_S = 5.0


def http_options(config: PDServeConfig) -> dict[str, Any]:
    """Serve's HTTP options: where the proxy listens and, with a whole-request deadline
    (``router.deadlines.request_s``), its request timeout."""
    options: dict[str, Any] = {"host": config.router.host, "port": config.router.port}
    request_s = config.router.deadlines.request_s
    if request_s is not None:
        options["request_timeout_s"] = request_s + PROXY_TIMEOUT_MARGIN_S
    return options


def serve_config(config: PDServeConfig, config_path: Path) -> dict[str, Any]:
    """The ``ServeDeploySchema`` document that serves ``config`` (read from ``config_path``
    on the cluster: use a path every node can read)."""
    application: dict[str, Any] = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": APP_IMPORT_PATH,
        "args": {"config": str(config_path),
                 "config_digest": short_digest(config_path.read_bytes())},
    }
    scaling = config.autoscaling
    if scaling is not None and scaling.enabled and scaling.couple_pools:
        pools = {f"{role}-{version}": role
                 for version in config.versions for role in ("prefill", "decode")}
        application["autoscaling_policy"] = app_autoscaling_policy(scaling, config.slo, pools)
    return {
        "proxy_location": "EveryNode",
        "http_options": http_options(config),
        "applications": [application],
    }
