"""Rolling a changed config out (`pdserve deploy`) while a stream is in flight.

The change adds a served name: the router deployment is replaced, the engines, whose
settings did not change, keep their replicas (no restart), and the stream that was running
on the old router replica finishes with every token.
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

from tests.integration.conftest import CONFIG_PATH, MODEL, REPO, engine_stats, wait_until_idle
from tests.integration.openai_http import AUTH, generate

pytestmark = pytest.mark.integration

NEW_NAME = "tiny-llama-added"
MAX_TOKENS = 7900  # the longest stream the test model's context allows: ~20 s here


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
    return httpx.get(f"{base_url}/admin/rollout", headers=AUTH, timeout=60).json()[
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

    streamed: dict = {}

    def long_stream() -> None:
        streamed["result"] = generate(pdserve, "completion", MODEL, "keep going " * 10,
                                      stream=True, max_tokens=MAX_TOKENS, ignore_eos=True)
        streamed["ended"] = time.monotonic()

    old_router = router_replica(pdserve)
    stream = threading.Thread(target=long_stream)
    deployed: dict = {}
    deploying = threading.Thread(target=deploy, args=(changed_path, stream.start, deployed))
    deploying.start()
    # The old router replica drains from when the new one is started; the first answer
    # from the new one means the swap is under way.
    while router_replica(pdserve) == old_router:
        assert deploying.is_alive() or stream.is_alive(), "the router was never replaced"
        time.sleep(0.2)
    swapped = time.monotonic()
    deploying.join(timeout=300)
    stream.join(timeout=600)
    assert deployed["returncode"] == 0, deployed["output"]
    reply = generate(pdserve, "completion", NEW_NAME, "hello", stream=False, max_tokens=4)
    assert reply.status == 200 and reply.headers["x-pdserve-version"] == "v2"
    assert streamed["ended"] > swapped, "the stream ended before the swap; make it longer"
    result = streamed["result"]
    assert result.status == 200 and result.finish_reason == "length"
    assert result.usage["completion_tokens"] == MAX_TOKENS == len(result.token_ids)
    assert engine_ids(pdserve) == engines_before  # the engines were not restarted

    deploy(CONFIG_PATH)  # and back
    gone = httpx.post(f"{pdserve}/v1/completions", headers=AUTH, timeout=60,
                      json={"model": NEW_NAME, "prompt": "x", "max_tokens": 2})
    assert gone.status_code == 404
    assert engine_ids(pdserve) == engines_before
