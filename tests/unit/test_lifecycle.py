"""The router's request accounting (router/lifecycle.py) with a fake gate and observer.

What the lifecycle promises: a refusal is kept and raised, counted only once the router
answers it (with its own status); a client gone while queued is counted cancelled and
holds nothing; every admission ticket (one per prompt of a batch) goes back exactly once;
each engine output's new tokens are timed; the first outcome recorded is the one counted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from cluster import metrics as m
from router import timing_metrics
from router.errors import APIError
from router.lifecycle import RequestLifecycle
from router.timing_metrics import RequestObserver
from tests.fake_observer import RecordingObserver
from tests.fake_recorder import FakeRecorder
from tests.fake_time import FakeClock


class FakeGate:
    """Admits or refuses, and counts the tickets it has out."""

    def __init__(self, refusal: APIError | None = None, block: bool = False):
        self.refusal = refusal
        self.block = block
        self.acquired: list[tuple[int, str, int]] = []
        self.out: list[int] = []
        self.released: list[int] = []

    async def acquire(self, cost: int, key: str = "anonymous", prompt_tokens: int = 0) -> int:
        self.acquired.append((cost, key, prompt_tokens))
        if self.block:
            await asyncio.Event().wait()  # queued until cancelled
        if self.refusal is not None:
            raise self.refusal
        ticket = len(self.out) + 1
        self.out.append(ticket)
        return ticket

    def release(self, ticket: int) -> None:
        self.released.append(ticket)


@dataclass
class Choice:
    """What the lifecycle reads of vLLM's ``CompletionOutput``: its new token ids."""

    token_ids: list[int]
    index: int = 0


@dataclass
class Output:
    """What the lifecycle reads of a vLLM ``RequestOutput`` delta: its choices."""

    outputs: list[Choice] = field(default_factory=list)
    finished: bool = False


REFUSAL = APIError(429, "full", "overloaded_error", code="queue_full",
                   headers={"Retry-After": "1"})


def lifecycle(gate=None, observer=None):
    observer = observer or RecordingObserver()
    return RequestLifecycle(gate or FakeGate(), "cmpl-req1", observer, "client-a"), observer


def run(coroutine):
    return asyncio.run(coroutine)


def test_admission_asks_the_gate_for_the_cost_in_the_clients_queue_and_times_dispatch():
    gate = FakeGate()
    cycle, observer = lifecycle(gate)
    ticket = run(cycle.admit(100, 10, "disaggregated"))
    assert ticket == 1 and gate.acquired == [(100, "client-a", 10)]
    assert observer.routes == [("disaggregated", 10)] and observer.marks.count("dispatched") == 1
    assert observer.outcomes == [] and cycle.failure is None


def test_a_refusal_is_kept_and_raised_and_counted_nowhere_until_the_router_answers():
    gate = FakeGate(refusal=REFUSAL)
    cycle, observer = lifecycle(gate)
    with pytest.raises(APIError) as raised:
        run(cycle.admit(100, 10, "decode_local"))
    assert raised.value is REFUSAL and cycle.failure is REFUSAL
    assert observer.outcomes == [] and observer.marks.count("dispatched") == 0
    assert observer.routes == [("decode_local", 10)]  # the refusal is counted on its path
    assert gate.out == [] and gate.released == []
    cycle.finish("rejected")                           # the router answers the 429
    assert observer.outcomes == ["rejected"]


def test_a_refusal_reaches_the_metrics_once_with_the_routers_outcome(monkeypatch):
    recorder = FakeRecorder()
    monkeypatch.setattr(timing_metrics, "RECORDER", recorder)
    observer = RequestObserver("chat", "v1", arrival=0.0, clock=FakeClock())
    cycle, _ = lifecycle(FakeGate(refusal=REFUSAL), observer)
    with pytest.raises(APIError):
        run(cycle.admit(100, 10, "decode_local"))
    assert recorder.counted == []                  # not counted by the refusal itself
    cycle.finish(m.outcome_for_status(REFUSAL.status))
    cycle.finish("cancelled")                      # e.g. the stream's own end: ignored
    assert recorder.requests() == [{"model": "chat", "version": "v1",
                                     "path": "decode_local", "outcome": "rejected"}]


def test_a_client_gone_while_queued_is_counted_cancelled_and_holds_nothing():
    gate = FakeGate(block=True)
    cycle, observer = lifecycle(gate)

    async def scenario():
        waiter = asyncio.ensure_future(cycle.admit(100, 10, "disaggregated"))
        await asyncio.sleep(0)  # let it reach the gate
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    run(scenario())
    assert observer.outcomes == ["cancelled"] and observer.marks.count("dispatched") == 0
    assert gate.out == [] and cycle.failure is None  # a cancellation is not a failure


