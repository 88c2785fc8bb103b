"""What the NIXL connector alone costs a decode engine: vLLM's own OpenAI server on the
decode pool's core with the decode pool's engine settings, once as it is and once with the
``kv_consumer`` connector config pdserve's decode engines run with (no transfer happens:
every prompt is prefilled there), the same short prompts one at a time.

    .venv/bin/python tools/experiments/connector_cost.py \
        --config ray_configs/bench.yaml --requests 20

Prints ``bench overhead``'s latency table (the connector's run against the plain one) and
each run's CPU per streamed token.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cluster.config import load_config
from cluster.engine.args import CPU_BIND_ENV, engine_env
from kv_transfer.connector import connector_config
from tools import processes
from tools.bench import overhead
from tools.bench.defaults import COMPARE_REFERENCE_PORT, REPO
from tools.bench.measure import token_counter
from tools.bench.servers import warm_up
from tools.bench.workload import WorkloadSpec, plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("ray_configs/bench.yaml"))
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("bench-results/connector-cost"))
    args = parser.parse_args()
    config = load_config(args.config)
    spec = WorkloadSpec(name="reference", rate=1000, num_requests=args.requests, seed=7)
    requests = overhead.shorten(plan(spec, token_counter(str(config.model.path))),
                                args.max_tokens)
    decode = config.pool(config.model.version, "decode")
    kv_flags = ("--kv-transfer-config", json.dumps(connector_config(
        "decode", "connector-cost", buffer_device=config.kv_transfer.buffer_device,
        lease_s=config.kv_transfer.lease_s)))
    kv_env = engine_env(config, "decode", "127.0.0.1", config.kv_transfer.side_channel_base_port)
    runs = {}
    for name, flags, env in (("plain", (), {}), ("nixl", kv_flags, kv_env)):
        server = processes.start_vllm_server(
            config, COMPARE_REFERENCE_PORT, args.out / "logs", REPO, name=f"vllm-{name}",
            role="decode", cpu_bind=decode.env.get(CPU_BIND_ENV), extra_flags=flags,
            extra_env=env)
        with processes.running(server) as running:
            warm_up(running.base_url, config.model.name)
            runs[name] = overhead.measure(running.base_url, config.model.name, requests,
                                          args.max_tokens, running.process.pid)
    print(overhead.latency_table(runs, baseline="plain"))
    print(overhead.cpu_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
