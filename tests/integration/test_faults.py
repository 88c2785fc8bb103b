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
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psutil
import pytest

from cluster.config import load_config
from router.sse import sse_lines
from tests.integration.conftest import (
    LOG_DIR,
    REPO,
    engine_stats,
    is_replica,
    serving,
    wait_for,
)
from tests.integration.poisons import bad_requests, odd_but_valid
from tests.integration.prometheus import by_process, scrape, settled_scrape, total
from tools.cluster_processes import gone
from tools.cluster_processes import replicas as cluster_replicas

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CONFIG_PATH = REPO / "tests/integration/pdserve-faults.yaml"
CONFIG = load_config(CONFIG_PATH)
MODEL = CONFIG.model.name
METRICS_URL = f"http://127.0.0.1:{CONFIG.ray.metrics_export_port}/metrics"
RECOVERY_S = 300  # a replaced replica starts its engine from scratch on a busy machine
# How a call's replica killed under it reaches the router: over Ray actor calls Ray says
# the actor died; over Serve's gRPC data plane the call's connection is gone, "unavailable"
# (router/failures.py).
LOST = "died" if CONFIG.router.transport == "ray" else "unavailable"


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with serving(CONFIG_PATH, CONFIG, LOG_DIR / "faults") as server:
        wait_until_whole(server.base_url)
        yield server.base_url


@pytest.fixture(autouse=True)
def starts_whole(cluster) -> None:
    """Each test starts from a whole cluster, also after a test that failed before its own
    recovery check: one fault's aftermath must not become the next test's failure."""
    wait_until_whole(cluster)


# ---- the processes ----------------------------------------------------------------------


def replicas(pool: str) -> list[tuple[psutil.Process, list[psutil.Process]]]:
    """The pool's replica actors, each with its EngineCore processes."""
    return cluster_replicas(f"{pool}-v1")


def cpu_seconds(processes_: list[psutil.Process]) -> float:
    """CPU time of the processes themselves: an engine core's own time tracks its steps.
    (With its worker's time added, one run took an idle engine for the busy one.)"""
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


# When the current test injected its fault (time.monotonic()), for the recovery time.
FAULT: dict[str, float] = {}


def injected() -> None:
    FAULT["at"] = time.monotonic()


def wait_until_whole(base_url: str) -> float:
    """Both pools back to their replicas, each with a live engine, and serving; the
    seconds since the fault that took (printed: docs/reliability.md quotes them)."""
    started = FAULT.pop("at", time.monotonic())
    def whole() -> bool:
        for pool in ("prefill", "decode"):
            ready = [cores for _, cores in replicas(pool) if cores]
            if len(ready) < getattr(CONFIG, pool).replicas:
                return False
        try:  # a router replica that is being replaced holds the request a while
            return httpx.get(f"{base_url}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(whole, "both pools whole again", RECOVERY_S)
    # A replica replaced moments ago may still be loading: a request to each pool proves
    # the pool serves (Serve routes only to replicas whose start finished).
    for prompt in ("short", "long " * 40):
        assert complete(base_url, prompt, max_tokens=2).status_code == 200
    # ... and the router routes to every replica: its engine process exists before its
    # start finished, and while it loads it can look like the engine computing a test's
    # stream (the fault would then hit the wrong replica)
    wait_for(lambda: routed_replicas(base_url) == {
        pool: getattr(CONFIG, pool).replicas for pool in ("prefill", "decode")},
        "the router routing to every replica", RECOVERY_S,
        detail=lambda: routed_replicas(base_url))
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    took = time.monotonic() - started
    print(f"whole again {took:.1f}s after the fault")
    return took


def routed_replicas(base_url: str) -> dict | None:
    """How many replicas of each pool a router replica routes to (Serve's running ones)."""
    try:
        stats = engine_stats(base_url)
    except httpx.HTTPError:
        return None
    return {pool: stats[pool]["routed_replicas"] for pool in ("prefill", "decode")}


def kv_held(pool: str) -> float:
    """The KV cache share the pool's engines hold, summed over them (0: no block held)."""
    return total(scrape(METRICS_URL), "ray_pdserve_kv_cache_usage_ratio", pool=pool)


def nothing_leaked_in_the_router(base_url: str) -> None:
    def admission_empty() -> bool:
        state = httpx.get(f"{base_url}/admin/admission", timeout=10).json()
        return (state["running"], state["queued"], state["tokens_in_flight"]) == (0, 0, 0)

    wait_for(admission_empty, "the admission budget back to zero", 60)


def routing_tasks(pool: str) -> float:
    """Serve's request-routing tasks for the pool in the router's process: each routes
    a call waiting for a replica, and one left when nothing waits is a call that never
    will be routed (two calls of a request under one id once left one per release,
    until the pool's routing stopped: router/transport.py)."""
    return total(scrape(METRICS_URL), "ray_serve_num_scheduling_tasks",
                 deployment=f"{pool}-v1", handle_source="REPLICA")


def nothing_leaked(base_url: str, killed_cores: list[int] = ()) -> None:
    nothing_leaked_in_the_router(base_url)
    for pool in ("prefill", "decode"):
        wait_for(lambda pool=pool: routing_tasks(pool) == 0,
                 f"no routing task left for the {pool} pool", 60)
    wait_for(lambda: gone(list(killed_cores)), "the killed replica's EngineCore gone", 60)
    for pool in ("prefill", "decode"):
        wait_for(lambda pool=pool: kv_held(pool) == 0, f"no KV block held in the {pool} pool",
                 60)


# ---- the requests -------------------------------------------------------------------------


def unique_prompt(words: int) -> str:
    # A fresh prefix each time: no prefix-cache hit shortens the work a fault must meet.
    return f"{uuid.uuid4().hex} " + " ".join(f"w{i}" for i in range(words))


def complete(base_url: str, prompt: str, **params) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "return_token_ids": True,
            **params}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=600)


