"""How a replica tells the router its engine died (cluster/engine/host.py,
``generate``): killed by a signal, the requests in it fail over as before (vLLM's
``EngineDeadError``); ended of an error of its own, each request learns it was in a crash
and with how many others (``EngineCrashed``), so that the router does not carry a request
that fails engines from replica to replica (router/retry.py, quarantine). The engine
process here is a real process (killed, or ended with an error's exit status) under a
stand-in for vLLM's ``AsyncLLM`` whose requests fail as vLLM fails them once its core is
gone."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
from types import SimpleNamespace

import psutil
import pytest

pytest.importorskip("vllm")

from vllm.v1.engine.exceptions import EngineDeadError

from cluster.engine.host import EngineHost
from cluster.engine.messages import EngineCrashed, EngineRequest
from cluster.engine.stats import EngineStats
from tests.fake_time import eventually

# Forked: the stand-ins run no library code, and a spawned child would import vLLM again.
CONTEXT = multiprocessing.get_context("fork")


def _engine_core(ready) -> None:
    ready.send("up")
    signal.pause()  # until killed


def _crash_with_an_error() -> None:
    sys.exit(1)  # what an uncaught exception in vLLM's engine core process ends with


class DyingEngine:
    """``AsyncLLM`` as its requests see it: each waits until the core is gone, then fails
    with ``EngineDeadError``."""

    def __init__(self, core) -> None:
        self.engine_core = SimpleNamespace(resources=SimpleNamespace(
            engine_manager=SimpleNamespace(processes=[core])))
        self.started = 0
        self._core = core
        self._gone: asyncio.Future | None = None  # the core's exit, awaited once

    @property
    def errored(self) -> bool:  # as AsyncLLM's, once its output handler saw the core go
        return self._core.exitcode is not None

    async def _core_exit(self, timeout_s: float) -> None:
        # By its exit status, not its sentinel (``join``): a worker forked under the core
        # inherits the sentinel's pipe and keeps it open after the core is gone.
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._core.exitcode is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)

    async def generate(self, prompt, params, request_id, **kwargs):
        self.started += 1
        if self._gone is None:
            self._gone = asyncio.ensure_future(self._core_exit(30))
        await asyncio.shield(self._gone)
        raise EngineDeadError()
        yield  # an async generator, as vLLM's


def request(request_id: str) -> EngineRequest:
    return EngineRequest(request_id, (1, 2, 3), SimpleNamespace(max_tokens=4, n=1))


async def _requests_in(host: EngineHost, engine: DyingEngine, count: int,
                       kill) -> list[BaseException]:
    async def run(request_id: str) -> BaseException:
        try:
            async for _ in host.generate(request(request_id), params=None):
                pass
        except Exception as error:  # what the replica would raise to the router
            return error
        raise AssertionError("the request ended without an error")

    tasks = [asyncio.ensure_future(run(f"r{i}")) for i in range(count)]
    await eventually(lambda: engine.started == count)
    kill()
    return await asyncio.wait_for(asyncio.gather(*tasks), 30)


def dying_engine(target, *args) -> tuple[DyingEngine, EngineHost]:
    core = CONTEXT.Process(target=target, args=args)
    core.start()
    engine = DyingEngine(core)
    return engine, EngineHost(engine, EngineStats(role="decode", engine_id="e0"))


@pytest.mark.parametrize("count", [1, 3])
def test_an_engine_killed_by_a_signal_fails_its_requests_over_as_before(count):
    parent, child = CONTEXT.Pipe()
    engine, host = dying_engine(_engine_core, child)
    assert parent.poll(60), "the engine core stand-in never started"
    errors = asyncio.run(_requests_in(host, engine, count,
                                      lambda: os.kill(engine._core.pid, signal.SIGKILL)))
    assert all(type(error) is EngineDeadError for error in errors), errors
    assert engine._core.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("count", [1, 3])
def test_an_engine_that_died_of_its_own_error_tells_each_request_how_many_were_in_it(count):
    ready = CONTEXT.Event()
    engine, host = dying_engine(_wait_then_crash, ready)
    errors = asyncio.run(_requests_in(host, engine, count, ready.set))
    assert all(isinstance(error, EngineCrashed) for error in errors), errors
    assert sorted(error.request_id for error in errors) == [f"r{i}" for i in range(count)]
    assert {error.requests_in_engine for error in errors} == {count}
    assert engine._core.exitcode == 1
    assert host._in_flight == 0


def test_a_request_that_arrives_once_its_engine_died_is_not_blamed_for_the_death():
    """A request sent to a replica whose engine already died of an error (the poison that
    ended it was answered moments before) fails as after a kill: the router retries it on
    a live replica. Blamed as one of the crash's requests, an ordinary request was
    quarantined and answered 500 while the replacement started."""
    ready = CONTEXT.Event()
    engine, host = dying_engine(_wait_then_crash, ready)
    (poison,) = asyncio.run(_requests_in(host, engine, 1, ready.set))
    assert isinstance(poison, EngineCrashed) and poison.requests_in_engine == 1

    async def late() -> BaseException:
        with pytest.raises(EngineDeadError) as raised:
            async for _ in host.generate(request("late"), params=None):
                pass
        return raised.value

    assert type(asyncio.run(late())) is EngineDeadError
    assert engine.started == 1 and host._in_flight == 0


def _wait_then_crash(ready) -> None:
    ready.wait(60)
    _crash_with_an_error()


def _core_with_a_worker(report, crash) -> None:
    """An engine core with a worker under it that outlives it, as vLLM's CPU worker (which
    holds the NIXL side-channel port) can outlive a core that died of its own error."""
    worker = os.fork()
    if worker == 0:
        while True:
            signal.pause()
    report.send(worker)
    crash.wait(60)
    os._exit(1)


def test_a_dead_engines_leftover_worker_is_killed():
    parent, child = CONTEXT.Pipe()
    crash = CONTEXT.Event()
    core = CONTEXT.Process(target=_core_with_a_worker, args=(child, crash))
    core.start()
    assert parent.poll(60), "the engine core stand-in never started"
    worker = psutil.Process(parent.recv())
    engine = DyingEngine(core)
    # recorded as the replica records a real engine's: once it is up, workers and all
    host = EngineHost(engine, EngineStats(role="decode", engine_id="e0"))
    try:
        errors = asyncio.run(_requests_in(host, engine, 1, crash.set))
        assert [type(error) for error in errors] == [EngineCrashed], errors
        assert core.exitcode == 1
        assert psutil.wait_procs([worker], timeout=10)[1] == [] or \
            worker.status() == psutil.STATUS_ZOMBIE, "the core's worker outlived the engine"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
