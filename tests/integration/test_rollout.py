"""Rolling a changed config out (`pdserve deploy`) while streams are in flight.

The change adds a served name: the router deployment is replaced, the engines, whose
settings did not change, keep their replicas (no restart), and a stream that was running
on the old router replica when it was replaced finishes with every token.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.conftest import (
    CONFIG,
    CONFIG_PATH,
    MODEL,
    REPO,
    engine_stats,
    wait_until_idle,
)
from tests.integration.openai_http import ADMIN, AUTH, generate

pytestmark = pytest.mark.integration

NEW_NAME = "tiny-llama-added"
MAX_TOKENS = 2000       # ~5 s alone here, several times that beside the others
STREAM_EVERY_S = 3      # a new stream while the deploy runs, so that one spans the swap
STREAMS_AT_ONCE = 8     # all of them fit the admission budget together: none waits


def deploy(config_path: Path, once_connected=lambda: None, outcome: dict | None = None) -> None:
    """`pdserve deploy`; ``once_connected`` runs when it has reached the cluster.

    The exit status and output land in ``outcome`` (for a deploy run in a thread), else a
    failure is asserted here.
    """
    command = [sys.executable, "-m", "cluster.cli", "deploy", "--config", str(config_path)]
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process:
        output = []
        for line in process.stdout:
            output.append(line)
            if line.startswith("pdserve: deploying"):
                once_connected()
        returncode = process.wait(timeout=300)
    if outcome is not None:
        outcome.update(returncode=returncode, output="".join(output))
        return
    assert returncode == 0, "".join(output)


def router_replica(base_url: str) -> str:
    return httpx.get(f"{base_url}/admin/rollout", headers=ADMIN, timeout=60).json()[
        "router_replica"]


def engine_ids(base_url: str) -> dict[str, str]:
    return {pool: stats["engine_id"] for pool, stats in engine_stats(base_url).items()}


def test_a_rollout_keeps_in_flight_streams_and_unchanged_engines(pdserve, tmp_path):
    wait_until_idle(pdserve)
    engines_before = engine_ids(pdserve)
    changed = yaml.safe_load(CONFIG_PATH.read_text())
    changed["served_models"][NEW_NAME] = {"v2": 100}
    changed_path = tmp_path / "changed.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    try:
        streams, old_router, seen_new = _streams_across_a_deploy(pdserve, changed_path)
        reply = generate(pdserve, "completion", NEW_NAME, "hello", stream=False, max_tokens=4)
        assert reply.status == 200 and reply.headers["x-pdserve-version"] == "v2"
        for stream in streams:  # none dropped, none cut short
            result = stream["result"]
            assert result.status == 200 and result.finish_reason == "length"
            assert result.usage["completion_tokens"] == MAX_TOKENS == len(result.token_ids)
        # Serve stops the old router replica taking requests before the new one is up, and
        # the proxy holds new requests meanwhile: a stream sent then went to the new one.
        # At least one stream on the old replica must have still been running by then,
        # i.e. it was in flight while the old replica drained.
        by_old = [s for s in streams if s["result"].headers["x-pdserve-router"] == old_router]
        old_closed = min([seen_new] + [s["sent"] for s in streams
                                       if s["result"].headers["x-pdserve-router"] != old_router])
        assert any(s["ended"] > old_closed for s in by_old), [
            (s["result"].headers["x-pdserve-router"], s["sent"] - old_closed,
             s["ended"] - old_closed) for s in streams]
        assert engine_ids(pdserve) == engines_before  # the engines were not restarted
    finally:
        deploy(CONFIG_PATH)  # and back, whatever happened
    gone = httpx.post(f"{pdserve}/v1/completions", headers=AUTH, timeout=60,
                      json={"model": NEW_NAME, "prompt": "x", "max_tokens": 2})
    assert gone.status_code == 404
    assert engine_ids(pdserve) == engines_before


def _streams_across_a_deploy(pdserve: str,
                             config_path: Path) -> tuple[list[dict], str, float]:
    """Deploy ``config_path``; from when the deploy reaches the cluster until the router
    replica is seen replaced, start a long stream every few seconds (how long the swap
    takes varies a lot on two shared cores, so one stream started up front may end first).

    Returns the streams (result; when it was sent and when it ended), the old router
    replica and when a poll was first answered by the new one.
    """
    prompt = "keep going " * 10
    assert STREAMS_AT_ONCE * (len(prompt) + 1 + MAX_TOKENS) <= CONFIG.router.admission.token_budget
    streams: list[dict] = []
    threads: list[threading.Thread] = []
    stop = threading.Event()

    def long_stream(record: dict) -> None:
        record["sent"] = time.monotonic()
        record["result"] = generate(pdserve, "completion", MODEL, prompt, stream=True,
                                    max_tokens=MAX_TOKENS, ignore_eos=True)
        record["ended"] = time.monotonic()

    def launch_streams() -> None:
        while not stop.is_set():
            if sum(thread.is_alive() for thread in threads) < STREAMS_AT_ONCE:
                streams.append(record := {})
                threads.append(thread := threading.Thread(target=long_stream, args=(record,)))
                thread.start()
            stop.wait(STREAM_EVERY_S)

    old_router = router_replica(pdserve)
    launcher = threading.Thread(target=launch_streams)
    deployed: dict = {}
    deploying = threading.Thread(target=deploy, args=(config_path, launcher.start, deployed))
    deploying.start()
    # The old router replica drains from when the new one is started; the first answer
    # from the new one means the swap is under way.
    deadline = time.monotonic() + 600
    while router_replica(pdserve) == old_router:
        assert deploying.is_alive() or any(t.is_alive() for t in threads), \
            "the router was never replaced"
        assert time.monotonic() < deadline, "the router was not replaced within 600 s"
        time.sleep(0.2)
    seen_new = time.monotonic()
    stop.set()
    deploying.join(timeout=300)
    if launcher.ident is not None:  # started: the deploy reached the cluster
        launcher.join(timeout=60)
    for thread in threads:
        thread.join(timeout=600)
    assert deployed["returncode"] == 0, deployed["output"]
    return streams, old_router, seen_new
