"""Faults injected into real processes of a running cluster (`make faults`).

The cluster (pdserve-faults.yaml) has two replicas per pool and short deadlines. Each test
kills (SIGKILL) or stops (SIGSTOP) an engine replica's process while a request is in it,
and checks what the client gets against an unfaulted run of the same greedy request: every
token, none repeated, in order. Then that nothing leaked (the admission budget back to
zero, both engines idle, the killed replica's EngineCore gone) and that the pool is whole
again before the next test.

Which replica serves a request is not visible from outside, so a test finds it by what
it does: the engine that is computing is the one whose EngineCore process gains CPU time
(the others idle in a blocking wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psutil
import pytest

from cluster import processes
from cluster.config import load_config
from tests.integration.conftest import (
    LOG_DIR,
    REPO,
    _cluster_processes,
    _ready_or_fail,
    _wait_for_exit,
)
from tests.integration.prometheus import scrape, total

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CONFIG_PATH = REPO / "tests/integration/pdserve-faults.yaml"
CONFIG = load_config(CONFIG_PATH)
MODEL = CONFIG.model.name
METRICS_URL = f"http://127.0.0.1:{CONFIG.ray.metrics_export_port}/metrics"
RECOVERY_S = 300  # a replaced replica starts its engine from scratch on a busy machine


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    before = _cluster_processes()
    server = processes.start_pdserve(CONFIG_PATH, CONFIG, LOG_DIR / "faults", REPO)
    try:
        _ready_or_fail(server)
        wait_until_whole(server.base_url)
        yield server.base_url
    finally:
        returncode = processes.stop(server, signal.SIGINT, timeout_s=120)
    assert returncode == 0, f"pdserve exited with {returncode}; see {server.log}"
    assert not _wait_for_exit(before), "processes left behind after shutdown"


# ---- the processes ----------------------------------------------------------------------


def replicas(pool: str) -> list[tuple[psutil.Process, list[psutil.Process]]]:
    """The pool's replica actors, each with its EngineCore processes."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == f"ray::ServeReplica:pdserve:{pool}-v1":
            try:
                cores = [child for child in process.children(recursive=True)
                         if child.name() == "VLLM::EngineCore"]
            except psutil.NoSuchProcess:
                continue
            found.append((process, cores))
    return found


def cpu_seconds(processes_: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes_:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def computing(pool: str, timeout_s: float = 60,
              min_cpu_s: float = 0.3) -> tuple[psutil.Process, list[psutil.Process]]:
    """The replica whose engine is computing: the first to gain ``min_cpu_s`` of CPU while
    every other engine of the pool gained at most a third of that."""
    candidates = replicas(pool)
    start = {actor.pid: cpu_seconds(cores) for actor, cores in candidates}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gains = sorted(((cpu_seconds(cores) - start[actor.pid], actor.pid, actor, cores)
                        for actor, cores in candidates), key=lambda gain: gain[:2])
        most, *_, actor, cores = gains[-1]
        runner_up = gains[-2][0] if len(gains) > 1 else 0.0
        if most >= min_cpu_s and most >= 3 * runner_up:
            return actor, cores
        time.sleep(0.05)
    gained = {actor.pid: round(cpu_seconds(cores) - start[actor.pid], 2)
              for actor, cores in candidates}
    pytest.fail(f"no {pool} engine started computing within {timeout_s}s: {gained}")


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def wait_for(condition, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout_s}s")
        time.sleep(0.5)


def engines_quiet(max_cpu_s: float = 0.05):
    """A condition for ``wait_for``: no engine gained more than ``max_cpu_s`` of CPU since
    the previous poll (a replacement may still be warming up after it reported ready, and
    would look like the engine serving a test's request)."""
    previous: dict[int, float] = {}

    def quiet() -> bool:
        current = {core.pid: cpu_seconds([core]) for pool in ("prefill", "decode")
                   for _, cores in replicas(pool) for core in cores}
        same_engines = current.keys() == previous.keys()
        gained = sum(current.values()) - sum(previous.values())
        previous.clear()
        previous.update(current)
        return same_engines and gained <= max_cpu_s

    return quiet


def wait_until_whole(base_url: str) -> float:
    """Both pools back to their replicas, each with a live engine, and serving; the
    seconds that took (printed: docs/reliability.md quotes them)."""
    started = time.monotonic()
    def whole() -> bool:
        for pool in ("prefill", "decode"):
            ready = [cores for _, cores in replicas(pool) if cores]
            if len(ready) < getattr(CONFIG, pool).replicas:
                return False
        return httpx.get(f"{base_url}/health", timeout=10).status_code == 200

    wait_for(whole, "both pools whole again", RECOVERY_S)
    # A replica replaced moments ago may still be loading: a request to each pool proves
    # the pool serves (Serve routes only to replicas whose start finished).
    for prompt in ("short", "long " * 40):
        assert complete(base_url, prompt, max_tokens=2).status_code == 200
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    took = time.monotonic() - started
    print(f"whole again after {took:.1f}s")
    return took


def nothing_leaked(base_url: str, killed_cores: list[int] = ()) -> None:
    def admission_empty() -> bool:
        state = httpx.get(f"{base_url}/admin/admission", timeout=10).json()
        return (state["running"], state["queued"], state["tokens_in_flight"]) == (0, 0, 0)

    wait_for(admission_empty, "the admission budget back to zero", 60)
    wait_for(lambda: gone(list(killed_cores)), "the killed replica's EngineCore gone", 60)


# ---- the requests -------------------------------------------------------------------------


def unique_prompt(words: int) -> str:
    # A fresh prefix each time: no prefix-cache hit shortens the work a fault must meet.
    return f"{uuid.uuid4().hex} " + " ".join(f"w{i}" for i in range(words))


def complete(base_url: str, prompt: str, **params) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "return_token_ids": True,
            **params}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=600)