def test_a_ticket_goes_back_once_however_often_it_is_released():
    gate = FakeGate()
    cycle, _ = lifecycle(gate)
    ticket = run(cycle.admit(100, 10, "disaggregated"))
    cycle.release(ticket)
    cycle.release(ticket)  # a second release (e.g. an error path after the normal one)
    assert gate.released == [ticket]


def test_a_ticket_this_request_does_not_hold_is_not_released():
    gate = FakeGate()
    cycle, _ = lifecycle(gate)
    run(cycle.admit(100, 10, "disaggregated"))
    cycle.release(99)
    assert gate.released == []


def test_each_prompt_of_a_batch_takes_its_own_ticket_and_gives_it_back_once():
    gate = FakeGate()
    cycle, observer = lifecycle(gate)

    async def two_prompts():
        return await asyncio.gather(cycle.admit(40, 8, "decode_local"),
                                    cycle.admit(90, 30, "disaggregated"))

    first, second = run(two_prompts())
    assert first != second and sorted(gate.out) == sorted([first, second])
    assert sorted(observer.routes) == [("decode_local", 8), ("disaggregated", 30)]
    assert observer.marks.count("dispatched") == 2
    cycle.release(second)
    assert gate.released == [second]      # the other prompt still holds its budget
    cycle.release(first)
    cycle.release(second)
    assert gate.released == [second, first]


def test_the_prompts_of_a_batch_add_up_in_the_metrics(monkeypatch):
    recorder = FakeRecorder()
    monkeypatch.setattr(timing_metrics, "RECORDER", recorder)
    observer = RequestObserver("m", "v1", arrival=0.0, clock=FakeClock())
    cycle, _ = lifecycle(FakeGate(), observer)

    async def two_prompts():
        await cycle.admit(40, 8, "decode_local")
        await cycle.admit(90, 30, "decode_local")

    run(two_prompts())
    cycle.finish("ok")
    prompt_tokens = [value for name, _, value in recorder.counted
                     if name == m.PROMPT_TOKENS.name]
    assert prompt_tokens == [38]


def test_observe_times_the_new_tokens_of_every_choice():
    cycle, observer = lifecycle()
    cycle.observe(Output([Choice([5, 6], 0), Choice([7], 1)]))
    cycle.observe(Output([Choice([], 0)]))              # a delta with no new token
    cycle.observe(Output([Choice([8], 1)], finished=True))
    assert observer.token_counts == [3, 0, 1]


def test_observe_feeds_the_request_timer_at_the_time_tokens_arrive():
    clock = FakeClock(now=10.0)
    observer = RequestObserver("m", "v1", arrival=10.0, clock=clock)
    cycle, _ = lifecycle(FakeGate(), observer)
    clock.advance(0.5)
    run(cycle.admit(100, 10, "disaggregated"))
    clock.advance(0.25)
    cycle.observe(Output([Choice([1])]))
    clock.advance(0.5)
    cycle.observe(Output([Choice([2, 3])], finished=True))
    timer = observer.timer
    assert timer.queue_time == pytest.approx(0.5)
    assert timer.ttft == pytest.approx(0.75)
    assert timer.tokens == 3
    assert timer.inter_token_gaps == pytest.approx([0.25, 0.25])


def test_the_first_failure_is_the_one_kept():
    cycle, _ = lifecycle()
    first, second = ConnectionError("decode replica died"), APIError(503, "gone", "x")
    cycle.record_failure(first)
    cycle.record_failure(second)
    assert cycle.failure is first


def test_the_first_outcome_is_the_one_counted(monkeypatch):
    recorder = FakeRecorder()
    monkeypatch.setattr(timing_metrics, "RECORDER", recorder)
    observer = RequestObserver("m", "v1", arrival=0.0, clock=FakeClock())
    cycle, _ = lifecycle(FakeGate(), observer)
    run(cycle.admit(100, 10, "decode_local"))
    cycle.finish("failed")
    cycle.finish("ok")
    cycle.finish("cancelled")
    assert [tags["outcome"] for tags in recorder.requests()] == ["failed"]


def test_a_fault_on_the_way_reaches_the_canary_sample_not_the_outcome(monkeypatch):
    recorder = FakeRecorder()
    monkeypatch.setattr(timing_metrics, "RECORDER", recorder)
    samples = []
    observer = RequestObserver("m", "v1", arrival=0.0, clock=FakeClock(),
                               on_finish=lambda *sample: samples.append(sample))
    cycle, _ = lifecycle(FakeGate(), observer)
    cycle.faulted()   # a decode replica died; the stream was migrated
    cycle.finish("ok")
    (model, version, outcome, _, faulted), = samples
    assert (model, version, outcome, faulted) == ("m", "v1", "ok", True)
    outcomes = [tags["outcome"] for name, tags, _ in recorder.counted
                if name == m.REQUESTS.name]
    assert outcomes == ["ok"]  # the client got its whole answer
