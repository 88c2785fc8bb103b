"""Admission control (pure): a token budget, fair bounded queues, a maximum wait.

A request costs its prompt tokens plus its ``max_tokens`` (the most KV it can come to
hold). Requests run while their costs fit the budget; beyond it they wait. Each client key
(an API key, or the ``user`` field) has its own FIFO queue, and the queues take turns
(round robin), so one key flooding the service cannot starve the others: it fills only its
own queue (``max_queue_per_key``, then 429), gets one admission per turn, and its waiters
do not hold back another key's request that fits the budget. A full global
queue refuses at once (429) and a request that waited longer than the maximum is refused
(503). Both refusals carry a Retry-After. Overload thus queues or refuses instead of
pushing engines into preemption or out of memory.

Long prompts take a lane of their own: together they may hold at most ``long_budget``
tokens, and they wait in queues apart from the same key's short requests. A burst of
8K-token prompts therefore never takes the whole budget, and the short chats behind it
are not held up waiting for one to finish.

The controller holds no clock and no asyncio: the shell passes ``now`` in and resolves
the waiters it returns, so a recorded trace replays exactly.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Literal

Ticket = int


def client_key(authorization: str | None, user: str | None) -> str:
    """Whose share of the queue a request uses: its API key, else its ``user``.

    The key is hashed: raw API keys must never reach logs or metrics.
    """
    if authorization and authorization.lower().startswith("bearer ") and authorization[7:]:
        return "key:" + hashlib.sha256(authorization[7:].encode()).hexdigest()[:16]
    if user:
        return "user:" + user
    return "anonymous"


@dataclass(frozen=True)
class AdmissionPolicy:
    token_budget: int        # in-flight prompt + max_tokens allowed at once
    max_queue: int           # requests allowed to wait
    max_wait_s: float        # longest a request may wait before 503
    retry_after_s: int = 1
    max_queue_per_key: int | None = None  # one key's share of the queue (None: max_queue)
    long_budget: int | None = None   # what long-lane requests may hold together (None: all)

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_queue < 0 or self.max_wait_s <= 0:
            raise ValueError("token_budget >= 1, max_queue >= 0 and max_wait_s > 0 required")
        if self.max_queue_per_key is not None and self.max_queue_per_key < 0:
            raise ValueError("max_queue_per_key must be >= 0")
        if self.long_budget is not None and self.long_budget < 1:
            raise ValueError("long_budget must be >= 1")

    @property
    def key_queue_limit(self) -> int:
        return self.max_queue if self.max_queue_per_key is None else self.max_queue_per_key


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
        self.long_in_flight_tokens = 0
        self._running: dict[Ticket, tuple[int, bool]] = {}
        # every waiter: (cost, since, queue); per queue a FIFO; queues with waiters take
        # turns. A queue is a key's short or long lane (see _queue_name).
        self._waiting: OrderedDict[Ticket, tuple[int, float, str]] = OrderedDict()
        self._queues: dict[str, deque[Ticket]] = {}
        self._turns: deque[str] = deque()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    def snapshot(self) -> dict[str, int]:
        """What the budget and the queue hold now (for operators and tests)."""
        return {
            "token_budget": self.policy.token_budget,
            "tokens_in_flight": self.in_flight_tokens,
            "long_tokens_in_flight": self.long_in_flight_tokens,
            "running": len(self._running),
            "queued": len(self._waiting),
            "max_queue": self.policy.max_queue,
        }

    def _fits(self, cost: int, long: bool) -> bool:
        # A request larger than the whole budget runs alone rather than never.
        if not self._running:
            return True
        if self.in_flight_tokens + cost > self.policy.token_budget:
            return False
        limit = self.policy.long_budget
        return (not long or limit is None or self.long_in_flight_tokens == 0
                or self.long_in_flight_tokens + cost <= limit)

    def request(self, ticket: Ticket, cost: int, now: float, key: str = "",
                long: bool = False) -> Decision:
        """Admit, queue or refuse a new request. Nobody overtakes a waiter of its own key
        and lane; another key's waiters (a flood) do not hold it back when it fits."""
        queue = _queue_name(key, long)
        if queue not in self._queues and self._fits(cost, long):
            self._start(ticket, cost, long)
            return ADMIT
        own_waiters = sum(len(self._queues.get(_queue_name(key, lane), ()))
                          for lane in (False, True))
        if (len(self._waiting) >= self.policy.max_queue
                or own_waiters >= self.policy.key_queue_limit):
            return Decision("reject", 429, self.policy.retry_after_s)
        self._waiting[ticket] = (cost, now, queue)
        if queue not in self._queues:
            self._queues[queue] = deque()
            self._turns.append(queue)
        self._queues[queue].append(ticket)
        return QUEUE

    def release(self, ticket: Ticket) -> list[Ticket]:
        """A running request ended: free its tokens; return the waiters now admitted."""
        cost, long = self._running.pop(ticket, (0, False))
        self.in_flight_tokens -= cost
        if long:
            self.long_in_flight_tokens -= cost
        return self._admit_waiters()

    def give_up(self, ticket: Ticket) -> list[Ticket] | None:
        """A waiter leaves the queue (timed out or client gone).

        Returns the waiters admitted because it left (it may have blocked the head), or
        None if it was not waiting: it had been admitted already.
        """
        entry = self._waiting.pop(ticket, None)
        if entry is None:
            return None
        key = entry[2]
        self._queues[key].remove(ticket)
        if not self._queues[key]:
            self._drop_key(key)
        return self._admit_waiters()

    def expired(self, now: float) -> list[Ticket]:
        """Waiters that have waited longer than ``max_wait_s`` (to be refused with 503)."""
        return [t for t, (_, since, _) in self._waiting.items()
                if now - since > self.policy.max_wait_s]

    def _start(self, ticket: Ticket, cost: int, long: bool) -> None:
        self._running[ticket] = (cost, long)
        self.in_flight_tokens += cost
        if long:
            self.long_in_flight_tokens += cost

    def _drop_key(self, key: str) -> None:
        del self._queues[key]
        self._turns.remove(key)

    def _admit_waiters(self) -> list[Ticket]:
        """Admit heads of the per-key queues, taking turns, while budget allows.

        A key whose head does not fit yet is passed over but keeps its place in line, so
        it goes first once enough budget is free; a key that was served goes to the back.
        """
        admitted = []
        progress = True
        while progress:
            progress = False
            for key in list(self._turns):
                ticket = self._queues[key][0]
                cost = self._waiting[ticket][0]
                long = _is_long_lane(key)
                if not self._fits(cost, long):
                    continue
                self._queues[key].popleft()
                del self._waiting[ticket]
                self._start(ticket, cost, long)
                admitted.append(ticket)
                self._turns.remove(key)
                if self._queues[key]:
                    self._turns.append(key)
                else:
                    del self._queues[key]
                progress = True
                break
        return admitted


_LONG_LANE = "\x00long"  # cannot occur in a client key (they are hashes or user names)


def _queue_name(key: str, long: bool) -> str:
    return key + _LONG_LANE if long else key


def _is_long_lane(queue: str) -> bool:
    return queue.endswith(_LONG_LANE)
