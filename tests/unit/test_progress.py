"""Signs of life on a one-piece answer (decode/progress.py)."""

from __future__ import annotations

import asyncio

from cluster.engine.messages import Progress
from decode.progress import with_progress

INTERVAL_S = 0.05


async def slow_answer(ended: list[str], after_s: float = 0.3):
    """An engine's one output after ``after_s``; notes how it ended."""
    try:
        await asyncio.sleep(after_s)
        yield "answer"
        ended.append("finished")
    except asyncio.CancelledError:
        ended.append("cancelled")  # vLLM's generate aborts the request here
        raise


async def run(stalled_s: float) -> list:
    ended: list[str] = []
    items = [item async for item in with_progress(slow_answer(ended), INTERVAL_S,
                                                  lambda: stalled_s)]
    assert ended == ["finished"]
    return items


def test_a_working_engine_sends_progress_until_its_answer_and_the_answer_itself():
    items = asyncio.run(run(stalled_s=0.0))
    assert items[-1] == "answer" and len(items) >= 3
    assert all(isinstance(item, Progress) for item in items[:-1])


def test_an_engine_that_does_not_step_sends_no_progress():
    assert asyncio.run(run(stalled_s=10 * INTERVAL_S)) == ["answer"]


def test_closing_it_while_the_answer_is_awaited_aborts_the_request():
    async def close_after_a_progress() -> list[str]:
        ended: list[str] = []
        stream = with_progress(slow_answer(ended, after_s=30), INTERVAL_S, lambda: 0.0)
        assert isinstance(await anext(stream), Progress)
        await stream.aclose()
        return ended

    assert asyncio.run(asyncio.wait_for(close_after_a_progress(), 10)) == ["cancelled"]
