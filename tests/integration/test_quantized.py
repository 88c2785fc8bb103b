"""Quantized weights and an fp8 KV cache through the real prefill -> NIXL -> decode path.

The cluster also takes clients' HTTP through HAProxy (``router.ingress: haproxy``), so the
tests here also cover that ingress: answers and errors arrive through it unchanged.

A cluster of its own (pdserve-quantized.yaml, `make test` runs it after the main suite):
the test cluster's tiny model as W8A8 int8 weights that pdserve makes (cluster/quantize.py),
with the KV cache in fp8 where this machine's CPU can hold it (AVX-512 or AMX; checked as
each engine checks it, cluster/engine/cpu_check.py). Greedy answers must equal those of
one colocated vLLM engine with the same settings, token for token, on both of pdserve's
paths; long prompts must arrive on the decode engine over NIXL, at fp8's size.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import psutil
import pytest
import yaml

from cluster.checkpoints import ensure_checkpoints
from cluster.config import load_config, parse_config
from cluster.engine.cpu_check import local_cluster_refusals, local_processor
from cluster.engine.cpu_support import (
    activation_dtype_refusal,
    kv_bytes_per_token,
    kv_element_bytes,
)
from cluster.tiny_model import ensure_model
from router.haproxy_edge import config_path, error_page, gateway_error_files
from tests.integration.conftest import (
    CONFIG as TEST_CLUSTER_CONFIG,
)
from tests.integration.conftest import (
    LOG_DIR,
    REPO,
    _cluster_processes,
    _ready_or_fail,
    _wait_for_exit,
    engine_stats,
    is_replica,
    wait_for,
    wait_until_idle,
)
from tests.integration.openai_http import API_KEY, generate
from tests.integration.test_equivalence import prose
from tools import processes

pytestmark = [pytest.mark.integration, pytest.mark.levers]

BASE_CONFIG_PATH = REPO / "tests/integration/pdserve-quantized.yaml"
REFERENCE_PORT = 8545
# Long enough to be running still when the test has seen it start and killed its router.
KILLED_REQUEST_TOKENS = 2000


def _config_for_this_machine() -> tuple[dict, str | None]:
    """The cluster's config document with fp8 KV where this CPU can hold it, and the
    reason it cannot (None: fp8 it is); the W8A8 checkpoint is made first. On a CPU with
    AMX the engines compute in bfloat16: vLLM's int8 kernel there takes no float32
    (cluster/engine/cpu_support.py), and pdserve refuses the float32 config, as checked."""
    document = yaml.safe_load(BASE_CONFIG_PATH.read_text())
    ensure_checkpoints(parse_config(document))
    if activation_dtype_refusal("compressed-tensors", document["engine"]["dtype"],
                                local_processor()):
        assert local_cluster_refusals(parse_config(document)), "float32 on AMX not refused"
        document["engine"]["dtype"] = "bfloat16"
    document["engine"]["kv_cache_dtype"] = "fp8"
    refusals = local_cluster_refusals(parse_config(document))
    if refusals:
        document["engine"]["kv_cache_dtype"] = "auto"
    return document, "; ".join(refusals) or None


@pytest.fixture(scope="module")
def quantized() -> Iterator[tuple[str, str, dict, str | None]]:
    """(pdserve's URL, the colocated engine's URL, the config, why not fp8 or None)."""
    model = TEST_CLUSTER_CONFIG.model
    ensure_model(model.path, model.generate)  # the source: the test cluster's own model
    document, no_fp8 = _config_for_this_machine()
    config_path = LOG_DIR / "pdserve-quantized.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(document))
    config = load_config(config_path)
    before = _cluster_processes()
    server = processes.start_pdserve(config_path, config, LOG_DIR / "quantized", REPO)
    reference = processes.start_vllm_server(config, REFERENCE_PORT, LOG_DIR / "quantized",
                                            REPO, name="quantized-vllm")
    try:
        _ready_or_fail(server)
        _ready_or_fail(reference)
        yield server.base_url, reference.base_url, document, no_fp8
    finally:
        processes.stop(reference, signal.SIGTERM, timeout_s=60)
        returncode = processes.stop(server, signal.SIGINT, timeout_s=120)
    assert returncode == 0, f"pdserve exited with {returncode}; see {server.log}"
    assert not _wait_for_exit(before), "processes left behind after shutdown"


def test_the_engines_run_the_projects_w8a8_checkpoint(quantized):
    _, _, document, _ = quantized
    checkpoint = REPO / document["model"]["path"]
    declared = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    assert declared["quant_method"] == "compressed-tensors"
    log = (LOG_DIR / "quantized" / "pdserve.log").read_text(errors="replace")
    # vLLM's own line for the kernel it chose (Ray folds the engines' identical lines)
    assert "Int8ScaledMMLinearKernel for CompressedTensorsW8A8Int8" in log, "no int8 kernel"


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("prompt", [prose(8, seed=21), prose(220, seed=22)],
                         ids=["decode-local", "disaggregated"])
def test_greedy_answers_equal_one_colocated_engines(quantized, prompt, stream):
    url, reference, document, _ = quantized
    model = document["model"]["name"]
    params = {"max_tokens": 32, "temperature": 0, "ignore_eos": True}
    ours = generate(url, "completion", model, prompt, stream=stream, **params)
    theirs = generate(reference, "completion", model, prompt, stream=stream, **params)
    assert ours.status == theirs.status == 200, (ours.error, theirs.error)
    assert ours.prompt_token_ids == theirs.prompt_token_ids
    assert ours.token_ids == theirs.token_ids, "the quantized engines' answers differ"
    assert ours.text == theirs.text


def test_clients_reach_the_router_through_haproxy_not_serves_python_proxy(quantized):
    url, _, document, _ = quantized
    port = int(url.rsplit(":", 1)[1])
    haproxy = _listener_of(port)
    assert haproxy.name() == "haproxy"  # Serve's proxy actor runs, but not on the port
    # and its own listeners where the config put them, not on Ray's defaults
    ports = document["router"]["haproxy"]
    assert _listener_of(ports["stats_port"]) == _listener_of(ports["metrics_port"]) == haproxy
    # Ray started it through pdserve-haproxy: its errors are pdserve's page, not Ray's 500
    pages = gateway_error_files(Path(config_path(haproxy.cmdline())).read_text().splitlines())
    assert pages and all(Path(page).read_bytes() == error_page() for page in pages)
    unknown = generate(url, "completion", "no-such-model", "hello", stream=False,
                       max_tokens=4)
    assert unknown.status == 404
    assert unknown.error["type"] == "NotFoundError", unknown.error  # the router's own JSON
    answer = generate(url, "completion", document["model"]["name"], "hello", stream=True,
                      max_tokens=4, ignore_eos=True)
    assert answer.status == 200 and len(answer.token_ids) == 4, answer.error


def _listener_of(port: int) -> psutil.Process | None:
    """The process listening on TCP ``port`` (IPv4), from /proc."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (process / "fd").iterdir()):
                return psutil.Process(int(process.name))
        except (OSError, psutil.Error):  # gone, or not ours to read
            continue
    return None


