"""The real stack for integration tests: `pdserve up` on a local Ray, and vLLM's own server.

``pdserve`` is started exactly as ``make run`` starts it (the CLI, in its own process
group) and stopped with SIGINT at the end of the session; the teardown checks that the
shutdown was clean: exit status 0, the port free again, no Ray or engine process left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.config import load_config
from cluster.local_node import port_is_free
from tests.integration.openai_http import ADMIN
from tools import processes
from tools.cluster_processes import is_replica  # noqa: F401 (the tests import it from here)

REPO = Path(__file__).resolve().parents[2]
CONFIG_PATH = REPO / "tests/integration/pdserve-test.yaml"
CONFIG = load_config(CONFIG_PATH)
MODEL = CONFIG.model.name
BASE_URL = f"http://{CONFIG.router.host}:{CONFIG.router.port}"
ENV_KEY_VARIABLE = CONFIG.router.auth.api_keys_env
ENV_API_KEY = "sk-from-the-environment"
REFERENCE_PORT = 8200
STARTUP_TIMEOUT_S = 420
LOG_DIR = REPO / ".cache" / "test-logs"

# Processes a pdserve cluster consists of; none may outlive `pdserve up`.
# How often the waits below look again: each look is a cheap read (/proc, /admin/stats), and
# every test that waits for a state pays on average half of it after the state is reached.
POLL_S = 0.2
CLUSTER_PROCESS_MARKERS = ("raylet", "gcs_server", "ray::", "EngineCore", "ServeReplica",
                           "ServeController", "ProxyActor", "haproxy")


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


@pytest.fixture(scope="session")
def pdserve() -> Iterator[str]:
    """Base URL of a running pdserve; asserts a clean shutdown afterwards."""
    host, port = CONFIG.router.host, CONFIG.router.port
    assert port_is_free(host, port), f"test port {port} already in use"
    os.environ[ENV_KEY_VARIABLE] = ENV_API_KEY  # the second source of keys (test_auth)
    with serving(CONFIG_PATH, CONFIG, LOG_DIR) as server:
        yield server.base_url
    assert port_is_free(CONFIG.router.host, CONFIG.router.port), "port still bound"


@contextlib.contextmanager
def serving(config_path: Path, config, log_dir: Path) -> Iterator[processes.ManagedServer]:
    """``pdserve up`` of ``config_path``, ready, until the block ends; then a clean stop:
    exit status 0 after SIGINT and no process of the cluster left behind."""
    before = _cluster_processes()
    server = processes.start_pdserve(config_path, config, log_dir, REPO)
    try:
        _ready_or_fail(server)
        yield server
    finally:
        returncode = processes.stop(server, signal.SIGINT, timeout_s=120)
    assert returncode == 0, f"pdserve exited with {returncode} after SIGINT; see {server.log}"
    leftover = _wait_for_exit(before)
    assert not leftover, f"processes left behind after shutdown: {leftover}"


def _ready_or_fail(server: processes.ManagedServer) -> None:
    try:
        processes.wait_ready(server, STARTUP_TIMEOUT_S)
    except processes.ServerFailed as error:
        pytest.fail(str(error))


def _wait_for_exit(before: set[tuple[int, str]], timeout_s: float = 30) -> set:
    # Ray reaps its workers asynchronously after ray.shutdown() returns. Processes are
    # told apart by pid alone: a Ray worker's title (its cmdline) changes while it runs a
    # task ("ray::ProxyActor" <-> "ray::ProxyActor.<method>"), so an older cluster's
    # process would otherwise count as new.
    old_pids = {pid for pid, _ in before}
    deadline = time.monotonic() + timeout_s
    while True:
        leftover = {(pid, title) for pid, title in _cluster_processes() if pid not in old_pids}
        if not leftover or time.monotonic() > deadline:
            return leftover
        time.sleep(POLL_S)


@pytest.fixture(scope="session")
def reference(pdserve) -> Iterator[str]:
    """A plain colocated vLLM OpenAI server on the same model and engine settings.

    Started after pdserve, which generates the tiny model on a fresh checkout; one for
    the session (the equivalence and parity tests each started their own: ~45 s more of
    `make test`). Between its tests it idles: an idle vLLM engine uses next to no CPU (the
    fault suite's ``engines_quiet`` waits for exactly that).
    """
    server = processes.start_vllm_server(CONFIG, REFERENCE_PORT, LOG_DIR, REPO,
                                         name="reference-vllm")
    try:
        _ready_or_fail(server)
        yield server.base_url
    finally:
        processes.stop(server, signal.SIGTERM, timeout_s=60)


def engine_stats(base_url: str, version: str | None = None) -> dict[str, dict]:
    """``/admin/stats`` of one version's pools (default: the primary version's)."""
    params = {"version": version} if version else None
    response = httpx.get(f"{base_url}/admin/stats", timeout=30, headers=ADMIN, params=params)
    response.raise_for_status()
    return response.json()


def wait_until_idle(base_url: str, timeout_s: float = 60,
                    version: str | None = None) -> dict[str, dict]:
    """Poll until both engines run nothing and hold no KV block; return the stats.

    The prefill side frees a request's blocks once the decode side has pulled them (or the
    handle was released), a moment after the response ended, hence polling.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine_stats(base_url, version)
        if all(pool["is_idle"] for pool in stats.values()):
            return stats
        if time.monotonic() > deadline:
            pytest.fail(f"engines still busy or holding KV after {timeout_s}s: {stats}")
        time.sleep(POLL_S)


def wait_for(condition, what: str, timeout_s: float, detail=None) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``, with
    what ``detail()`` says then (the state a failure needs explaining by)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            said = f": {detail()}" if detail is not None else ""
            pytest.fail(f"{what} not within {timeout_s}s{said}")
        time.sleep(POLL_S)
