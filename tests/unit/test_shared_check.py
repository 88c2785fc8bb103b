"""/health's one shared check (router/shared_check.py)."""

from __future__ import annotations

import asyncio

import pytest

from router.shared_check import SharedCheck


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_probes_at_once_share_one_check_and_its_answer_serves_until_stale():
    clock, calls = Clock(), []

    async def check() -> list[str]:
        calls.append(clock.now)
        await asyncio.sleep(0)  # a check that takes a turn of the loop
        return ["decode-v1"]

    async def probes() -> None:
        shared = SharedCheck(check, fresh_s=1.0, clock=clock)
        answers = await asyncio.gather(*(shared.result() for _ in range(50)))
        assert answers == [["decode-v1"]] * 50 and len(calls) == 1
        clock.now = 0.9
        assert await shared.result() == ["decode-v1"] and len(calls) == 1
        clock.now = 1.5
        await shared.result()
        assert len(calls) == 2

    asyncio.run(probes())


def test_a_probe_that_leaves_does_not_end_the_others_check():
    async def probes() -> None:
        started, answer = asyncio.Event(), asyncio.Event()

        async def check() -> str:
            started.set()
            await answer.wait()  # the pools answer only once the first probe has left
            return "ok"

        shared = SharedCheck(check)
        leaving = asyncio.ensure_future(shared.result())
        staying = asyncio.ensure_future(shared.result())
        await asyncio.wait_for(started.wait(), 5)
        leaving.cancel()
        answer.set()
        assert await asyncio.wait_for(staying, 5) == "ok"
        assert leaving.cancelled()

    asyncio.run(probes())


def test_a_failed_check_is_tried_again_by_the_next_probe():
    outcomes = iter([RuntimeError("down"), "ok"])

    async def check() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def probes() -> None:
        shared = SharedCheck(check)
        with pytest.raises(RuntimeError):
            await shared.result()
        assert await shared.result() == "ok"

    asyncio.run(probes())
