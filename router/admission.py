"""Admission control (pure): a token budget, fair bounded queues, a maximum wait.

A request costs its prompt tokens plus its ``max_tokens``; requests run while their costs
fit the budget, and wait in per-key FIFO queues that take turns, long prompts in a lane of
their own. The controller holds no clock and no asyncio: the shell passes ``now`` in,
resolves the waiters it returns, sleeps until ``next_deadline()`` and refuses exactly the
waiters ``expire(now)`` names. Why: docs/design.md, "Admission control: a token budget,
fair per-client queues, a maximum wait" and "Fairness between long and short requests".
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cluster.digest import short_digest
from router.auth import bearer_token

if TYPE_CHECKING:  # only the type: the policy reads a config, it does not import its loader
    from cluster.config import AdmissionConfig

Ticket = int
KEY_TENANT = "key:"  # a client key's prefix: the request carried an API key
ANONYMOUS = "anonymous"  # the key of a request with neither an API key nor a user


# A queue: a client key and whether it is the key's long lane. A pair, not a joined
# string: a client's `user` may hold any character, and must never name another's lane.
Queue = tuple[str, bool]


def client_key(authorization: str | None, user: str | None) -> str:
    """Whose share of the queue a request uses: its API key, else its ``user``.

    The key is read the way authentication reads it (``bearer_token``), so a request
    queues under the key it was authorised with; it is hashed: raw API keys must never
    reach logs or metrics.
    """
    token = bearer_token(authorization)
    if token is not None:
        return KEY_TENANT + short_digest(token)
    if user:
        return "user:" + user
    return ANONYMOUS


@dataclass(frozen=True)
class AdmissionPolicy:
    """The limits admission enforces. Built with :meth:`from_config`: defaults and
    validation live in ``AdmissionConfig`` (budget >= 1, queues >= 0, a wait > 0, ...)."""

    token_budget: int        # in-flight prompt + max_tokens allowed at once
    max_queue: int           # requests allowed to wait
    max_wait_s: float        # longest a request may wait before it is refused
    retry_after_s: int       # what refusals tell the client to wait before retrying
    max_queue_per_key: int | None  # one key's share of the queue (None: max_queue)
    long_budget: int | None  # what long-lane requests may hold together (None: no lane)
    key_budget: int | None = None  # what one key's running requests may hold (None: all)

    @classmethod
    def from_config(cls, config: AdmissionConfig) -> AdmissionPolicy:
        """The policy of a validated ``router.admission`` section.

        The long lane's budget is ``long_lane_share`` of the whole budget (at least one
        token), and only when a lane is configured (``long_prompt_tokens``).
        """
        long_budget = (max(1, int(config.token_budget * config.long_lane_share))
                       if config.long_prompt_tokens is not None else None)
        share = config.max_running_share_per_key
        key_budget = None if share is None else max(1, int(config.token_budget * share))
        return cls(token_budget=config.token_budget, max_queue=config.max_queue,
                   max_wait_s=config.max_wait_s, retry_after_s=config.retry_after_s,
                   max_queue_per_key=config.max_queue_per_key, long_budget=long_budget,
                   key_budget=key_budget)

    @property
    def key_queue_limit(self) -> int:
        return self.max_queue if self.max_queue_per_key is None else self.max_queue_per_key


@dataclass(frozen=True)
class Decision:
    """What happens to a new request. A refusal means the queue is full; ``too_large``, that
    the request costs more than the whole budget. How each reads over HTTP (429, 400) is
    the shell's business."""

    action: Literal["admit", "queue", "reject", "too_large"]
    retry_after_s: int | None = None  # set when refused


@dataclass(frozen=True)
class Expiry:
    """Waiters refused for waiting ``max_wait_s``, and those admitted because they left."""

    refused: tuple[Ticket, ...]
    admitted: tuple[Ticket, ...]


ADMIT = Decision("admit")
QUEUE = Decision("queue")
TOO_LARGE = Decision("too_large")


