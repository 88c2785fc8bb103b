"""The router's admission gate: applies ``AdmissionController`` decisions with asyncio.

``acquire`` returns a ticket once the request may run (or raises the 429/503 ``APIError``
to answer); ``release`` returns the ticket's tokens when the request ends, waking the
waiters it lets in.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from cluster.config import AdmissionConfig
from router.admission import AdmissionController, AdmissionPolicy, Ticket
from router.errors import APIError


def overloaded(status: int, retry_after_s: int, message: str, code: str) -> APIError:
    return APIError(status, message, "overloaded_error", None, code,
                    headers={"Retry-After": str(retry_after_s)})


class AdmissionGate:
    def __init__(self, config: AdmissionConfig, clock=time.monotonic):
        long_budget = (max(1, int(config.token_budget * config.long_lane_share))
                       if config.long_prompt_tokens is not None else None)
        self._controller = AdmissionController(AdmissionPolicy(
            config.token_budget, config.max_queue, config.max_wait_s, config.retry_after_s,
            config.max_queue_per_key, long_budget))
        self._long_prompt_tokens = config.long_prompt_tokens
        self._policy = self._controller.policy
        self._clock = clock
        self._ids = itertools.count()
        self._waiters: dict[Ticket, asyncio.Future] = {}

    async def acquire(self, cost: int, key: str = "anonymous", prompt_tokens: int = 0) -> Ticket:
        """Wait for admission in ``key``'s queue; raise the 429/503 answer if refused.

        Prompts of ``long_prompt_tokens`` or more wait in the key's long lane.
        """
        ticket = next(self._ids)
        long = (self._long_prompt_tokens is not None
                and prompt_tokens >= self._long_prompt_tokens)
        decision = self._controller.request(ticket, cost, self._clock(), key, long)
        if decision.action == "admit":
            return ticket
        if decision.action == "reject":
            raise overloaded(429, self._policy.retry_after_s,
                             "the server is at capacity and its queue is full; retry later",
                             "queue_full")
        admitted = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = admitted
        try:
            await asyncio.wait_for(asyncio.shield(admitted), self._policy.max_wait_s)
            return ticket
        except TimeoutError:
            if not self._leave(ticket):
                return ticket  # admitted in the same instant it timed out
            raise overloaded(503, self._policy.retry_after_s,
                             f"waited {self._policy.max_wait_s:g}s for capacity; retry later",
                             "queue_timeout") from None
        except asyncio.CancelledError:  # the client went away while waiting
            if not self._leave(ticket):
                self.release(ticket)
            raise
        finally:
            self._waiters.pop(ticket, None)

    def release(self, ticket: Ticket) -> None:
        self._wake(self._controller.release(ticket))

    def snapshot(self) -> dict[str, int]:
        """Tokens in flight, running and queued requests of this router replica."""
        return self._controller.snapshot()

    def _leave(self, ticket: Ticket) -> bool:
        """Take a waiter out of the queue; False if it had been admitted meanwhile."""
        unblocked = self._controller.give_up(ticket)
        if unblocked is None:
            return False
        self._wake(unblocked)
        return True

    def _wake(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            waiter = self._waiters.get(ticket)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
