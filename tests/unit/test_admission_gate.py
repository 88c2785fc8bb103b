"""The admission gate (router/admission_gate.py) under a fake clock: it applies the
controller's decisions, the 503s included, and its books always balance."""

from __future__ import annotations

import asyncio
import random

import pytest

from cluster.config import AdmissionConfig
from router.admission_gate import AdmissionGate
from router.errors import APIError
from tests.fake_time import FakeClock, eventually, settled

ZERO = {"tokens_in_flight": 0, "long_tokens_in_flight": 0, "running": 0, "queued": 0}


def gate_with(clock: FakeClock, **config) -> AdmissionGate:
    # One key may hold the whole budget running unless a test says otherwise: most tests
    # here are about the budget, the queue and the lanes.
    settings = {"token_budget": 100, "max_queue": 10, "max_wait_s": 5, "retry_after_s": 3,
                "max_running_share_per_key": None, **config}
    return AdmissionGate(AdmissionConfig(**settings), clock=clock, sleep=clock.sleep)


def books(gate: AdmissionGate) -> dict[str, int]:
    """The snapshot without its constant fields."""
    return {k: v for k, v in gate.snapshot().items() if k in ZERO}


def queue(gate: AdmissionGate, cost: int, key: str = "anonymous",
          prompt_tokens: int = 0) -> asyncio.Task:
    """Start an ``acquire`` that will wait; the caller checks that it queued."""
    return asyncio.ensure_future(gate.acquire(cost, key, prompt_tokens=prompt_tokens))


async def queued(gate: AdmissionGate, count: int) -> None:
    await eventually(lambda: gate.snapshot()["queued"] == count)


def test_admits_at_once_within_the_budget_and_takes_the_tokens_back():
    async def scenario():
        gate = gate_with(FakeClock())
        first = await gate.acquire(60)
        second = await gate.acquire(40, key="other")
        assert books(gate) == {**ZERO, "tokens_in_flight": 100, "running": 2}
        gate.release(first)
        gate.release(second)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_waiter_is_admitted_when_the_budget_frees():
    async def scenario():
        clock = FakeClock()
        gate = gate_with(clock)
        holder = await gate.acquire(100)
        waiter = queue(gate, 50)
        await queued(gate, 1)
        assert not waiter.done()
        gate.release(holder)
        ticket = await settled(waiter)
        assert books(gate) == {**ZERO, "tokens_in_flight": 50, "running": 1}
        gate.release(ticket)
        assert books(gate) == ZERO
        clock.advance(5)   # the timer wakes at the old deadline, finds no one and stops
        await eventually(lambda: clock.wake_times == [])

    asyncio.run(scenario())


