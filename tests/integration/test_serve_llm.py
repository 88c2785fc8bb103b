"""Ray Serve LLM's own PD application, the benchmark's peer baseline, runs on this CPU stack
(tools/bench/serve_llm.py): started from the test cluster's config as `pdserve bench
compare --setups ...,serve-llm` starts it, it answers a completion and a streamed chat
through its prefill -> NIXL -> decode path with pdserve's engine settings, and leaves no
process behind."""

from __future__ import annotations

import signal

import httpx
import pytest

from router.sse import sse_lines
from tests.integration.conftest import (
    CONFIG,
    CONFIG_PATH,
    LOG_DIR,
    REPO,
    _cluster_processes,
    _wait_for_exit,
)
from tools import processes
from tools.bench import serve_llm

pytestmark = pytest.mark.integration
PORT = 8650


@pytest.fixture(scope="module")
def serve_llm_app(pdserve):
    """Started after pdserve, which generates the tiny model on a fresh checkout."""
    before = _cluster_processes()
    server = processes.start(
        "serve-llm",
        serve_llm.start_args(CONFIG_PATH, PORT, 0),
        f"http://127.0.0.1:{PORT}",
        LOG_DIR,
        REPO,
    )
    server.ready_line, server.health_path = serve_llm.SERVING_LINE, "/v1/models"
    try:
        processes.wait_ready(server, timeout_s=420)
        yield server
    finally:
        returncode = processes.stop(server, signal.SIGINT, timeout_s=120)
    assert returncode == 0, f"exit {returncode}; see {server.log}"
    leftover = _wait_for_exit(before, timeout_s=60)
    assert not leftover, f"Ray Serve LLM left processes behind: {leftover}"


def test_ray_serve_llm_pd_app_answers_through_its_prefill_and_decode_engines(serve_llm_app):
    url = serve_llm_app.base_url
    completion = httpx.post(
        f"{url}/v1/completions",
        timeout=120,
        json={
            "model": CONFIG.model.name,
            "prompt": "The pools are " * 40,
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["completion_tokens"] == 8
    events = []
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        timeout=120,
        json={
            "model": CONFIG.model.name,
            "stream": True,
            "max_tokens": 8,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Hello there, pools!"}],
        },
    ) as response:
        assert response.status_code == 200
        events = [line for line in sse_lines(response.iter_bytes()) if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2
    # both of its engines did the work: the prefill log shows the request, the decode
    # engine pulled KV (vLLM's NIXL handshake with the prefill engine)
    log = serve_llm_app.log_tail(2_000_000)
    assert "NIXL compatibility check passed" in log, serve_llm_app.log