def stream_tokens(base_url: str, prompt: str, max_tokens: int,
                  on_tokens=lambda count: None) -> tuple[list[int], list]:
    """The streamed token ids and anything else the stream carried (errors, [DONE])."""
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    tokens, other = [], []
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=600) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                other.append("[DONE]")
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                other.append(event)
            for choice in event.get("choices", []):
                tokens.extend(choice.get("token_ids") or [])
            on_tokens(len(tokens))
    return tokens, other


def retried(stage: str, action: str | None, reason: str | None = None) -> float:
    """How many times ``stage`` failed (for ``reason``) and ``action`` followed (None: any)."""
    labels = {"stage": stage, "action": action, "reason": reason}
    return total(scrape(METRICS_URL), "ray_pdserve_retries_total",
                 **{name: value for name, value in labels.items() if value is not None})


def counted(stage: str, action: str | None, reason: str | None, at_least: float) -> None:
    # Ray exports a replica's metrics every few seconds.
    wait_for(lambda: retried(stage, action, reason) >= at_least,
             f"pdserve_retries_total{{stage={stage}, reason={reason}, action={action}}}", 60)


# ---- the faults ---------------------------------------------------------------------------


def _fault_midstream(base_url: str, act) -> tuple[list[int], list[int], list]:
    """An unfaulted greedy stream, then the same one with ``act(actor, cores)`` applied
    to its decode replica once 200 tokens arrived; both token lists and the events."""
    prompt = unique_prompt(20)
    expected, _ = stream_tokens(base_url, prompt, 1500)
    midway, acted = threading.Event(), threading.Event()
    victim: dict = {}
    arrivals: list[tuple[float, int]] = []

    def fault() -> None:
        # Found while it computes the stream, acted on once the client holds 200 tokens.
        victim["actor"], victim["cores"] = computing("decode")
        if midway.wait(timeout=120):
            act(victim["actor"], victim["cores"])
            acted.set()

    def after(count: int) -> None:
        arrivals.append((time.monotonic(), count))
        if count >= 200:
            midway.set()

    injector = threading.Thread(target=fault, daemon=True)
    injector.start()
    received, other = stream_tokens(base_url, prompt, 1500, on_tokens=after)
    injector.join(timeout=120)
    assert acted.is_set(), f"the fault was not injected; token arrivals: {arrivals[:3]} ... " \
        f"{arrivals[-3:]}"
    return expected, received, [other, victim]


def test_a_decode_replica_killed_midstream_loses_no_token(cluster):
    before = retried("decode", "migrate", "unavailable")
    expected, received, (other, victim) = _fault_midstream(
        cluster, lambda actor, cores: os.kill(actor.pid, signal.SIGKILL))
    assert len(expected) == 1500 and received == expected  # none lost, none repeated
    assert other == ["[DONE]"]
    counted("decode", "migrate", "unavailable", before + 1)
    nothing_leaked(cluster, [core.pid for core in victim["cores"]])
    wait_until_whole(cluster)


