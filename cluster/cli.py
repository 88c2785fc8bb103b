"""The ``pdserve`` command line.

``up`` (start or join a Ray cluster and serve until Ctrl-C / SIGTERM), ``deploy`` (roll a
changed config out to the running cluster), ``model`` (generate the config's tiny models),
``config`` (validate and print a config; ``--describe``: every key, docs/config.md),
``serve-config`` (a Ray Serve config file for ``serve deploy``, with the application-level
autoscaling policy) and ``dashboard`` (the Grafana dashboard). ``bench`` and ``plan`` are the
tools wing's, loaded from the ``pdserve.commands`` entry points so the runtime never imports
them (docs/design.md, "Two wings: runtime and tools").
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from cluster.config import DEFAULT_CONFIG_PATH, ConfigError, PDServeConfig, load_config
from cluster.local_node import SERVING_BANNER, port_is_free, run_on_serving_cores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in [
        ("up", "serve the application until interrupted"),
        ("deploy", "roll a changed config out to the running cluster"),
        ("model", "generate the local tiny models if missing"),
        ("config", "validate a config and print it with defaults"),
        ("serve-config", "print a Serve config file for `serve deploy`"),
        ("dashboard", "print the Grafana dashboard JSON (SLO lines from the config)"),
    ]:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH)
        if name == "config":
            sub.add_argument("--describe", action="store_true",
                             help="print the reference of every config key (Markdown, "
                             "docs/config.md) instead of a config")
    tools = _tool_commands()
    for tool in tools.values():
        tool.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command in tools:
        return tools[args.command].main(args)
    if args.command == "config" and args.describe:
        return _describe()
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"pdserve: {error}", file=sys.stderr)
        return 2
    if args.command == "serve-config":
        return _serve_config(config, args.config)
    commands = {"up": _up, "deploy": _deploy, "model": _model, "config": _show_config,
                "dashboard": _dashboard}
    return commands[args.command](config)


TOOL_COMMANDS = "pdserve.commands"


def _tool_commands() -> dict[str, ModuleType]:
    """The installed tools' commands by name: each entry point names a module with
    ``add_parser(subparsers)`` and ``main(args) -> int``, and imports no more than its
    parser until ``main`` runs."""
    return {point.name: point.load() for point in entry_points(group=TOOL_COMMANDS)}


def _show_config(config: PDServeConfig) -> int:
    import yaml

    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return 0


def _describe() -> int:
    from cluster.config.reference import describe

    sys.stdout.write(describe())
    return 0


def _dashboard(config: PDServeConfig) -> int:
    from cluster.dashboard import dashboard_json

    sys.stdout.write(dashboard_json(config.slo))
    return 0


def _serve_config(config: PDServeConfig, path: Path) -> int:
    import yaml

    from cluster.serve_config import serve_config

    print(yaml.safe_dump(serve_config(config, path.absolute()), sort_keys=False))
    return 0


def _model(config: PDServeConfig) -> int:
    from cluster.checkpoints import ensure_checkpoints

    try:
        paths = ensure_checkpoints(config)
    except FileNotFoundError as error:
        print(f"pdserve: {error}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"model of version {name} ready at {path}")
    return 0


def _deploy(config: PDServeConfig) -> int:
    """Apply ``config`` to the cluster that `pdserve up` (or `ray up`) runs.

    Deployments whose own settings did not change keep their replicas (engines are not
    restarted, cluster.engine.args.stable_version); changed ones are replaced replica by replica,
    and a replaced replica finishes its in-flight requests first.
    """
    if _model(config) != 0:
        return 2
    import ray
    from ray import serve

    from cluster.app import build_app
    from cluster.serve_config import APP_NAME

    ray.init(address=config.ray.address or "auto", logging_level="warning")
    print(f"pdserve: deploying to the cluster at {ray.get_runtime_context().gcs_address}",
          flush=True)
    try:
        serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=False)
    except RuntimeError as error:
        print(f"pdserve: the new config failed to deploy: {error}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    print("pdserve: deployed", flush=True)
    return 0


def _keys_present(config: PDServeConfig) -> int:
    """A local cluster's workers inherit this environment: refuse a key variable the
    config names that holds no key now, rather than when the router starts."""
    from router.auth import AuthMisconfigured, configured_keys

    try:
        configured_keys(config.router.auth, os.environ)
    except AuthMisconfigured as error:
        print(f"pdserve: {error}", file=sys.stderr)
        return 2
    return 0


def _up(config: PDServeConfig) -> int:
    local = config.ray.address is None
    if (local and _keys_present(config) != 0) or _model(config) != 0:
        return 2
    if local and not port_is_free(config.router.host, config.router.port):
        print(f"pdserve: port {config.router.port} on {config.router.host} is in use",
              file=sys.stderr)
        return 2
    if local and run_on_serving_cores(config) != 0:
        return 2
    if local and _engines_run_here(config) != 0:
        return 2

    import ray
    from ray import serve

    from cluster.app import build_app
    from cluster.serve_config import APP_NAME, http_options

    serving, stop = threading.Event(), threading.Event()

    def on_signal(*_) -> None:
        # While deployments start, serve.run blocks: interrupt it; once serving, wake up.
        if not serving.is_set():
            raise KeyboardInterrupt
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)

    _start_ray(config)
    try:
        serve.start(http_options=http_options(config))
        serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=False)
        serving.set()
        _print_banner(config)
        stop.wait()
        print("pdserve: shutting down", flush=True)
    except KeyboardInterrupt:
        print("pdserve: interrupted while starting; shutting down", flush=True)
        return 130
    except RuntimeError as error:  # a deployment failed to start
        print(f"pdserve: the application failed to start: {error}", file=sys.stderr)
        return 1
    finally:
        if local:
            serve.shutdown()
            ray.shutdown()
        else:
            serve.delete(APP_NAME)
    return 0


def _engines_run_here(config: PDServeConfig) -> int:
    """A local cluster's engines run on this machine: refuse settings its CPU cannot run
    now, rather than when each engine replica fails to start."""
    from cluster.engine.cpu_check import local_cluster_refusals

    refusals = local_cluster_refusals(config)
    for reason in refusals:
        print(f"pdserve: {reason}", file=sys.stderr)
    return 2 if refusals else 0


def _start_ray(config: PDServeConfig) -> None:
    import ray

    if config.ray.address is not None:
        ray.init(address=config.ray.address)
        return
    # What Serve's processes read at their start (the proxy's middleware that makes its
    # own answers OpenAI errors, the gRPC data plane): a local cluster's processes inherit
    # it from here (ray_configs' cluster files export it before `ray start`).
    from cluster.serve_env import HAPROXY_BINARY_ENV, node_env

    os.environ.update(node_env(config.router.transport, config.router.ingress,
                               config.router.haproxy, _haproxy_command(config),
                               os.environ.get(HAPROXY_BINARY_ENV),
                               config.router.deadlines.client_read_s))
    ray.init(
        num_cpus=config.ray.num_cpus,
        include_dashboard=False,
        _node_ip_address=config.ray.node_ip_address,
        _metrics_export_port=config.ray.metrics_export_port,
    )


def _haproxy_command(config: PDServeConfig) -> str | None:
    """``pdserve-haproxy`` beside this interpreter, for a cluster behind HAProxy; None
    (with a warning: HAProxy then answers with Ray's plain-text page) where pdserve was
    not installed with its commands."""
    if config.router.ingress != "haproxy":
        return None
    from cluster.serve_env import HAPROXY_COMMAND

    command = Path(sys.executable).with_name(HAPROXY_COMMAND)
    if command.is_file() and os.access(command, os.X_OK):
        return str(command)
    print(f"pdserve: {command} is missing or not executable (pdserve not installed as a "
          "package?): HAProxy will answer a lost router replica with Ray's plain-text 500",
          file=sys.stderr)
    return None


def _metrics_url(config: PDServeConfig) -> str:
    port = config.ray.metrics_export_port
    if config.ray.address is not None or port is None:
        return "each Ray node's metrics export port, /metrics"
    return f"http://{config.ray.node_ip_address or config.router.host}:{port}/metrics"


def _print_banner(config: PDServeConfig) -> None:
    base = f"http://{config.router.host}:{config.router.port}/v1"
    print(
        f"""
{SERVING_BANNER} '{config.model.name}' at {base}

  curl -N {base}/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{config.model.name}", "stream": true, "max_tokens": 32,
         "messages": [{{"role": "user", "content": "Hello!"}}]}}'

Prometheus metrics: {_metrics_url(config)}
Press Ctrl-C to stop.
""",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
