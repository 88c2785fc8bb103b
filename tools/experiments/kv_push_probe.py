"""Pull against push KV transfer at the engines alone: two vLLM servers, no pdserve.

A prefill server (the prefill pool's core and engine settings) and a decode server (the
decode pool's) with vLLM's NIXL connector, in pull mode (``NixlConnector``, what pdserve
runs: the prefill answers with its KV's place, then the decode engine reads it) and in push
mode (``NixlPushConnector``: both engines get the request at once, the decode engine
registers its blocks with the prefill engine, which writes the KV into them when done).
Each request's time to the decode engine's answer (one token) is timed, and each greedy
answer is checked against the decode engine's own, computed without a transfer.

    .venv/bin/python tools/experiments/kv_push_probe.py --config ray_configs/bench.yaml --rounds 2

Prints per round and mode the median time, whether every answer matched, and the decode
engine's mean queued time over the timed requests, from vLLM's own metrics (the wait for
the KV). ``--modes`` picks and orders the modes; ``pull-vllm-wait`` is ``pull`` with
vLLM's 1 ms wait after an empty engine step kept (``PDSERVE_EMPTY_STEP_SLEEP=vllm``,
cluster/engine/vllm_plugin.py), so

    .venv/bin/python tools/experiments/kv_push_probe.py \
        --modes pull-vllm-wait,pull --rounds 3 --requests 30

compares the decode engine's wait for its KV with and without it, alternating; the last
lines give each mode's medians over the rounds and their ratio to the first mode's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from cluster.config import PDServeConfig, load_config
from cluster.engine.args import CPU_BIND_ENV, engine_env
from cluster.engine.plugin_env import EMPTY_STEP_SLEEP_ENV
from kv_transfer.connector import connector_config
from kv_transfer.handle import prefill_request_params
from tools import processes
from tools.bench.defaults import REPO

CONNECTORS = {"pull": "NixlConnector", "push": "NixlPushConnector",
              "pull-vllm-wait": "NixlConnector"}
MODE_ENV = {"pull-vllm-wait": {EMPTY_STEP_SLEEP_ENV: "vllm"}}
PORTS = {"prefill": 8401, "decode": 8402}
SIDE_CHANNEL_PORTS = {"prefill": 5700, "decode": 5710}
PROMPT = "def fibonacci(n):\n    " * 40


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("ray_configs/bench.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--modes", default="pull,push",
                        help=f"comma-separated, in order, from {', '.join(CONNECTORS)}")
    parser.add_argument("--out", type=Path, default=Path("bench-results/kv-push-probe"))
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := set(modes) - set(CONNECTORS):
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(CONNECTORS)}")
    config = load_config(args.config)
    results = []
    for round_number in range(args.rounds):
        for mode in modes:
            result = run_mode(config, mode, args.requests, args.out / f"{mode}-{round_number}")
            results.append({"round": round_number, "mode": mode, **result})
            print(json.dumps(results[-1]), flush=True)
    summary = summarize(results, modes)
    for line in summary:
        print(json.dumps(line), flush=True)
    (args.out / "results.json").write_text(json.dumps(
        {"rounds": results, "summary": summary}, indent=1))
    return 0


def summarize(results: list[dict], modes: list[str]) -> list[dict]:
    """Each mode's medians over the rounds, and their ratios to the first mode's."""
    medians = {mode: {key: statistics.median(r[key] for r in results if r["mode"] == mode)
                      for key in ("median_ms", "decode_queued_mean_ms")} for mode in modes}
    base = medians[modes[0]]
    return [{"mode": mode, **{key: round(value, 2) for key, value in medians[mode].items()},
             **{f"{key}_ratio": round(value / base[key], 3) for key, value in
                medians[mode].items()}} for mode in modes]


def run_mode(config: PDServeConfig, mode: str, requests: int, out: Path) -> dict:
    """Start both servers with ``mode``'s connector, time ``requests`` requests."""
    servers = [start_engine(config, role, mode, out) for role in ("prefill", "decode")]
    with processes.running(servers[0]) as prefill, processes.running(servers[1]) as decode:
        body = {"model": config.model.name, "prompt": PROMPT, "max_tokens": 1,
                "temperature": 0}
        alone = _text(httpx.post(f"{decode.base_url}/v1/completions", json=body, timeout=60))
        one_request(mode, prefill.base_url, decode.base_url, body)  # pays the NIXL handshake
        queued_before = _queue_time_totals(decode.base_url)
        times, matched = [], 0
        for _ in range(requests):
            started = time.perf_counter()
            answer = one_request(mode, prefill.base_url, decode.base_url, body)
            times.append((time.perf_counter() - started) * 1000)
            matched += answer == alone
        queued_s, counted = (after - before for after, before in
                             zip(_queue_time_totals(decode.base_url), queued_before, strict=True))
        queued_ms = 1000 * queued_s / counted if counted else float("nan")
    return {"median_ms": round(statistics.median(times), 1), "matched": matched,
            "requests": requests, "decode_queued_mean_ms": round(queued_ms, 2)}