def stream_tokens(base_url: str, prompt: str, max_tokens: int,
                  on_tokens=lambda count: None, **params) -> tuple[list[int], list]:
    """The streamed token ids (of every choice) and anything else the stream carried
    (errors, [DONE])."""
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "return_token_ids": True, **params}
    tokens, other = [], []
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=600) as response:
        assert response.status_code == 200, response.read()
        for line in sse_lines(response.iter_bytes()):
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


def decode_cached() -> float:
    """Prompt tokens the decode engines found in their prefix caches, since they started."""
    return total(scrape(METRICS_URL), "ray_pdserve_engine_prompt_tokens_total", pool="decode",
                 source="cached")


def decode_cached_by_process() -> dict[str, float]:
    return by_process(METRICS_URL, "ray_pdserve_engine_prompt_tokens_total", pool="decode",
                      source="cached")


def answered_ok() -> float:
    return total(scrape(METRICS_URL), "ray_pdserve_requests_total", outcome="ok")


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


def _fault_midstream(base_url: str, act, **params) -> tuple[list[int], list[int], list]:
    """An unfaulted greedy stream (with ``params``), then the same one with
    ``act(actor, cores)`` applied to its decode replica once 200 tokens arrived; both
    token lists and the events."""
    prompt = unique_prompt(20)
    # A replacement replica may still be warming up after an earlier fault: it would look
    # like the engine computing this stream.
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    expected, _ = stream_tokens(base_url, prompt, 1500, **params)
    midway, acted = threading.Event(), threading.Event()
    victim: dict = {}
    arrivals: list[tuple[float, int]] = []

    def fault() -> None:
        # Found while it computes the stream, acted on once the client holds 200 tokens.
        victim["actor"], victim["cores"] = computing("decode")
        if midway.wait(timeout=120):
            act(victim["actor"], victim["cores"])
            injected()
            acted.set()

    def after(count: int) -> None:
        arrivals.append((time.monotonic(), count))
        if count >= 200:
            midway.set()

    injector = threading.Thread(target=fault, daemon=True)
    injector.start()
    received, other = stream_tokens(base_url, prompt, 1500, on_tokens=after, **params)
    injector.join(timeout=120)
    assert acted.is_set(), f"the fault was not injected; token arrivals: {arrivals[:3]} ... " \
        f"{arrivals[-3:]}"
    return expected, received, [other, victim]


