"""Signs of life on a one-piece answer (decode/progress.py)."""

from __future__ import annotations

import asyncio

from cluster.engine.messages import Progress
from decode.progress import with_progress

INTERVAL_S = 0.05


async def slow_answer(ended: list[str], after_s: float = 0.3,
                      release: asyncio.Event | None = None):
    """An engine's one output, once ``release`` is set (else after ``after_s``); notes
    how it ended."""
    try:
        if release is not None:
            await asyncio.wait_for(release.wait(), 10)
        else:
            await asyncio.sleep(after_s)
        yield "answer"
        ended.append("finished")
    except asyncio.CancelledError:
        ended.append("cancelled")  # vLLM's generate aborts the request here
        raise


async def run(stalled_s: float, progress_before_answer: int | None = None) -> list:
    """What ``with_progress`` yields; the answer comes once ``progress_before_answer``
    signs of life arrived (None: after a fixed time, for an engine that sends none)."""
    ended: list[str] = []
    release = asyncio.Event() if progress_before_answer is not None else None
    items = []
    async for item in with_progress(slow_answer(ended, release=release), INTERVAL_S,
                                    lambda: stalled_s):
        items.append(item)
        if release is not None and len(items) == progress_before_answer:
            release.set()
    assert ended == ["finished"]
    return items


def test_a_working_engine_sends_progress_until_its_answer_and_the_answer_itself():
    items = asyncio.run(run(stalled_s=0.0, progress_before_answer=2))
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
