"""Admission control (pure): a token budget, a bounded FIFO queue, a maximum wait.

A request costs its prompt tokens plus its ``max_tokens`` (the most KV it can come to
hold). Requests run while their costs fit the budget; beyond it they wait in a FIFO queue
of bounded length; a full queue refuses at once (429) and a request that waited longer
than the maximum is refused (503). Both refusals carry a Retry-After. Overload thus
queues or refuses instead of pushing engines into preemption or out of memory.

The controller holds no clock and no asyncio: the shell passes ``now`` in and resolves
the waiters it returns, so a recorded trace replays exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

Ticket = int


@dataclass(frozen=True)
class AdmissionPolicy:
    token_budget: int        # in-flight prompt + max_tokens allowed at once
    max_queue: int           # requests allowed to wait
    max_wait_s: float        # longest a request may wait before 503
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_queue < 0 or self.max_wait_s <= 0:
            raise ValueError("token_budget >= 1, max_queue >= 0 and max_wait_s > 0 required")


@dataclass(frozen=True)
class Decision:
    action: Literal["admit", "queue", "reject"]
    status: int | None = None        # 429 when rejected
    retry_after_s: int | None = None


ADMIT = Decision("admit")
QUEUE = Decision("queue")


class AdmissionController:
    def __init__(self, policy: AdmissionPolicy):
        self.policy = policy
        self.in_flight_tokens = 0
        self._running: dict[Ticket, int] = {}
        self._waiting: OrderedDict[Ticket, tuple[int, float]] = OrderedDict()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    def _fits(self, cost: int) -> bool:
        # A request larger than the whole budget runs alone rather than never.
        return self.in_flight_tokens + cost <= self.policy.token_budget or not self._running

    def request(self, ticket: Ticket, cost: int, now: float) -> Decision:
        """Admit, queue or refuse a new request. FIFO: nobody overtakes a waiter."""
        if not self._waiting and self._fits(cost):
            self._start(ticket, cost)
            return ADMIT
        if len(self._waiting) >= self.policy.max_queue:
            return Decision("reject", 429, self.policy.retry_after_s)
        self._waiting[ticket] = (cost, now)
        return QUEUE

    def release(self, ticket: Ticket) -> list[Ticket]:
        """A running request ended: free its tokens; return the waiters now admitted."""
        self.in_flight_tokens -= self._running.pop(ticket, 0)
        return self._admit_waiters()

    def give_up(self, ticket: Ticket) -> list[Ticket] | None:
        """A waiter leaves the queue (timed out or client gone).

        Returns the waiters admitted because it left (it may have blocked the head), or
        None if it was not waiting: it had been admitted already.
        """
        if self._waiting.pop(ticket, None) is None:
            return None
        return self._admit_waiters()

    def expired(self, now: float) -> list[Ticket]:
        """Waiters that have waited longer than ``max_wait_s`` (to be refused with 503)."""
        return [t for t, (_, since) in self._waiting.items()
                if now - since > self.policy.max_wait_s]

    def _start(self, ticket: Ticket, cost: int) -> None:
        self._running[ticket] = cost
        self.in_flight_tokens += cost

    def _admit_waiters(self) -> list[Ticket]:
        admitted = []
        while self._waiting:
            ticket, (cost, _) = next(iter(self._waiting.items()))
            if not self._fits(cost):
                break
            del self._waiting[ticket]
            self._start(ticket, cost)
            admitted.append(ticket)
        return admitted
