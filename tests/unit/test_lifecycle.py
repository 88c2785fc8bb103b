"""The router's request accounting (router/lifecycle.py) with a fake gate and observer."""

import asyncio
import json

import pytest

from cluster.engine.messages import TokenChunk
from router.errors import APIError
from router.lifecycle import RequestLifecycle


class FakeGate:
    """Admits or refuses, and counts the tickets it has out."""

    def __init__(self, refusal: APIError | None = None, block: bool = False):
        self.refusal = refusal
        self.block = block
        self.out: list[object] = []
        self.released: list[object] = []

    async def acquire(self, cost: int, key: str = "anonymous", prompt_tokens: int = 0):
        if self.block:
            await asyncio.Event().wait()  # queued until cancelled
        if self.refusal is not None:
            raise self.refusal
        ticket = object()
        self.out.append(ticket)
        return ticket

    def release(self, ticket) -> None:
        self.released.append(ticket)


class FakeObserver:
    def __init__(self):
        self.dispatched_count = 0
        self.chunks = 0
        self.outcomes: list[str] = []

    def dispatched(self):
        self.dispatched_count += 1

    def chunk(self, chunk):
        self.chunks += 1

    def finish(self, outcome):
        self.outcomes.append(outcome)  # the real observer counts only the first


class Stream:
    """An engine stream of ``n`` chunks that remembers whether it was closed."""

    def __init__(self, n: int, fail_after: int | None = None):
        self.n, self.fail_after, self.closed = n, fail_after, False

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        for i in range(self.n):
            if i == self.fail_after:
                raise APIError(503, "engine gone", "server_error")
            yield TokenChunk(f"t{i}", (i,), i + 1, 3, "stop" if i == self.n - 1 else None)

    async def aclose(self):
        self.closed = True


def lifecycle(gate=None):
    observer = FakeObserver()
    return RequestLifecycle(gate or FakeGate(), "req-1", observer), observer


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_refusal_is_the_response_and_is_counted_once():
    gate = FakeGate(refusal=APIError(429, "full", "rate_limit_error", code="queue_full",
                                     headers={"Retry-After": "1"}))
    cycle, observer = lifecycle(gate)
    response = run(cycle.admit(100, "k", 10))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.headers["x-request-id"] == "req-1"
    assert json.loads(response.body)["error"]["code"] == "queue_full"
    assert observer.outcomes == ["rejected"] and observer.dispatched_count == 0
    assert gate.out == []


def test_a_client_gone_while_queued_is_counted_cancelled_and_holds_nothing():
    gate = FakeGate(block=True)
    cycle, observer = lifecycle(gate)

    async def scenario():
        waiter = asyncio.ensure_future(cycle.admit(100, "k", 10))
        await asyncio.sleep(0)  # let it reach the gate
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    run(scenario())
    assert observer.outcomes == ["cancelled"] and gate.out == []


def test_a_stream_read_to_its_end_times_every_chunk_and_gives_the_ticket_back_once():
    gate = FakeGate()
    cycle, observer = lifecycle(gate)
    inner = Stream(3)

    async def scenario():
        assert await cycle.admit(100, "k", 10) is None
        chunks = cycle.observed(inner)
        texts = [chunk.text async for chunk in chunks]
        await chunks.aclose()  # closing again is harmless
        return texts

    assert run(scenario()) == ["t0", "t1", "t2"]
    assert observer.dispatched_count == 1 and observer.chunks == 3
    assert gate.released == gate.out and len(gate.out) == 1
    assert inner.closed


def test_a_stream_closed_early_gives_the_ticket_back_and_closes_the_engine_stream():
    gate = FakeGate()
    cycle, _ = lifecycle(gate)
    inner = Stream(5)

    async def scenario():
        await cycle.admit(100, "k", 10)
        chunks = cycle.observed(inner)
        await anext(chunks)
        await chunks.aclose()

    run(scenario())
    assert gate.released == gate.out and inner.closed


def test_a_failure_before_the_first_token_is_an_error_response_counted_once():
    gate = FakeGate()
    cycle, observer = lifecycle(gate)

    async def scenario():
        await cycle.admit(100, "k", 10)
        chunks = cycle.observed(Stream(3, fail_after=0))
        first, failure = await cycle.attempt(anext(chunks))
        await chunks.aclose()
        return first, failure

    first, failure = run(scenario())
    assert first is None and failure.status_code == 503
    assert observer.outcomes == ["rejected"]
    assert gate.released == gate.out


def test_a_failure_mid_stream_is_reported_for_the_stream_and_counted():
    cycle, observer = lifecycle()
    error = cycle.stream_failure(APIError(503, "engine gone", "server_error"))
    cycle.finish("cancelled")  # the stream's own finally: the first outcome stands
    assert error.status == 503
    assert observer.outcomes[0] == "rejected"


def test_a_cancelled_step_is_counted_cancelled_and_propagates():
    cycle, observer = lifecycle()

    async def cancelled():
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        run(cycle.attempt(cancelled()))
    assert observer.outcomes == ["cancelled"]
