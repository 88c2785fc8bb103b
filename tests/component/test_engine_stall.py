"""A hung engine's replica (cluster/engine/host.py, ``check_health``): an engine that holds
requests and has not stepped for ``engine.stall_timeout_s`` has its process tree killed,
stopped processes included, and the health check fails; an engine that steps, or holds
nothing, is left alone. The engine processes here are real processes (a parent with a
child, as vLLM's EngineCore with its worker) under a stand-in for vLLM's ``AsyncLLM``."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import time
import types

import psutil
import pytest

from cluster.engine.host import EngineHost
from cluster.engine.stall import StepWatch
from cluster.engine.stats import EngineStats


def _worker() -> None:
    signal.pause()  # until killed


def _engine_core(ready) -> None:
    child = multiprocessing.get_context("spawn").Process(target=_worker, daemon=False)
    child.start()
    ready.send(child.pid)
    signal.pause()  # until killed


@pytest.fixture
def engine_core():
    """A running 'EngineCore' with one child: the process object and both pids."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    core = ctx.Process(target=_engine_core, args=(child,))
    core.start()
    assert parent.poll(60), "the engine core stand-in never started its worker"
    pids = [core.pid, parent.recv()]
    yield core, pids
    for pid in pids:  # whatever the test left running
        try:
            process = psutil.Process(pid)
            process.resume()
            process.kill()
        except psutil.NoSuchProcess:
            pass
    core.join(30)


def host_over(core, steps: StepWatch, stall_timeout_s: float | None) -> EngineHost:
    checked = []

    async def check_health() -> None:
        checked.append(True)

    engine = types.SimpleNamespace(
        engine_core=types.SimpleNamespace(resources=types.SimpleNamespace(
            engine_manager=types.SimpleNamespace(processes=[core]))),
        check_health=check_health, checked=checked,
        errored=False)  # AsyncLLM's: its core has not died (its stall is the replica's to find)
    return EngineHost(engine, EngineStats(role="decode", engine_id="e0"), steps=steps,
                      stall_timeout_s=stall_timeout_s)


def _existing(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(pid))
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_stopped_engine_holding_requests_is_killed_and_the_check_fails(engine_core):
    core, pids = engine_core
    os.kill(core.pid, signal.SIGSTOP)  # hung: only SIGKILL ends it now
    steps = StepWatch()
    steps.stepped(time.monotonic() - 90, has_requests=True)  # its last step, 90 s ago
    host = host_over(core, steps, stall_timeout_s=60)
    with pytest.raises(RuntimeError, match="engine hung: no step for 9"):
        asyncio.run(host.check_health())
    core.join(30)
    _, survivors = psutil.wait_procs(_existing(pids), timeout=30)
    assert not [process for process in survivors if alive(process.pid)], \
        "the engine core or its worker survived"
    # Serve asks again until it replaces the replica: the check keeps failing, once killed
    with pytest.raises(RuntimeError, match="hung and killed"):
        asyncio.run(host.check_health())


def test_an_engine_that_steps_or_holds_nothing_is_left_alone(engine_core):
    core, pids = engine_core
    now = time.monotonic()
    stepping, idle, unwatched = StepWatch(), StepWatch(), StepWatch()
    stepping.stepped(now - 1, has_requests=True)       # stepped a second ago
    idle.stepped(now - 3_600, has_requests=False)      # idle for an hour
    unwatched.stepped(now - 3_600, has_requests=True)  # no limit set
    for steps, limit in ((stepping, 60), (idle, 60), (unwatched, None)):
        host = host_over(core, steps, stall_timeout_s=limit)
        asyncio.run(host.check_health())
        assert host._engine.checked == [True]  # vLLM's own check still asked
    assert all(alive(pid) for pid in pids)