def test_a_full_queue_answers_429_queue_full_at_once():
    async def scenario():
        gate = gate_with(FakeClock(), max_queue=1)
        holder = await gate.acquire(100)
        waiter = queue(gate, 50)
        await queued(gate, 1)
        with pytest.raises(APIError) as refused:
            await gate.acquire(10, key="other")
        error = refused.value
        assert (error.status, error.code, error.type) == (429, "queue_full", "overloaded_error")
        assert error.headers == {"Retry-After": "3"}
        assert error.message == "the server is at capacity and its queue is full; retry later"
        gate.release(holder)
        gate.release(await settled(waiter))
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_request_over_the_whole_budget_is_answered_400_saying_why_and_holds_nothing():
    async def scenario():
        gate = gate_with(FakeClock())
        with pytest.raises(APIError) as refused:
            await gate.acquire(101)
        error = refused.value
        assert (error.status, error.code, error.param) == (400, "invalid_value", "max_tokens")
        assert "101 tokens" in error.message and "(100)" in error.message
        assert books(gate) == ZERO
        gate.release(await gate.acquire(100))  # the whole budget is still one request's
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_waiter_gets_503_exactly_when_the_policy_deadline_passes():
    async def scenario():
        clock = FakeClock()
        gate = gate_with(clock)
        holder = await gate.acquire(100)
        clock.advance_to(1)
        waiter = queue(gate, 50)          # arrives at 1: its deadline is 1 + max_wait_s = 6
        await queued(gate, 1)
        await eventually(lambda: clock.wake_times == [6])   # the gate sleeps to the deadline
        clock.advance_to(5.999)
        assert not waiter.done() and clock.wake_times == [6]
        clock.advance_to(6)
        with pytest.raises(APIError) as refused:
            await settled(waiter)
        error = refused.value
        assert (error.status, error.code, error.type) == (503, "queue_timeout",
                                                          "overloaded_error")
        assert error.headers == {"Retry-After": "3"}
        assert error.message == "waited 5s for capacity; retry later"
        assert books(gate) == {**ZERO, "tokens_in_flight": 100, "running": 1}
        gate.release(holder)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_the_timer_refuses_only_the_waiters_the_policy_expired():
    async def scenario():
        clock = FakeClock()
        gate = gate_with(clock)
        holder = await gate.acquire(100)
        early = queue(gate, 60, key="a")          # deadline 5
        await queued(gate, 1)
        clock.advance_to(2)
        late = queue(gate, 60, key="b")           # deadline 7
        await queued(gate, 2)
        clock.advance_to(3)
        gate.release(holder)                      # early fits now; late does not beside it
        early_ticket = await settled(early)
        clock.advance_to(5)                       # early's deadline: it no longer waits
        await eventually(lambda: clock.wake_times == [7])   # so the timer sleeps on to late's
        assert not late.done()
        clock.advance_to(7)
        with pytest.raises(APIError, match="waited 5s"):
            await settled(late)
        gate.release(early_ticket)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_an_expired_head_lets_in_the_waiter_it_held_back():
    async def scenario():
        clock = FakeClock()
        gate = gate_with(clock)
        holder = await gate.acquire(90)
        head = queue(gate, 50, key="k")           # does not fit beside 90: deadline 5
        await queued(gate, 1)
        clock.advance_to(1)
        behind = queue(gate, 5, key="k")          # fits, but FIFO within its key
        await queued(gate, 2)
        clock.advance_to(5)
        with pytest.raises(APIError, match="waited 5s"):
            await settled(head)
        ticket = await settled(behind)
        assert books(gate) == {**ZERO, "tokens_in_flight": 95, "running": 2}
        gate.release(ticket)
        gate.release(holder)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_keys_take_turns_and_a_flooding_key_fills_only_its_own_queue():
    async def scenario():
        gate = gate_with(FakeClock(), max_queue_per_key=2)
        holder = await gate.acquire(100, key="flood")
        flood = [queue(gate, 50, key="flood") for _ in range(2)]
        await queued(gate, 2)
        with pytest.raises(APIError) as refused:
            await gate.acquire(50, key="flood")   # its share of the queue is used up
        assert refused.value.status == 429
        quiet = queue(gate, 50, key="quiet")      # another key still queues
        await queued(gate, 3)
        gate.release(holder)                      # two fit: one per key, not flood twice
        first_flood, first_quiet = await settled(flood[0]), await settled(quiet)
        assert books(gate)["queued"] == 1 and not flood[1].done()
        gate.release(first_flood)
        second_flood = await settled(flood[1])
        for ticket in (first_quiet, second_flood):
            gate.release(ticket)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_long_prompt_waits_in_its_lane_without_holding_back_short_ones():
    async def scenario():
        # long_lane_share 0.6 of 100: the long lane may hold 60 tokens at once
        gate = gate_with(FakeClock(), long_prompt_tokens=1000, long_lane_share=0.6)
        first_long = await gate.acquire(50, key="a", prompt_tokens=1000)
        second_long = queue(gate, 40, key="a", prompt_tokens=2000)   # 90 > 60 in the lane
        await queued(gate, 1)
        short = await gate.acquire(30, key="a", prompt_tokens=10)   # same key, short lane
        assert books(gate) == {"tokens_in_flight": 80, "long_tokens_in_flight": 50,
                               "running": 2, "queued": 1}
        gate.release(first_long)
        for ticket in (await settled(second_long), short):
            gate.release(ticket)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_client_that_leaves_while_waiting_frees_its_place_in_the_queue():
    async def scenario():
        gate = gate_with(FakeClock(), max_queue=1)
        holder = await gate.acquire(100)
        leaving = queue(gate, 50)
        await queued(gate, 1)
        with pytest.raises(APIError):
            await gate.acquire(50)                # the queue is full...
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settled(leaving)
        assert books(gate) == {**ZERO, "tokens_in_flight": 100, "running": 1}
        staying = queue(gate, 50)                 # ...and has room again
        await queued(gate, 1)
        gate.release(holder)
        gate.release(await settled(staying))
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_client_that_leaves_unblocks_the_waiter_behind_it():
    async def scenario():
        gate = gate_with(FakeClock())
        holder = await gate.acquire(60)
        head = queue(gate, 50, key="k")           # does not fit beside 60
        behind = queue(gate, 10, key="k")         # would fit, but waits behind its key's head
        await queued(gate, 2)
        head.cancel()
        ticket = await settled(behind)
        assert books(gate) == {**ZERO, "tokens_in_flight": 70, "running": 2}
        for t in (ticket, holder):
            gate.release(t)
        assert books(gate) == ZERO

    asyncio.run(scenario())


