"""The real stack for integration tests: `pdserve up` on a local Ray, and vLLM's own server.

``pdserve`` is started exactly as ``make run`` starts it (the CLI, in its own process
group) and stopped with SIGINT at the end of the session; the teardown checks that the
shutdown was clean: exit status 0, the port free again, no Ray or engine process left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG_PATH = REPO / "tests/integration/pdserve-test.yaml"
CONFIG = load_config(CONFIG_PATH)
MODEL = CONFIG.model.name
BASE_URL = f"http://{CONFIG.router.host}:{CONFIG.router.port}"
REFERENCE_PORT = 8200
STARTUP_TIMEOUT_S = 420
LOG_DIR = REPO / ".cache" / "test-logs"

# Processes a pdserve cluster consists of; none may outlive `pdserve up`.
CLUSTER_PROCESS_MARKERS = ("raylet", "gcs_server", "ray::", "EngineCore", "ServeReplica",
                           "ServeController", "ProxyActor")


def _cluster_processes() -> set[tuple[int, str]]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
        except OSError:
            continue
        if any(marker in cmdline for marker in CLUSTER_PROCESS_MARKERS):
            found.add((int(entry.name), cmdline[:120]))
    return found


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _wait_until_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args[:3]} exited with {process.returncode}; see {log}:\n"
                        + log.read_text()[-3000:])
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"{url} not ready after {STARTUP_TIMEOUT_S}s; see {log}")


def _start(args: list[str], name: str, env: dict[str, str] | None = None):
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{name}.log"
    process = subprocess.Popen(
        args, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, **(env or {})},
    )
    return process, log


@pytest.fixture(scope="session")
def pdserve() -> Iterator[str]:
    """Base URL of a running pdserve; asserts a clean shutdown afterwards."""
    assert _port_is_free(CONFIG.router.host, CONFIG.router.port), "test port already in use"
    before = _cluster_processes()
    process, log = _start(
        [sys.executable, "-m", "cluster.cli", "up", "--config", str(CONFIG_PATH)], "pdserve"
    )
    try:
        _wait_until_ready(f"{BASE_URL}/health", process, log)
        yield BASE_URL
    finally:
        process.send_signal(signal.SIGINT)
        try:
            returncode = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"pdserve did not stop within 120 s of SIGINT; see {log}")
    assert returncode == 0, f"pdserve exited with {returncode}; see {log}"
    leftover = _wait_for_exit(before)
    assert not leftover, f"processes left behind after shutdown: {leftover}"
    assert _port_is_free(CONFIG.router.host, CONFIG.router.port), "port still bound"


def _wait_for_exit(before: set[tuple[int, str]], timeout_s: float = 30) -> set:
    # Ray reaps its workers asynchronously after ray.shutdown() returns.
    deadline = time.monotonic() + timeout_s
    while True:
        leftover = _cluster_processes() - before
        if not leftover or time.monotonic() > deadline:
            return leftover
        time.sleep(1)


@pytest.fixture(scope="module")
def reference(pdserve) -> Iterator[str]:
    """A plain colocated vLLM OpenAI server on the same model and engine settings.

    Started after pdserve, which generates the tiny model on a fresh checkout.
    """
    engine = CONFIG.engine
    process, log = _start(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(CONFIG.model.path), "--served-model-name", MODEL,
         "--dtype", engine.dtype, "--max-model-len", str(engine.max_model_len),
         "--block-size", str(engine.block_size), "--seed", str(engine.seed),
         "--enforce-eager", "--host", "127.0.0.1", "--port", str(REFERENCE_PORT)],
        "reference-vllm",
        env={"VLLM_CPU_KVCACHE_SPACE": str(int(engine.cpu_kvcache_space_gib or 1))},
    )
    try:
        _wait_until_ready(f"http://127.0.0.1:{REFERENCE_PORT}/health", process, log)
        yield f"http://127.0.0.1:{REFERENCE_PORT}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def engine_stats(base_url: str) -> dict[str, dict]:
    response = httpx.get(f"{base_url}/admin/stats", timeout=30)
    response.raise_for_status()
    return response.json()


def wait_until_idle(base_url: str, timeout_s: float = 60) -> dict[str, dict]:
    """Poll until both engines run nothing and hold no KV block; return the stats.

    The prefill side frees a request's blocks once the decode side has pulled them (or the
    handle was released), a moment after the response ended, hence polling.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine_stats(base_url)
        if all(pool["is_idle"] for pool in stats.values()):
            return stats
        if time.monotonic() > deadline:
            pytest.fail(f"engines still busy or holding KV after {timeout_s}s: {stats}")
        time.sleep(0.5)
