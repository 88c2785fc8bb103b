"""The router's admission gate: applies ``AdmissionController`` decisions with asyncio.

``acquire`` returns a ticket once the request may run (or raises the 429/503 ``APIError``
to answer); ``release`` returns the ticket's tokens when the request ends, waking the
waiters it lets in.

The gate decides nothing itself. The controller admits, queues or refuses; one timer task
sleeps until the controller's next deadline and refuses exactly the waiters it expires.
The gate maps those decisions to HTTP: a full queue is 429 ``queue_full``, an expired wait
503 ``queue_timeout``, both with a Retry-After.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable

from cluster.config import AdmissionConfig
from router.admission import ANONYMOUS, AdmissionController, AdmissionPolicy, Ticket
from router.errors import APIError, bad_request


def overloaded(status: int, retry_after_s: int, message: str, code: str) -> APIError:
    return APIError(status, message, "overloaded_error", None, code,
                    headers={"Retry-After": str(retry_after_s)})


class AdmissionGate:
    """One router replica's admission control, applied to the requests waiting on it.

    ``clock`` and ``sleep`` are injectable so that a test drives time; they must agree (to
    reach a deadline on ``clock`` the gate sleeps ``deadline - clock()``).
    """

    def __init__(self, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._controller = AdmissionController(AdmissionPolicy.from_config(config))
        self._long_prompt_tokens = config.long_prompt_tokens
        self._policy = self._controller.policy
        self._clock = clock
        self._sleep = sleep
        self._ids = itertools.count()
        self._waiters: dict[Ticket, asyncio.Future[bool]] = {}  # verdict: admitted or not
        self._timer: asyncio.Task | None = None

    async def acquire(self, cost: int, key: str = ANONYMOUS, prompt_tokens: int = 0) -> Ticket:
        """Wait for admission in ``key``'s queue; raise the 429/503 answer if refused.

        Prompts of ``long_prompt_tokens`` or more wait in the key's long lane.
        """
        ticket = next(self._ids)
        long = (self._long_prompt_tokens is not None
                and prompt_tokens >= self._long_prompt_tokens)
        decision = self._controller.request(ticket, cost, self._clock(), key, long)
        if decision.action == "admit":
            return ticket
        if decision.action == "too_large":
            raise bad_request(
                f"the request needs {cost} tokens of KV cache (its prompt, plus max_tokens "
                f"for each of its n answers), more than this server runs at once "
                f"({self._policy.token_budget}): lower max_tokens or n", "max_tokens",
                "invalid_value")
        if decision.action == "reject":
            raise overloaded(429, self._policy.retry_after_s,
                             "the server is at capacity and its queue is full; retry later",
                             "queue_full")
        if not await self._wait(ticket):
            raise overloaded(503, self._policy.retry_after_s,
                             f"waited {self._policy.max_wait_s:g}s for capacity; retry later",
                             "queue_timeout")
        return ticket

    def release(self, ticket: Ticket) -> None:
        """The request ended: its tokens go back, admitting the waiters that now fit."""
        self._settle(self._controller.release(ticket), admitted=True)

    def snapshot(self) -> dict[str, int]:
        """Tokens in flight, running and queued requests of this router replica."""
        return self._controller.snapshot()

    async def _wait(self, ticket: Ticket) -> bool:
        """Wait in the queue for the controller's verdict: True admitted, False expired."""
        verdict: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = verdict
        self._arm_timer()
        try:
            return await verdict
        except asyncio.CancelledError:  # the client went away while waiting
            if not self._leave(ticket):
                # admitted meanwhile: give the tokens back (refused meanwhile: a no-op)
                self.release(ticket)
            raise
        finally:
            self._waiters.pop(ticket, None)

    def _arm_timer(self) -> None:
        # One timer per gate is enough: with one max_wait_s and a clock that only goes
        # forward, a new waiter's deadline is never earlier than the one the timer sleeps to.
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._expire_waiters())

    async def _expire_waiters(self) -> None:
        """While anyone waits: sleep to the controller's next deadline, then refuse exactly
        the waiters it expired and admit whoever they were holding back."""
        while (deadline := self._controller.next_deadline()) is not None:
            await self._sleep(max(0.0, deadline - self._clock()))
            expiry = self._controller.expire(self._clock())
            self._settle(expiry.admitted, admitted=True)
            self._settle(expiry.refused, admitted=False)

    def _leave(self, ticket: Ticket) -> bool:
        """Take a waiter out of the queue; False if it was admitted or refused meanwhile."""
        unblocked = self._controller.give_up(ticket)
        if unblocked is None:
            return False
        self._settle(unblocked, admitted=True)
        return True

    def _settle(self, tickets: Iterable[Ticket], admitted: bool) -> None:
        """Hand the controller's verdict to the waiters still listening for it."""
        for ticket in tickets:
            verdict = self._waiters.get(ticket)
            if verdict is not None and not verdict.done():
                verdict.set_result(admitted)