def test_a_client_admitted_in_the_instant_it_leaves_gives_its_tokens_back():
    async def scenario():
        gate = gate_with(FakeClock())
        holder = await gate.acquire(100)
        waiter = queue(gate, 50)
        await queued(gate, 1)
        gate.release(holder)      # admits the waiter: its verdict is set...
        waiter.cancel()           # ...but the client is gone before it runs again
        with pytest.raises(asyncio.CancelledError):
            await settled(waiter)
        assert books(gate) == ZERO

    asyncio.run(scenario())


@pytest.mark.parametrize("seed", range(25))
def test_the_books_balance_whatever_mix_of_admits_timeouts_and_departures(seed):
    """Random requests, releases, departures and clock moves; at the end every request has
    ended one way, and the budget and the queue are back to zero."""
    rng = random.Random(seed)

    async def scenario():
        clock = FakeClock()
        gate = gate_with(clock, max_queue=6, max_queue_per_key=3)
        tasks: list[asyncio.Task] = []
        released: set[int] = set()
        for _ in range(150):
            action = rng.choice(["acquire", "acquire", "release", "cancel", "advance"])
            if action == "acquire":
                tasks.append(queue(gate, rng.randint(1, 120), key=rng.choice("abc")))
            elif action == "release":
                admitted = [t.result() for t in tasks if t.done() and not t.cancelled()
                            and t.exception() is None and t.result() not in released]
                if admitted:
                    ticket = rng.choice(admitted)
                    gate.release(ticket)
                    released.add(ticket)
            elif action == "cancel":
                pending = [t for t in tasks if not t.done()]
                if pending:
                    rng.choice(pending).cancel()
            else:
                clock.advance(rng.uniform(0, 3))
            await asyncio.sleep(0)
            held = books(gate)
            assert held["tokens_in_flight"] <= 100
            assert held["queued"] <= 6
        # once every request still pending waits in the queue, all their deadlines pass
        await eventually(lambda: books(gate)["queued"] == sum(not t.done() for t in tasks))
        clock.advance(5)
        await eventually(lambda: all(t.done() for t in tasks))
        for task in tasks:
            if not task.cancelled() and task.exception() is None \
                    and task.result() not in released:
                gate.release(task.result())
        assert books(gate) == ZERO
        outcomes = {_outcome(t) for t in tasks}
        assert outcomes <= {"admitted", 400, 429, 503, "cancelled"}

    asyncio.run(scenario())


def _outcome(task: asyncio.Task) -> str | int:
    if task.cancelled():
        return "cancelled"
    error = task.exception()
    return "admitted" if error is None else error.status