def test_a_hung_decode_engine_is_left_behind_at_its_deadline(cluster):
    before = retried("decode", "migrate", "deadline")
    stopped: list[psutil.Process] = []

    def stop(actor, cores) -> None:
        for core in cores:
            core.suspend()  # SIGSTOP: alive, answering nothing
            stopped.append(core)

    try:
        expected, received, (other, _) = _fault_midstream(cluster, stop)
    finally:
        for core in stopped:
            core.resume()
    assert received == expected and other == ["[DONE]"]
    counted("decode", "migrate", "deadline", before + 1)
    nothing_leaked(cluster)
    wait_until_whole(cluster)


def test_prefill_replicas_killed_midprefill_still_answer_every_token(cluster):
    """Both prefill engines are stopped, so the request waits inside one of them; then both
    replicas are killed: the prefill call fails, its retry finds no replica until the
    deadline, and the decode engine prefills the prompt itself."""
    prompt = unique_prompt(1500)  # ~7,800 tokens: through the prefill pool
    expected = complete(cluster, prompt, max_tokens=16).json()["choices"][0]["token_ids"]
    before = retried("prefill", None)
    retried_before_giving_up = retried("prefill", "give_up")
    pool = replicas("prefill")
    for _, cores in pool:
        for core in cores:
            core.suspend()
    answer: dict = {}
    sender = threading.Thread(target=lambda: answer.update(
        response=complete(cluster, prompt, max_tokens=16)), daemon=True)
    sender.start()
    try:
        # Admitted, it is sent to a prefill replica at once; killed before it arrives, it
        # waits for a replica that is not there, which ends the same way.
        wait_for(lambda: httpx.get(f"{cluster}/admin/admission", timeout=10).json()[
            "running"] == 1, "the request admitted", 60)
    finally:
        for actor, _ in pool:
            os.kill(actor.pid, signal.SIGKILL)
        for _, cores in pool:  # a stopped process cannot notice that its parent died
            for core in cores:
                with contextlib.suppress(psutil.NoSuchProcess):
                    core.resume()
    # Until a replacement starts, /health names the pool that has no replica.
    wait_for(lambda: "prefill-v1" in httpx.get(f"{cluster}/health", timeout=30).text,
             "/health naming the empty pool", 60)
    sender.join(timeout=300)
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["token_ids"] == expected
    # The killed replica's call fails at once (unavailable) or, sent after the kill, finds
    # no replica until its deadline; the retry then finds a replacement or, none yet, the
    # decode engine prefills the prompt. Either way the prefill stage failed and was retried.
    counted("prefill", None, None, before + 1)
    assert retried("prefill", "give_up") == retried_before_giving_up
    nothing_leaked(cluster, [core.pid for _, cores in pool for core in cores])
    wait_until_whole(cluster)


def test_an_engine_dead_inside_a_live_replica_costs_no_500_and_is_replaced(cluster):
    """SIGKILL of a decode replica's EngineCore only: the actor lives on with a dead engine.
    Requests that reach it fail over (never a 500), and Serve's health check replaces it."""
    actor, cores = replicas("decode")[0]
    for core in cores:
        os.kill(core.pid, signal.SIGKILL)
    statuses: list[int] = []

    def replaced() -> bool:
        # A few requests at a time while the replica is dead, then replaced: each is
        # answered whole, or refused as retryable, never with a server error.
        for _ in range(3):
            response = complete(cluster, unique_prompt(4), max_tokens=4)
            statuses.append(response.status_code)
            assert response.status_code in (200, 503), response.text
        return not actor.is_running() or actor.status() == psutil.STATUS_ZOMBIE

    wait_for(replaced, "the replica with the dead engine replaced", RECOVERY_S)
    # Until its replica's next routing report says the engine is dead, a request and its
    # retry may both meet it (503); from then on it ranks last. How many 503s that is
    # depends on timing, which is why only their kind is asserted.
    print(f"answers while the engine was dead: {statuses}")
    assert 200 in statuses
    nothing_leaked(cluster, [core.pid for core in cores])
    wait_until_whole(cluster)
