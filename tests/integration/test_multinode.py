"""Autoscaling on a multi-node imitation: Ray's fake multi-node provider on one machine.

A load step raises the prefill pool from 1 to 2 replicas (the pool's own policy, from
queued prefill tokens); the second replica needs a prefill node, so the Ray cluster
autoscaler starts one. When the load stops, the pool shrinks back to 1, draining the
replica it removes, and no request fails. Slow (minutes): `make test-multinode`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.config import load_config
from cluster.serve_env import node_env
from tools import processes

pytestmark = [pytest.mark.integration, pytest.mark.multinode]

REPO = Path(__file__).resolve().parents[2]
CLUSTER_FILE = REPO / "ray_configs/cluster-local-fake.yaml"
CONFIG_PATH = REPO / "tests/integration/pdserve-multinode.yaml"
CONFIG = load_config(CONFIG_PATH)
RAY = str(Path(sys.executable).parent / "ray")
LOG_DIR = REPO / ".cache" / "test-logs"
# Everything on loopback: no Ray token auth (a token left in ~/.ray by an earlier local
# cluster would otherwise switch it on for the head but not for its clients).
CLIENT_ENV = {"RAY_AUTH_MODE": "disabled"}
FAKE_CLUSTER_ENV = {
    **CLIENT_ENV,
    "RAY_FAKE_CLUSTER": "1",                                   # the fake provider's switch
    "AUTOSCALER_UPDATE_INTERVAL_S": "1",                       # Ray autoscaler's loop
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",  # replicas' load reports
    **node_env(CONFIG.router.transport, CONFIG.router.ingress,  # as the cluster files set it
               CONFIG.router.haproxy),
}
STATE_SCRIPT = """
import json, ray
from ray import serve
ray.init(address="{address}", logging_level="error", log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"]]
try:
    deployments = serve.status().applications["pdserve"].deployments
    replicas = {{name: d.replica_states.get("RUNNING", 0) for name, d in deployments.items()}}
except KeyError:
    replicas = {{}}
print("STATE " + json.dumps({{"replicas": replicas,
    "prefill_nodes": sum(1 for n in nodes if "prefill_node" in n["Resources"]),
    "decode_nodes": sum(1 for n in nodes if "decode_node" in n["Resources"])}}))
"""


def cluster_state() -> dict:
    """Running replicas per deployment and live nodes per type, read through Ray."""
    script = STATE_SCRIPT.format(address=CONFIG.ray.address)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, cwd=REPO, env={**os.environ, **CLIENT_ENV})
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("STATE "))
    return json.loads(line.removeprefix("STATE "))


def wait_for(predicate, timeout_s: float, what: str, during=None) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = cluster_state()
        if predicate(state):
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:.0f}s; last state {state}")
        if during is not None:
            during()
        time.sleep(2)


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[None]:
    env = {**os.environ, **FAKE_CLUSTER_ENV}
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
    started = subprocess.run(
        # The fake provider starts its nodes against the default GCS port on this
        # machine's address: the head must be there too.
        [RAY, "start", "--head", "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false",
         "--disable-usage-stats", f"--autoscaling-config={CLUSTER_FILE}"],
        env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        wait_for(lambda s: s["prefill_nodes"] >= 1 and s["decode_nodes"] >= 1, 180,
                 "the fake cluster's first prefill and decode nodes did not start")
        yield
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def pdserve_multinode(fake_cluster) -> Iterator[str]:
    previous = {key: os.environ.get(key) for key in CLIENT_ENV}
    os.environ.update(CLIENT_ENV)  # start_pdserve passes this process's environment on
    server = processes.start_pdserve(CONFIG_PATH, CONFIG, LOG_DIR, REPO)
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        processes.wait_ready(server, timeout_s=600)
        yield server.base_url
    finally:
        assert processes.stop(server, signal.SIGINT, timeout_s=120) == 0


async def _request(client: httpx.AsyncClient, prompt_tokens: int, max_tokens: int,
                   results: list) -> None:
    body = {"model": CONFIG.model.name, "prompt": "long prompt. " * (prompt_tokens // 13),
            "max_tokens": max_tokens, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    tokens = response.json()["usage"]["completion_tokens"] if response.status_code == 200 else 0
    results.append((response.status_code, tokens == max_tokens))


def test_a_load_step_scales_prefill_out_to_a_new_node_and_back(pdserve_multinode):
    prefill, decode = f"prefill-{CONFIG.model.version}", f"decode-{CONFIG.model.version}"
    before = cluster_state()
    assert before["replicas"][prefill] == 1 and before["prefill_nodes"] == 1
    results: list[tuple[int, bool]] = []

    async def load_until(stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=pdserve_multinode, timeout=300) as client:
            while not stop.is_set():  # ~6 prompts of ~3K tokens queued at the prefill pool
                await asyncio.gather(*(_request(client, 3000, 4, results) for _ in range(6)))

    async def step() -> dict:
        stop = asyncio.Event()
        load = asyncio.create_task(load_until(stop))
        try:
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline:
                state = await asyncio.to_thread(cluster_state)
                if state["replicas"].get(prefill, 0) >= 2 and state["prefill_nodes"] >= 2:
                    return state
                await asyncio.sleep(3)
            pytest.fail(f"prefill did not scale out to a second node: {state}")
        finally:
            stop.set()
            await load

    scaled = asyncio.run(step())
    assert scaled["replicas"][decode] == 1        # decode's own policy kept it at its max
    # The load stopped: the pool drains back to one replica while a stream is running.
    streamed: list[tuple[int, bool]] = []

    async def scale_down() -> dict:
        async with httpx.AsyncClient(base_url=pdserve_multinode, timeout=600) as client:
            stream = asyncio.create_task(_request(client, 200, 3000, streamed))
            state = await asyncio.to_thread(
                wait_for, lambda s: s["replicas"].get(prefill) == 1, 300,
                "prefill did not scale back to 1 replica")
            await stream
            return state

    scale_down_state = asyncio.run(scale_down())
    assert scale_down_state["replicas"][prefill] == 1
    assert results and all(results_ok == (200, True) for results_ok in results), results
    assert streamed == [(200, True)]
    print(f"\nmultinode: {len(results)} requests during the step, states "
          f"{before} -> {scaled} -> {scale_down_state}")