def test_a_long_prompts_kv_moves_over_nixl_at_the_caches_element_size(quantized):
    url, _, document, no_fp8 = quantized
    engine = document["engine"]
    before = wait_until_idle(url)
    answer = generate(url, "completion", document["model"]["name"], prose(230, seed=23),
                      stream=False, max_tokens=4, temperature=0)
    assert answer.status == 200, answer.error
    after = wait_until_idle(url)
    moved = {key: after["decode"][key] - before["decode"][key]
             for key in ("prompt_tokens_transferred", "kv_bytes_transferred",
                         "kv_transfer_failures")}
    assert moved["prompt_tokens_transferred"] >= len(answer.prompt_token_ids) - engine[
        "block_size"] and moved["kv_transfer_failures"] == 0
    source = json.loads((REPO / document["model"]["quantize"]["source"] / "config.json")
                        .read_text())
    per_token = kv_bytes_per_token(source, kv_element_bytes(
        engine["dtype"], engine["kv_cache_dtype"], source))
    blocks = -(-moved["prompt_tokens_transferred"] // engine["block_size"])
    assert moved["kv_bytes_transferred"] == blocks * engine["block_size"] * per_token, moved
    assert engine_stats(url)["prefill"]["kv_cache_usage"] == 0  # blocks released
    if no_fp8 is not None:
        pytest.skip(f"the KV moved in {engine['dtype']}: this CPU cannot hold an fp8 cache "
                    f"({no_fp8})")


# Last in the module: it kills the cluster's router replica (Serve starts another).
def test_a_router_replica_killed_under_a_request_is_answered_through_the_clients_retry(
        quantized):
    """The router replica holding a request is SIGKILLed. HAProxy answers the cut request
    with pdserve's JSON 503 and ``Retry-After`` if it rode a new connection to the replica
    (router/haproxy_edge.py), or closes the client's connection without an answer if it
    rode a reused one (HAProxy's way under Ray's ``http-reuse always``). The OpenAI client
    retries either; its retry is answered in full, through Serve's proxy or the replica
    Serve starts in place of the dead one, and the engines end idle, every KV block back."""
    url, _, document, _ = quantized
    wait_until_idle(url)
    [victim] = _router_replicas()
    # 8 retries: the SDK's backoff (0.5 s doubling to 8 s) then spans about 40 s
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=8,
                           timeout=180)
    with ThreadPoolExecutor(1) as caller:
        pending = caller.submit(
            client.completions.with_raw_response.create, model=document["model"]["name"],
            prompt="hello", max_tokens=KILLED_REQUEST_TOKENS, temperature=0,
            extra_body={"ignore_eos": True})
        wait_for(lambda: engine_stats(url)["decode"]["num_running"] > 0,
                 "the request running on the decode engine", 60)
        os.kill(victim, signal.SIGKILL)
        answer = pending.result()
    assert answer.retries_taken >= 1  # the first attempt died with the replica
    assert answer.parse().usage.completion_tokens == KILLED_REQUEST_TOKENS
    wait_for(lambda: _router_replicas() - {victim}, "a new router replica", 120)
    wait_until_idle(url)


def _router_replicas() -> set[int]:
    """The pids of the router's replica processes."""
    return {process.pid for process in psutil.process_iter(["name"])
            if is_replica(process, "router")}