def start_engine(config: PDServeConfig, role: str, mode: str,
                 out: Path) -> processes.ManagedServer:
    pool = config.pool(config.model.version, role)
    flags = ("--kv-transfer-config", json.dumps(connector_config(
        role, f"{role}-probe", connector=CONNECTORS[mode],
        buffer_device=config.kv_transfer.buffer_device, lease_s=config.kv_transfer.lease_s)))
    env = {**engine_env(config, role, "127.0.0.1", SIDE_CHANNEL_PORTS[role]),
           **MODE_ENV.get(mode, {})}
    return processes.start_vllm_server(
        config, PORTS[role], out / "logs", REPO, name=f"{role}-{mode}", role=role,
        cpu_bind=pool.env.get(CPU_BIND_ENV), extra_flags=flags, extra_env=env)


def one_request(mode: str, prefill: str, decode: str, body: dict) -> str:
    """The decode engine's answer to ``body``, its KV computed by the prefill engine."""
    request_id = uuid.uuid4().hex
    headers = {"X-Request-Id": request_id}
    prefill_body = {**body, "kv_transfer_params": prefill_request_params()}
    if mode != "push":
        made = httpx.post(f"{prefill}/v1/completions", json=prefill_body, headers=headers,
                          timeout=60).json()
        decode_body = {**body, "kv_transfer_params": made["kv_transfer_params"]}
        return _text(httpx.post(f"{decode}/v1/completions", json=decode_body,
                                headers=headers, timeout=60))
    # Push: the decode engine names the prefill engine; the two match by request id
    # (vLLM's completion ids are "cmpl-<X-Request-Id>-<prompt index>").
    params = {"do_remote_prefill": True, "do_remote_decode": False,
              "remote_engine_id": "prefill-probe", "remote_host": "127.0.0.1",
              "remote_port": SIDE_CHANNEL_PORTS["prefill"], "tp_size": 1,
              "remote_request_id": f"cmpl-{request_id}-0"}
    with ThreadPoolExecutor(2) as pool:
        answer = pool.submit(httpx.post, f"{decode}/v1/completions",
                             json={**body, "kv_transfer_params": params}, headers=headers,
                             timeout=60)
        made = pool.submit(httpx.post, f"{prefill}/v1/completions", json=prefill_body,
                           headers=headers, timeout=60)
        made.result().raise_for_status()
        return _text(answer.result())


def _text(response: httpx.Response) -> str:
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def _queue_time_totals(base_url: str) -> tuple[float, float]:
    """vLLM's queued time of the server's requests so far: seconds in all, and requests."""
    total = count = 0.0
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:request_queue_time_seconds_sum"):
            total += float(line.split()[-1])
        elif line.startswith("vllm:request_queue_time_seconds_count"):
            count += float(line.split()[-1])
    return total, count


if __name__ == "__main__":
    raise SystemExit(main())