class Background:
    """``call()`` run on a daemon thread (a request that blocks while the test injects a
    fault); ``result()`` waits for it and gives what it returned, or raises what it raised."""

    def __init__(self, call):
        self._outcome: dict = {}

        def run() -> None:
            try:
                self._outcome["value"] = call()
            except BaseException as error:  # handed to the test's thread by result();
                # pytest.fail's is no Exception
                self._outcome["error"] = error

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout_s: float = 300):
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            pytest.fail(f"the request in the background got no answer within {timeout_s}s")
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def _pool_killed_while_it_waits(base_url: str, pool_name: str, prompt: str,
                                waiting=lambda: True) -> tuple[httpx.Response, list[int]]:
    """Stop (SIGSTOP) the pool's engines, send a greedy request of ``prompt``, and once
    it is admitted and ``waiting()`` holds, SIGKILL every replica of the pool: the answer,
    and the killed replicas' EngineCore pids."""
    pool = replicas(pool_name)
    for _, cores in pool:
        for core in cores:
            core.suspend()
    answer = Background(lambda: complete(base_url, prompt, max_tokens=16))
    try:
        wait_for(lambda: httpx.get(f"{base_url}/admin/admission", timeout=10).json()[
            "running"] == 1, "the request admitted", 60)
        wait_for(waiting, "the request waiting in the stopped pool", 60)
    finally:
        for actor, _ in pool:
            os.kill(actor.pid, signal.SIGKILL)
        injected()
        for _, cores in pool:  # a stopped process cannot notice that its parent died
            for core in cores:
                with contextlib.suppress(psutil.NoSuchProcess):
                    core.resume()
    return answer.result(), [core.pid for _, cores in pool for core in cores]


def test_a_decode_replica_killed_midstream_loses_no_token(cluster):
    before = retried("decode", "migrate", LOST)
    expected, received, (other, victim) = _fault_midstream(
        cluster, lambda actor, cores: os.kill(actor.pid, signal.SIGKILL))
    assert len(expected) == 1500 and received == expected  # none lost, none repeated
    assert other == ["[DONE]"]
    counted("decode", "migrate", LOST, before + 1)
    nothing_leaked(cluster, [core.pid for core in victim["cores"]])
    wait_until_whole(cluster)


def test_a_hung_decode_engine_is_left_behind_at_its_deadline_then_replaced(cluster):
    """The decode engine computing a stream is SIGSTOPped 200 tokens in: the stream goes
    on on the other replica once ``router.deadlines.token_gap_s`` passed, every token
    once, and new requests keep off the hung engine. Nobody resumes it: its own replica,
    seeing it hold a request without a step for ``engine.stall_timeout_s``, kills it (only
    a SIGKILL ends a stopped process), and Serve replaces the replica."""
    before = retried("decode", "migrate", "deadline")
    stopped: list[psutil.Process] = []

    def stop(actor, cores) -> None:
        for core in cores:
            core.suspend()  # SIGSTOP: alive, answering nothing
            stopped.append(core)

    try:
        expected, received, (other, _) = _fault_midstream(cluster, stop)
        assert received == expected and other == ["[DONE]"]
        counted("decode", "migrate", "deadline", before + 1)
        # Meanwhile its replica reports its engine stalled, with figures frozen idle (its
        # stream went elsewhere): four requests sent at once all keep off it, none waits
        # out a deadline there. (Read as they are, those figures would draw half of them.)
        retries_before, answered_before = retried("decode", None), answered_ok()
        answers = [Background(lambda: complete(cluster, unique_prompt(20), max_tokens=16))
                   for _ in range(4)]
        for answer in answers:
            response = answer.result()
            assert response.status_code == 200, response.text
        wait_for(lambda: answered_ok() >= answered_before + 4, "the four answers counted", 60)
        assert retried("decode", None) == retries_before, "a new request met the hung engine"
        wait_for(lambda: gone([core.pid for core in stopped]),
                 "the hung EngineCore killed by its replica",
                 CONFIG.engine.stall_timeout_s + 90)
    finally:
        for core in stopped:  # a failed test leaves no stopped process behind
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
    nothing_leaked(cluster)
    wait_until_whole(cluster)


def test_a_unary_answer_whose_engine_hangs_runs_again_at_its_gap_deadline(cluster):
    """vLLM returns a unary answer whole; its decode replica sends the router a sign of
    life while its engine steps (decode/progress.py). The engine computing one is
    SIGSTOPped: the signs stop, and once ``router.deadlines.token_gap_s`` (10 s) passed
    the router runs the request again on the other replica and answers it in full (before:
    its only deadline covered every token, ``first_token_s + token_gap_s * max_tokens``).
    The stopped engine is resumed: it aborts the abandoned attempt and holds nothing."""
    prompt = unique_prompt(20)
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    expected = complete(cluster, prompt, max_tokens=2000, ignore_eos=True).json()[
        "choices"][0]["token_ids"]
    before = retried("decode", "decode_local", "deadline")
    answer = Background(lambda: complete(cluster, prompt, max_tokens=2000, ignore_eos=True))
    _, cores = computing("decode")
    try:
        for core in cores:
            core.suspend()  # SIGSTOP: alive, answering nothing
        injected()
        response = answer.result()
    finally:
        for core in cores:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["token_ids"] == expected
    counted("decode", "decode_local", "deadline", before + 1)
    assert not gone([core.pid for core in cores]), "the resumed engine was replaced"
    nothing_leaked(cluster)
    wait_until_whole(cluster)


