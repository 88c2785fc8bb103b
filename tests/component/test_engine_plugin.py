"""The engine plugin's step wait (cluster/engine/vllm_plugin.py) through vLLM's own queue.

vLLM's engine core and worker pass each step through a shared-memory ``MessageQueue``
whose reader spins while it waits. A reader in a child process, loaded with vLLM's
general plugins as an engine process is, waits half a second for a message: with
``PDSERVE_ENGINE_WAIT=sleep`` it leaves the core (it blocks, where vLLM's reader only
yields, and uses a small fraction of the wait in CPU time) and still receives the message.

The same setting makes vLLM's engine core skip its 1 ms wait after a step that ran no
model when a request's KV has arrived: vLLM's own loop body runs on a stand-in engine
core, and the sleeps it makes are recorded.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time

import pytest

from cluster.engine.plugin_env import EMPTY_STEP_SLEEP_ENV, WAIT_ENV
from cluster.engine.vllm_plugin import VLLM_EMPTY_STEP_SLEEP_S

WAIT_S = 0.5


def _reader(handle, wait: str | None, conn) -> None:
    if wait is None:
        os.environ.pop(WAIT_ENV, None)
    else:
        os.environ[WAIT_ENV] = wait
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    queue = MessageQueue.create_from_handle(handle, 0)
    queue.wait_until_ready()
    assert queue.dequeue(timeout=30) == "first"  # the reader is now in its busy phase
    conn.send("waiting")
    started, switches = time.thread_time(), _voluntary_switches()
    message = queue.dequeue(timeout=30)
    conn.send((message, time.thread_time() - started, _voluntary_switches() - switches))


def _voluntary_switches() -> int:
    """Times this thread gave up the core by blocking: a sleep counts, a ``sched_yield``
    does not (the yielding thread stays runnable), however busy the machine is."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def reader_wait(wait: str | None) -> tuple[float, int]:
    """CPU seconds a reader used, and the times it blocked, while it waited ``WAIT_S`` for
    its second message."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    queue = MessageQueue(n_reader=1, n_local_reader=1)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_reader, args=(queue.export_handle(), wait, child))
    process.start()
    try:
        queue.wait_until_ready()
        queue.enqueue("first")
        assert parent.poll(60) and parent.recv() == "waiting"
        time.sleep(WAIT_S)  # the wait being measured, not a synchronisation
        queue.enqueue("second")
        assert parent.poll(60), "the reader never received the second message"
        message, cpu_s, blocked = parent.recv()
        assert message == "second"
        return cpu_s, blocked
    finally:
        _stop(process)


def _stop(process) -> None:
    process.join(30)
    if process.is_alive():
        process.kill()


@pytest.mark.timeout(300)
def test_a_sleeping_reader_leaves_the_core_a_spinning_one_takes():
    spinning_cpu_s, spinning_blocked = reader_wait(None)
    sleeping_cpu_s, sleeping_blocked = reader_wait("sleep")
    # The CPU a spinner gets depends on what else runs: alone it takes the whole wait
    # (0.50 s of 0.5 s), beside three busy processes on two cores 0.0015 s, because each
    # sched_yield hands the core over. So the spin is told apart by how the reader waits:
    # a sleep blocks, a sched_yield leaves the thread runnable. Measured here: the
    # sleeper blocked ~2,600 times a wait with or without that load, the spinner never.
    assert spinning_blocked < 50, (
        f"vLLM's reader should spin: it blocked {spinning_blocked} times and took "
        f"{spinning_cpu_s:.3f} s of CPU")
    assert sleeping_blocked > 500, f"the sleeping reader blocked only {sleeping_blocked} times"
    # A sleep of 100 us a turn costs about a seventh of the wait in CPU time (0.07 s);
    # load only lowers it.
    assert sleeping_cpu_s < 0.25 * WAIT_S, f"the sleeping reader took {sleeping_cpu_s:.3f} s of CPU"


# -- the engine core's sleep after a step that ran no model ---------------------------------

def _engine_core_sleeps(wait: str | None, empty_step_sleep: str | None,
                        steps: list[tuple[bool, bool]], conn) -> None:
    """In a process named as vLLM names its engine core: load the general plugins, then
    for each ``(kv_arrived, model_ran)`` run vLLM's own ``EngineCoreProc.
    _process_engine_step`` once on a stand-in engine core whose scheduler still holds a
    request, and send back the sleeps each step made."""
    import types

    if wait is None:
        os.environ.pop(WAIT_ENV, None)
    else:
        os.environ[WAIT_ENV] = wait
    if empty_step_sleep is not None:
        os.environ[EMPTY_STEP_SLEEP_ENV] = empty_step_sleep
    from vllm.plugins import load_general_plugins
    from vllm.v1.engine.core import EngineCoreProc

    load_general_plugins()
    slept: list[float] = []
    time.sleep = slept.append  # the time module vLLM's engine core module sleeps with
    sleeps = []
    for kv_arrived, model_ran in steps:
        scheduler = types.SimpleNamespace(
            has_requests=lambda: True,
            finished_recving_kv_req_ids={"request-0"} if kv_arrived else set())
        engine_core = types.SimpleNamespace(
            step_fn=lambda ran=model_ran: ({}, ran), output_queue=None,
            post_step=lambda ran: None, scheduler=scheduler)
        EngineCoreProc._process_engine_step(engine_core)
        sleeps.append(slept[:])
        slept.clear()
    conn.send(sleeps)


def engine_core_sleeps(wait: str | None, steps: list[tuple[bool, bool]],
                       empty_step_sleep: str | None = None) -> list[list[float]]:
    """The sleeps of each step ``(kv_arrived, model_ran)`` in one engine core stand-in."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_engine_core_sleeps, name="EngineCore_DP0",
                          args=(wait, empty_step_sleep, steps, child))
    process.start()
    try:
        assert parent.poll(120), "the engine core stand-in never answered"
        return parent.recv()
    finally:
        _stop(process)


KV_ARRIVED, STILL_WAITING, MODEL_RAN = (True, False), (False, False), (True, True)


@pytest.mark.timeout(300)
def test_an_engine_core_whose_request_got_its_kv_steps_again_without_sleeping():
    # vLLM sleeps 1 ms after a step that ran no model while requests remain; a request
    # whose KV arrived in that step is computed in the next one, so its wait is skipped
    # (a zero sleep still yields the GIL). Still waiting for a transfer (or a prefill
    # engine waiting for its KV to be read), vLLM's pacing is kept, so empty steps do not
    # spin; a step that ran the model does not sleep at all.
    assert engine_core_sleeps("sleep", [KV_ARRIVED, STILL_WAITING, MODEL_RAN]) == [
        [0], [VLLM_EMPTY_STEP_SLEEP_S], []]
    # Without the setting, or told to keep vLLM's wait, the plugin leaves the loop as is.
    assert engine_core_sleeps(None, [KV_ARRIVED]) == [[VLLM_EMPTY_STEP_SLEEP_S]]
    assert engine_core_sleeps("sleep", [KV_ARRIVED], empty_step_sleep="vllm") == [
        [VLLM_EMPTY_STEP_SLEEP_S]]
