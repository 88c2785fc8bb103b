"""Ray Serve LLM's own prefill/decode disaggregated app, for `pdserve bench` comparisons.

Serves the tiny model of ray_configs/local.yaml with Ray Serve LLM's PD application
(`ray.serve.llm.build_pd_openai_app`: OpenAI ingress -> PDDecodeServer, which prefills on
PDPrefillServer and then decodes on its own engine) instead of pdserve. Both engines run
exactly the engine settings of pdserve's pools on this machine's cores: vLLM's CPU backend,
NixlConnector over UCX/TCP with CPU buffers, the prefill engine on core 0 and the decode
engine on core 1, 1 GiB of KV cache each. No GPU is asked for anywhere.

    .venv/bin/python scripts/serve_llm_pd.py [--stream-batching-ms 0]

then, from another shell: `pdserve bench run --base-url http://127.0.0.1:8600`.
Prints "serving" once the application is up; Ctrl-C (or SIGTERM) shuts it down.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.llm import LLMConfig, build_pd_openai_app

REPO = Path(__file__).resolve().parents[1]
MODEL_ID = "tiny-llama"  # the served model name (requests' `model` field)
MODEL_PATH = REPO / ".cache/models/tiny-llama-s0"
HOST = "127.0.0.1"
HTTP_PORT = 8600
APP_NAME = "serve-llm-pd"

# pdserve's engine arguments for this model (ray_configs/local.yaml, cluster/engine/args.py).
ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 8192,
    "block_size": 32,
    "enforce_eager": True,
    "enable_prefix_caching": True,
    "max_num_seqs": 64,
    "seed": 0,
    "disable_log_stats": False,
}

# role: (vLLM KV role, the core its engine computes on, its NIXL side-channel port). The
# ports are outside pdserve's ranges (base + 400 from 15600/17600/18600/19600) and Ray's
# defaults (20000, 22000), so this app can run next to a pdserve cluster.
ROLES = {
    "prefill": ("kv_producer", 0, 21600),
    "decode": ("kv_consumer", 1, 21700),
}


def llm_config(role: str, stream_batching_ms: float | None) -> LLMConfig:
    """One engine deployment: one replica, CPU only, its own core and side-channel port;
    streamed tokens batched every ``stream_batching_ms`` (None: Ray Serve LLM's default,
    50 ms; 0: each token on its own)."""
    kv_role, core, nixl_port = ROLES[role]
    kv_transfer_config = {  # as kv_transfer/connector.py builds it for pdserve
        "kv_connector": "NixlConnector",
        "kv_role": kv_role,
        "kv_buffer_device": "cpu",
        "engine_id": f"serve-llm-{role}",  # Ray appends "-<host>-<port>"
        "kv_connector_extra_config": {"backends": ["UCX"], "kv_lease_duration": 30},
        "kv_load_failure_policy": "recompute",
    }
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "UCX_TLS": "tcp,self",
        # Set here, Ray's NixlConnectorBackend keeps them instead of picking its own.
        "VLLM_NIXL_SIDE_CHANNEL_HOST": HOST,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(nixl_port),
        # pdserve's vLLM plugin is installed in this venv, so it loads in these engines
        # too: with this it turns NIXL's progress thread off, as local.yaml does for
        # pdserve (the thread would spin a whole core per engine).
        "PDSERVE_NIXL_PROGRESS_THREAD": "0",
        "HF_HUB_OFFLINE": "1",
    }
    return LLMConfig(
        model_loading_config={"model_id": MODEL_ID, "model_source": str(MODEL_PATH)},
        engine_kwargs={**ENGINE_KWARGS, "kv_transfer_config": kv_transfer_config},
        # Without this, Ray Serve LLM assumes a GPU: GPU placement bundles, a remote
        # config task asking for num_gpus, and vLLM's "ray" executor.
        accelerator_config={"kind": "cpu"},
        # One logical CPU per engine replica (the replica actor itself asks for none).
        placement_group_config={"bundles": [{"CPU": 1}]},
        deployment_config={
            "num_replicas": 1,
            "health_check_timeout_s": 60,  # as pdserve's engines: 2 busy cores are slow
            "ray_actor_options": {"num_cpus": 0},
        },
        runtime_env={"env_vars": env},
        experimental_configs=({} if stream_batching_ms is None
                              else {"stream_batching_interval_ms": stream_batching_ms}),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream-batching-ms", type=float, default=None,
                        help="how long the decode replica batches streamed tokens (default: "
                             "Ray Serve LLM's, 50 ms; 0: every token on its own)")
    args = parser.parse_args()
    if not (MODEL_PATH / "config.json").exists():
        raise SystemExit(f"no model at {MODEL_PATH}: generate it with `make model`")
    # "local": a fresh cluster of our own, never one that `ray start` left running.
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address=HOST)
    # After ray.init, which installs its own handlers: SIGINT and SIGTERM end the wait below
    # (with Ray's, Ctrl-C left the app running).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    try:
        pd_serving_args = {
            "prefill_config": llm_config("prefill", args.stream_batching_ms),
            "decode_config": llm_config("decode", args.stream_batching_ms),
            "ingress_deployment_config": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        }
        app = build_pd_openai_app(pd_serving_args)
        serve.start(http_options={"host": HOST, "port": HTTP_PORT})
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        print("serving", flush=True)
        print(f"'{MODEL_ID}' at http://{HOST}:{HTTP_PORT}/v1; Ctrl-C to stop", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("shutting down", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
