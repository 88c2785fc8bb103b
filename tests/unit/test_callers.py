"""Engines abort the requests of a router replica that died (cluster/engine/callers.py).

Liveness is injected: these tests decide which callers are dead, alive or silent.
"""

from __future__ import annotations

import asyncio

from cluster.engine.callers import CallerWatch
from tests.fake_time import eventually

ROUTER_A = ("serve", "SERVE_REPLICA::pdserve#router#a")
ROUTER_B = ("serve", "SERVE_REPLICA::pdserve#router#b")


def watch_with(liveness: dict):
    aborted: list[str] = []
    checked: list = []

    async def abort(request_id: str) -> None:
        aborted.append(request_id)

    async def alive(caller):
        checked.append(caller)
        return liveness[caller]

    return CallerWatch(abort, alive=alive, period_s=0.01), aborted, checked


def test_only_the_requests_of_a_dead_caller_are_aborted():
    async def run():
        watch, aborted, _ = watch_with({ROUTER_A: False, ROUTER_B: True})
        for request_id, caller in (("a1", ROUTER_A), ("b1", ROUTER_B), ("a2", ROUTER_A)):
            watch.track(request_id, caller)
        assert sorted(await watch.check_once()) == ["a1", "a2"]
        assert sorted(aborted) == ["a1", "a2"]
        assert await watch.check_once() == []  # aborted once, then no longer watched

    asyncio.run(run())


def test_a_caller_that_does_not_answer_in_time_is_not_taken_for_dead():
    async def run():
        watch, aborted, _ = watch_with({ROUTER_A: None})
        watch.track("a1", ROUTER_A)
        assert await watch.check_once() == [] and aborted == []

    asyncio.run(run())


def test_finished_and_unnamed_requests_are_not_checked():
    async def run():
        watch, aborted, checked = watch_with({ROUTER_A: False})
        watch.track("a1", ROUTER_A)
        watch.untrack("a1")
        watch.track("local", None)  # no caller named: nothing to watch
        assert await watch.check_once() == [] and checked == [] and aborted == []

    asyncio.run(run())


def test_the_watch_checks_by_itself_while_requests_are_in_flight():
    async def run():
        liveness = {ROUTER_A: True}
        watch, aborted, checked = watch_with(liveness)
        watch.track("a1", ROUTER_A)
        await eventually(lambda: checked)  # the periodic check runs with nobody calling it
        liveness[ROUTER_A] = False
        await eventually(lambda: aborted)
        assert aborted == ["a1"]

    asyncio.run(run())