def test_decode_replicas_killed_before_the_first_token_answer_in_full(cluster):
    """Both decode engines are stopped, so a prefilled request waits in one of them for its
    first token; then both decode replicas are killed. The decode call fails before
    anything was sent: the KV handle is given up (the prefill engine frees its blocks) and
    the request runs again, decode-local, on a replacement replica, answering every token."""
    prompt = unique_prompt(100)  # ~500 tokens: through the prefill pool and NIXL
    expected = complete(cluster, prompt, max_tokens=16).json()["choices"][0]["token_ids"]
    before = retried("decode", "decode_local", LOST)
    # Prefilled, the request is handed to a decode replica, whose stopped engine cannot
    # start it: it waits there for its first token, its prompt's KV held for it.
    response, killed = _pool_killed_while_it_waits(
        cluster, "decode", prompt, lambda: kv_held("prefill") > 0)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["token_ids"] == expected
    counted("decode", "decode_local", LOST, before + 1)
    nothing_leaked(cluster, killed)
    wait_until_whole(cluster)


def test_the_decode_replica_a_prefix_is_pinned_to_killed_its_next_request_answers_in_full(
        cluster):
    """A system prompt pins its requests to the decode replica whose prefix cache holds it
    (router.routing.decode.prefix_affinity_slots). That replica is killed the moment a
    request with the head has finished, before Serve has heard of it, and the next request
    with the head is sent at once: it is answered in full, by the other replica, with one
    retry at most; the router forgets the dead replica's cache, so the request after it
    needs none, and nothing leaks."""
    head = unique_prompt(150)   # ~700 tokens: 20 blocks, disaggregated
    second, third = head + " the second question", head + " the third question"
    head_tokens = (len(head.encode()) // CONFIG.engine.block_size - 1) * CONFIG.engine.block_size
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    cached_before, per_replica_before = decode_cached(), decode_cached_by_process()
    expected = {prompt: complete(cluster, prompt, max_tokens=16, ignore_eos=True).json()[
        "choices"][0]["token_ids"] for prompt in (second, third)}
    # the third found the head where the second left it (and its count is in: the next
    # one's must not be mistaken for it)
    wait_for(lambda: decode_cached() - cached_before >= head_tokens,
             "the head found in a decode replica's prefix cache", 60,
             detail=lambda: f"{head_tokens} tokens wanted; cached tokens per decode process "
                            f"before {per_replica_before}, now {decode_cached_by_process()}")
    retries_before, cached_before = retried("decode", None), decode_cached()
    # The replica that decodes a stream with the head is the one it is pinned to ...
    pinned = Background(lambda: computing("decode"))
    tokens, other = stream_tokens(cluster, head + " the first question", 1500)
    assert len(tokens) == 1500 and other == ["[DONE]"]
    actor, cores = pinned.result()
    # ... which held the head already: the stream found it in its prefix cache
    wait_for(lambda: decode_cached() - cached_before >= head_tokens,
             "the stream's head found in its decode replica's prefix cache", 60)
    answered_before = answered_ok()
    os.kill(actor.pid, signal.SIGKILL)
    injected()
    for prompt in (second, third):
        response = complete(cluster, prompt, max_tokens=16, ignore_eos=True)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["token_ids"] == expected[prompt]
    # The router reports its retries with its requests: once both answers are counted,
    # so is every retry they took.
    wait_for(lambda: answered_ok() >= answered_before + 2, "both answers counted", 60)
    retries = retried("decode", None) - retries_before
    print(f"retries after the pinned replica was killed: {retries:.0f}")
    assert retries <= 1
    nothing_leaked(cluster, [core.pid for core in cores])
    wait_until_whole(cluster)


def test_the_prefill_lost_while_decode_waits_to_pull_is_recomputed_never_a_silent_200(cluster):
    """A prompt is prefilled and its KV waits on the prefill engine for a decode engine that
    is stopped; then the prefill replicas are killed, and the decode engine resumed: its
    pull fails, and vLLM's recompute policy prefills the prompt on the decode engine. The
    answer is whole, never a 200 with empty text and finish_reason "error"."""
    prompt = unique_prompt(100)
    # ignore_eos: a random prompt may lead this model to EOS, and the answer must be whole
    expected = complete(cluster, prompt, max_tokens=16, ignore_eos=True).json()[
        "choices"][0]["token_ids"]
    failures_before = total(scrape(METRICS_URL), "ray_pdserve_kv_transfer_failures_total",
                            pool="decode")
    decode_cores = [core for _, cores in replicas("decode") for core in cores]
    prefill = replicas("prefill")
    for core in decode_cores:
        core.suspend()
    answer = Background(lambda: complete(cluster, prompt, max_tokens=16, ignore_eos=True))
    try:
        wait_for(lambda: kv_held("prefill") > 0, "the prompt's KV held for decode", 60)
        for actor, _ in prefill:
            os.kill(actor.pid, signal.SIGKILL)
        injected()
        killed = [core.pid for _, cores in prefill for core in cores]
        wait_for(lambda: gone(killed), "the prefill engines gone", 60)
    finally:
        for core in decode_cores:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
    response = answer.result()
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["token_ids"] == expected and choice["finish_reason"] == "length"
    wait_for(lambda: total(scrape(METRICS_URL), "ray_pdserve_kv_transfer_failures_total",
                           pool="decode") > failures_before, "the failed pull counted", 60)
    nothing_leaked(cluster, killed)
    wait_until_whole(cluster)


def test_prefill_replicas_killed_midprefill_still_answer_every_token(cluster):
    """Both prefill engines are stopped, so the request waits inside one of them; then both
    replicas are killed: the prefill call fails, its retry meets the other dead replica,
    and with no replica left the decode engine prefills the prompt at once, without
    waiting for the prefill deadline or a replacement."""
    prompt = unique_prompt(1500)  # ~7,800 tokens: through the prefill pool
    expected = complete(cluster, prompt, max_tokens=16).json()["choices"][0]["token_ids"]
    before = retried("prefill", "decode_local")
    retried_before_giving_up = retried("prefill", "give_up")
    deadlines_before = retried("prefill", None, "deadline")
    # Admitted, it is sent to a prefill replica at once; killed before it arrives, it
    # waits for a replica that is not there, which ends the same way.
    answer = Background(lambda: _pool_killed_while_it_waits(cluster, "prefill", prompt))
    # Until a replacement starts, /health names the pool that has no replica.
    wait_for(lambda: "prefill-v1" in httpx.get(f"{cluster}/health", timeout=30).text,
             "/health naming the empty pool", 60)
    response, killed = answer.result()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["token_ids"] == expected
    # Every attempt failed because its replica died or none was left, none by waiting out
    # its deadline, and the decode engine took the prompt.
    counted("prefill", "decode_local", None, before + 1)
    assert retried("prefill", None, "deadline") == deadlines_before
    assert retried("prefill", "give_up") == retried_before_giving_up
    nothing_leaked(cluster, killed)
    wait_until_whole(cluster)


def test_an_engine_dead_inside_a_live_replica_costs_no_500_and_is_replaced(cluster):
    """SIGKILL of a decode replica's EngineCore only: the actor lives on with a dead engine.
    Requests that reach it fail over (never a 500), and Serve's health check replaces it."""
    actor, cores = replicas("decode")[0]
    for core in cores:
        os.kill(core.pid, signal.SIGKILL)
    injected()
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


@contextlib.contextmanager
def leaving_client(base_url: str, body: dict) -> Iterator[None]:
    """A completion request sent over a raw socket, which is closed (the client gone)
    when the block ends, before any answer is read."""
    url = httpx.URL(base_url)
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
    with socket.create_connection((url.host, url.port), timeout=30) as connection:
        connection.sendall(head.encode() + payload)
        yield


def router_replica() -> psutil.Process:
    for process in psutil.process_iter(["name"]):
        if is_replica(process, "router"):
            return process
    pytest.fail("no router replica process")


def generated(pool: str) -> float:
    """The tokens the pool's engines generated, once every engine's count has been
    reported."""
    name = "ray_pdserve_engine_generation_tokens_total"
    return total(settled_scrape(METRICS_URL, name, deadline_s=120, pool=pool), name,
                 pool=pool)


def test_a_router_replica_killed_midstream_breaks_the_stream_and_stops_its_engine(cluster):
    """The router replica holding a stream is SIGKILLed: the stream ends with an error
    event, never [DONE] (Serve's proxy would just stop the body; router/proxy_edge.py
    adds the event), and the decode engine stops generating for it instead of running on
    to max_tokens for nobody (it aborts the requests of a caller that died)."""
    max_tokens = 6000
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    tokens_before = generated("decode")
    victim = router_replica()
    body = {"model": MODEL, "prompt": unique_prompt(4), "temperature": 0,
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", f"{cluster}/v1/completions", json=body,
                      timeout=120) as response:
        assert response.status_code == 200
        for line in sse_lines(response.iter_bytes()):
            if line.startswith("data: "):
                events.append(line)
            if len(events) == 100 and victim.is_running():
                os.kill(victim.pid, signal.SIGKILL)
                injected()
    assert len(events) >= 100, events
    assert "data: [DONE]" not in events, "the cut stream ended as if whole"
    assert json.loads(events[-1][len("data: "):])["error"]["code"] == "service_unavailable"
    wait_for(engines_quiet(), "the decode engine stopped", RECOVERY_S)
    spent = generated("decode") - tokens_before
    assert spent < max_tokens, f"{spent} tokens generated for a stream nobody read"
    wait_until_whole(cluster)
    nothing_leaked(cluster)


def kv_counter(name: str, pool: str) -> float:
    return total(scrape(METRICS_URL), f"ray_pdserve_kv_{name}_total", pool=pool)


def test_a_handle_that_reaches_decode_past_its_lease_is_never_pulled(cluster):
    """Both decode replicas stall (their actors SIGSTOPped) while a prompt is prefilled: the
    router's decode call waits in front of them, and the prefill engine frees the prompt's
    KV when its lease runs out. Resumed, the decode replica finds the handle past its claim
    deadline and prefills the prompt itself instead of pulling blocks that may now hold
    another prompt's KV; the answer is the same as an unfaulted run's
    (kv_transfer/handle.py: claim_by)."""
    prompt = unique_prompt(100)  # ~500 tokens: through the prefill pool
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    expired_before = kv_counter("leases_expired", "prefill")
    late_before = kv_counter("handles_late", "decode")
    decode_actors = [actor for actor, _ in replicas("decode")]
    for actor in decode_actors:
        actor.suspend()
    injected()
    try:
        answer = Background(lambda: complete(cluster, prompt, max_tokens=16))
        wait_for(lambda: kv_counter("leases_expired", "prefill") > expired_before,
                 "the prefill engine freeing the unclaimed blocks when the lease ran out",
                 CONFIG.kv_transfer.lease_s + 60)
        wait_for(lambda: kv_held("prefill") == 0, "no KV block held in the prefill pool", 60)
    finally:
        for actor in decode_actors:
            actor.resume()
    response = answer.result()
    assert response.status_code == 200, response.text
    expected = complete(cluster, prompt, max_tokens=16).json()["choices"][0]["token_ids"]
    assert response.json()["choices"][0]["token_ids"] == expected
    wait_for(lambda: kv_counter("handles_late", "decode") == late_before + 1,
             "the late handle counted by the decode engine", 60)
    nothing_leaked(cluster)
    wait_until_whole(cluster)


def test_a_flood_from_one_key_fills_only_its_share_and_a_queued_client_can_leave(cluster):
    """With the decode engines stopped, one client (``user``) sends more than the budget
    runs at once: two run, two wait, the fifth is refused at once (429, its share of the
    queue is full) while another client's request is still admitted. A waiting client that
    disconnects leaves the queue. Resumed, every admitted request is answered."""
    def send(user: str, words: int) -> httpx.Response:
        body = {"model": MODEL, "prompt": unique_prompt(words), "temperature": 0,
                "max_tokens": 16, "user": user}
        return httpx.post(f"{cluster}/v1/completions", json=body, timeout=300)

    def admission() -> dict:
        return httpx.get(f"{cluster}/admin/admission", timeout=10).json()

    pool = replicas("decode")
    cores = [core for _, cores_ in pool for core in cores_]
    answers: dict[str, Background] = {}
    for core in cores:
        core.suspend()
    try:
        # ~3,600 prompt tokens each: two fit the budget of 9,000, the rest wait.
        for i in range(4):
            answers[f"flood{i}"] = Background(lambda: send("flood", 700))
        wait_for(lambda: (admission()["running"], admission()["queued"]) == (2, 2),
                 "two of the flood running and two queued", 60)
        refused = send("flood", 700)
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] and refused.json()["error"]["code"] == "queue_full"
        answers["calm"] = Background(lambda: send("calm", 10))  # fits what is left
        wait_for(lambda: admission()["running"] == 3, "another key's request admitted", 60)
        # A client that gives up while queued: its place in the queue is given back.
        with leaving_client(cluster, {"model": MODEL, "prompt": unique_prompt(700),
                                      "max_tokens": 16, "user": "leaver"}):
            wait_for(lambda: admission()["queued"] == 3, "the leaving client queued", 60)
        wait_for(lambda: admission()["queued"] == 2, "the gone client's place freed", 60)
    finally:
        for core in cores:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
    for name, answer in answers.items():
        response = answer.result()
        assert response.status_code == 200, (name, response.text)
    nothing_leaked(cluster)