class AdmissionController:
    def __init__(self, policy: AdmissionPolicy):
        self.policy = policy
        self.in_flight_tokens = 0
        self.long_in_flight_tokens = 0
        self._running: dict[Ticket, tuple[int, bool, str]] = {}  # cost, long lane, key
        self._running_by_key: dict[str, int] = {}  # tokens each key's running requests hold
        # every waiter: (cost, since, queue); per queue a FIFO; queues with waiters take
        # turns. A queue is a key's short or long lane (see _queue_name).
        self._waiting: OrderedDict[Ticket, tuple[int, float, Queue]] = OrderedDict()
        self._queues: dict[Queue, deque[Ticket]] = {}
        self._turns: deque[Queue] = deque()

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

    def _fits(self, cost: int, long: bool, key: str) -> bool:
        if self.in_flight_tokens + cost > self.policy.token_budget:
            return False
        if not self._within_key_share(cost, key):
            return False
        limit = self.policy.long_budget
        return (not long or limit is None or self.long_in_flight_tokens == 0
                or self.long_in_flight_tokens + cost <= limit)

    def _within_key_share(self, cost: int, key: str) -> bool:
        """A key may always run one request; beyond it, its running requests hold at most
        ``key_budget``: one client cannot hold the whole budget running (long streams a
        client does not read, say) while other clients wait. Requests without an identity
        (no API key, no ``user``) are not capped: they may be every client there is."""
        if key in ("", ANONYMOUS):  # no identity: one client may be everyone
            return True
        held = self._running_by_key.get(key, 0)
        limit = self.policy.key_budget
        return limit is None or held == 0 or held + cost <= limit

    def request(self, ticket: Ticket, cost: int, now: float, key: str = "",
                long: bool = False) -> Decision:
        """Admit, queue or refuse a new request. Nobody overtakes a waiter of its own key
        and lane; another key's waiters (a flood) do not hold it back when it fits."""
        # More than the whole budget could only run alone, holding every other client off
        # for as long as it runs: refused, never admitted.
        if cost > self.policy.token_budget:
            return TOO_LARGE
        queue = _queue_name(key, long)
        if queue not in self._queues and self._fits(cost, long, key):
            self._start(ticket, cost, long, key)
            return ADMIT
        own_waiters = sum(len(self._queues.get(_queue_name(key, lane), ()))
                          for lane in (False, True))
        if (len(self._waiting) >= self.policy.max_queue
                or own_waiters >= self.policy.key_queue_limit):
            return Decision("reject", self.policy.retry_after_s)
        self._waiting[ticket] = (cost, now, queue)
        if queue not in self._queues:
            self._queues[queue] = deque()
            self._turns.append(queue)
        self._queues[queue].append(ticket)
        return QUEUE

    def release(self, ticket: Ticket) -> list[Ticket]:
        """A running request ended: free its tokens; return the waiters now admitted."""
        if ticket not in self._running:
            return self._admit_waiters()
        cost, long, key = self._running.pop(ticket)
        self.in_flight_tokens -= cost
        if long:
            self.long_in_flight_tokens -= cost
        self._running_by_key[key] -= cost
        if not self._running_by_key[key]:
            del self._running_by_key[key]
        return self._admit_waiters()

    def give_up(self, ticket: Ticket) -> list[Ticket] | None:
        """A waiter leaves the queue (timed out or client gone).

        Returns the waiters admitted because it left (it may have blocked the head), or
        None if it was not waiting: it had been admitted (or refused) already.
        """
        if ticket not in self._waiting:
            return None
        self._remove_waiter(ticket)
        return self._admit_waiters()

    def expired(self, now: float) -> list[Ticket]:
        """Waiters whose deadline (arrival + ``max_wait_s``) is ``now`` or earlier."""
        return [t for t, (_, since, _) in self._waiting.items() if self._deadline(since) <= now]

    def next_deadline(self) -> float | None:
        """When the next waiter expires (None: nobody waits): when the shell calls ``expire``."""
        return min((self._deadline(since) for _, since, _ in self._waiting.values()),
                   default=None)

    def expire(self, now: float) -> Expiry:
        """Take the expired waiters out of the queue (the shell refuses them) and admit
        whoever they were holding back."""
        refused = self.expired(now)
        for ticket in refused:
            self._remove_waiter(ticket)
        return Expiry(tuple(refused), tuple(self._admit_waiters()) if refused else ())

    def _deadline(self, since: float) -> float:
        return since + self.policy.max_wait_s

    def _remove_waiter(self, ticket: Ticket) -> None:
        queue = self._waiting.pop(ticket)[2]
        self._queues[queue].remove(ticket)
        if not self._queues[queue]:
            self._drop_key(queue)

    def _start(self, ticket: Ticket, cost: int, long: bool, key: str) -> None:
        self._running[ticket] = (cost, long, key)
        self._running_by_key[key] = self._running_by_key.get(key, 0) + cost
        self.in_flight_tokens += cost
        if long:
            self.long_in_flight_tokens += cost

    def _drop_key(self, key: Queue) -> None:
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
                long, client = _is_long_lane(key), _client_of(key)
                if not self._fits(cost, long, client):
                    continue
                self._queues[key].popleft()
                del self._waiting[ticket]
                self._start(ticket, cost, long, client)
                admitted.append(ticket)
                self._turns.remove(key)
                if self._queues[key]:
                    self._turns.append(key)
                else:
                    del self._queues[key]
                progress = True
                break
        return admitted


def _queue_name(key: str, long: bool) -> Queue:
    return (key, long)


def _is_long_lane(queue: Queue) -> bool:
    return queue[1]


def _client_of(queue: Queue) -> str:
    """The client key whose queue (either lane) this is."""
    return queue[0]