def test_a_client_gone_during_its_prefill_leaves_no_work_behind(cluster):
    """A client sends a ~7,800-token prompt and disconnects while it is in the prefill
    stage: no decode engine ever generates for it, its admission is returned and no engine
    keeps its KV. The prefill engines are stopped meanwhile, so that the prompt cannot
    finish its prefill before the disconnect reaches the router (a prefill of it takes
    well under a second here)."""
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    decoded_before = generated("decode")
    body = {"model": MODEL, "prompt": unique_prompt(1500), "max_tokens": 16,
            "temperature": 0}
    cores = [core for _, cores_ in replicas("prefill") for core in cores_]
    for core in cores:
        core.suspend()
    try:
        with leaving_client(cluster, body):
            wait_for(lambda: httpx.get(f"{cluster}/admin/admission", timeout=10).json()[
                "running"] == 1, "the prompt admitted and sent to the prefill pool", 60)
        nothing_leaked_in_the_router(cluster)
    finally:
        for core in cores:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
    nothing_leaked(cluster)
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    assert generated("decode") == decoded_before, "a decode engine generated for a client gone"


def test_a_request_that_fails_its_engine_alone_is_answered_500_and_sent_to_no_other(cluster):
    """This cluster's decode engines keep vLLM 0.32's own rewind of a discarded seeded
    sample (``PDSERVE_SEEDED_CPU=vllm`` in its config), so a seeded n=2 prompt the decode
    engine prefills in chunks ends the engine with an error: a real poison request.
    Alone in its engine, it is quarantined (router/retry.py): answered 500 naming it,
    counted, and never handed to the other decode engine, which lives on. Nothing of the
    crashed engine outlives it (its worker held the replica's NIXL side-channel port:
    cluster/engine/process_tree.py), and Serve's replacement replica comes up on that
    port. Sent again, it is refused at once (router/quarantine_memory.py)."""
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    trees = {core.pid: [core.pid, *(p.pid for p in core.children(recursive=True))]
             for _, cores in replicas("decode") for core in cores}
    quarantined_before = retried("decode", "quarantine", "crashed")
    prompt = " ".join(f"p{uuid.uuid4().hex[:6]}" for _ in range(300))  # ~2,400 tokens
    body = {"model": MODEL, "prompt": prompt, "temperature": 1.0, "seed": 5, "n": 2,
            "max_tokens": 8, "ignore_eos": True}
    response = httpx.post(f"{cluster}/v1/completions", timeout=300, json=body)
    injected()
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("internal_error", "internal_error")
    # named as the logs name it (vLLM's id for the request's one prompt, "<id>-0")
    assert f'{response.headers["x-request-id"].split(",")[0]}-0 ' in error["message"]
    counted("decode", "quarantine", "crashed", quarantined_before + 1)
    assert retried("decode", None, "crashed_shared") == 0
    # Sent again (as OpenAI's SDKs resend a 500): refused before any engine sees it.
    resend = httpx.post(f"{cluster}/v1/completions", timeout=60, json=body)
    assert resend.status_code == 500 and "was not run" in resend.json()["error"]["message"]
    counted("decode", "refuse_resend", "crashed", 1)
    wait_for(lambda: sum(gone([core]) for core in trees) == 1, "the failed decode engine gone",
             60)
    crashed = next(tree for core, tree in trees.items() if gone([core]))
    wait_for(lambda: gone(crashed), "every process of the crashed engine gone", 30)
    survivor = [core for core in trees if not gone([core])]
    nothing_leaked(cluster)
    wait_until_whole(cluster)
    assert all(not gone([core]) for core in survivor), "the other decode engine was replaced"


def test_streams_a_continuation_cannot_reproduce_end_saying_so_without_internals(cluster):
    """Two streams that are not continued after a fault (router/retry.py): one of n=2
    (its choices stream interleaved) and a greedy one with a stop string (vLLM holds back
    the last characters while they may begin one, and a continuation sees only its own
    text: migrated, the answer would miss them). Both decode replicas are SIGKILLed once
    each stream has 100 tokens. Each ends with an error event: pdserve's 503, never the
    exception's text (vLLM's layer writes that into the event: Ray's actor id, address,
    traceback); the greedy one's tokens are the unfaulted answer's beginning, no gap."""
    stop = {"stop": ["a stop string this answer never holds"]}
    prompt = unique_prompt(20)
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    expected, _ = stream_tokens(cluster, prompt, 1000, **stop)
    pool = replicas("decode")
    counts = {"choices": 0, "stop": 0}
    midway = threading.Event()

    def seen(name: str):
        def note(count: int) -> None:
            counts[name] = count
            if min(counts.values()) >= 100:
                midway.set()
        return note

    choices = Background(lambda: stream_tokens(cluster, unique_prompt(20), 1000, n=2,
                                               temperature=1.0, on_tokens=seen("choices")))
    stopped = Background(lambda: stream_tokens(cluster, prompt, 1000, on_tokens=seen("stop"),
                                               **stop))
    assert midway.wait(120), f"the streams never reached 100 tokens each: {counts}"
    for actor, _ in pool:
        os.kill(actor.pid, signal.SIGKILL)
    injected()
    for (tokens, other), reason in ((choices.result(), None),
                                    (stopped.result(), "stop strings")):
        errors = [event["error"] for event in other if isinstance(event, dict)]
        assert len(errors) == 1 and errors[0]["code"] == 503, other
        text = json.dumps(errors[0]).lower()  # before: "The actor <id> is unavailable: ..."
        for internal in ("traceback", "pid", "ip=", "actor", "127.0.0.1", "ray"):
            assert internal not in text, text
        if reason is not None:
            assert "cannot be continued exactly" in errors[0]["message"]
            assert reason in errors[0]["message"]
            assert 100 <= len(tokens) < len(expected) and tokens == expected[:len(tokens)]
    nothing_leaked(cluster, [core.pid for _, cores in pool for core in cores])
    wait_until_whole(cluster)


def engine_processes() -> dict[str, set[int]]:
    """Every EngineCore pid of both pools, by pool."""
    return {pool: {core.pid for _, cores in replicas(pool) for core in cores}
            for pool in ("prefill", "decode")}


def test_the_poison_catalogue_is_refused_or_answered_and_restarts_no_engine(cluster):
    """Every request of the poison catalogue (tests/integration/poisons.py: the bad
    requests with their 4xx, then odd but valid ones answered 200) goes to a cluster of two
    replicas per pool, where a request that failed its engine would be retried on the
    other. None is answered 5xx. Then for 80 s, past ``engine.stall_timeout_s`` (60 s) and
    a health check (10 s) after the last one, every engine process stays the one it was
    before: none was killed, crashed or left with its stall clock running. (This cluster's
    own real poison, a seeded prompt its decode engines prefill in chunks with vLLM's
    rewind, is the quarantine test's; the main suite sends it to pdserve's seeded path.)"""
    wait_for(engines_quiet(), "every engine idle", RECOVERY_S)
    cores = [core for pool in ("prefill", "decode") for _, cores in replicas(pool)
             for core in cores]
    before = engine_processes()
    assert all(len(pids) == 2 for pids in before.values()), before
    retries_before = {pool: retried(pool, None) for pool in before}
    for path, body, status, _ in bad_requests(MODEL):
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = httpx.post(f"{cluster}{path}", content=content, timeout=60,
                              headers={"content-type": "application/json"})
        assert response.status_code == status, (path, content[:200], response.text[:500])
    for body in odd_but_valid(MODEL):
        response = httpx.post(f"{cluster}/v1/completions", json=body, timeout=300)
        assert response.status_code == 200, (body, response.text[:500])
    watched_s = max(80.0, (CONFIG.engine.stall_timeout_s or 0) + 20)
    # Watched by their exits (psutil waits on the processes themselves), not by polls.
    gone, _ = psutil.wait_procs(cores, timeout=watched_s)
    assert not gone, f"engines ended within {watched_s:.0f} s: {[p.pid for p in gone]}"
    assert engine_processes() == before, f"an engine was replaced: {before} -> " \
        f"{engine_processes()}"
    assert all(stats["engine_stalled_s"] == 0 for stats in engine_stats(cluster).values())
    assert {pool: retried(pool, None) for pool in before} == retries_before, \
        "a request of the catalogue was sent to a second replica"
    nothing_leaked(cluster)
