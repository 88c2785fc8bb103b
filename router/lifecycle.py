"""The accounting around one request: admission tickets, metrics and outcome (shell).

``Router`` reads as the request's path and vLLM's OpenAI layer writes the answer; this
object keeps the books. Every request ends exactly one way (ok, refused, failed,
cancelled), is counted once, and gives back every admission ticket it took however it
ends. The first failure is kept, so that the router can answer it with its own status
code when it happens before the first token, and count it by that status.

Kept out of ``router.server``: Serve captures the ingress class while that module is still
being imported, so helpers the class calls must live in a module imported before it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cluster import metrics as m
from router.admission import Ticket
from router.admission_gate import AdmissionGate
from router.cache_policy import CacheResult, merge_results
from router.errors import APIError
from router.timing_metrics import RequestObserver


class RequestLifecycle:
    """One request from admission to its outcome; the first outcome recorded wins."""

    def __init__(self, gate: AdmissionGate, request_id: str, observer: RequestObserver,
                 key: str):
        self.request_id = request_id
        self.failure: BaseException | None = None
        self._gate = gate
        self._observer = observer
        self._key = key
        self._tickets: set[Ticket] = set()
        self._cache_results: list[CacheResult] = []
        # The prompts of a batched request take turns through the pools (engine_client).
        self.turn = asyncio.Lock()

    async def admit(self, cost: int, prompt_tokens: int, route: str) -> Ticket:
        """Wait for admission of a rendered prompt taking ``route`` through the pools; a
        refusal (429/503) is recorded and raised."""
        self._observer.routed(route, prompt_tokens)
        try:
            ticket = await self._gate.acquire(cost, self._key, prompt_tokens=prompt_tokens)
        except APIError as refusal:
            self.record_failure(refusal)
            raise
        except BaseException:  # cancelled: the client went away while queued (or a
            if self.failure is None:  # failed prompt of the same batch made vLLM cancel it)
                self.finish("cancelled")
            raise
        self._tickets.add(ticket)
        self._observer.dispatched()
        return ticket

    @property
    def tenant(self) -> str:
        """Whose answers these are (the hashed API key, else the user): the response
        cache never replays one tenant's answer to another."""
        return self._key

    def cache_result(self, result: CacheResult) -> None:
        """What the response cache did for one of the request's prompts."""
        self._cache_results.append(result)

    def cache_header(self) -> dict[str, str]:
        """``x-pdserve-cache: hit|miss|bypass`` once the cache saw the request (none when
        it is off, or the request failed before its prompt was rendered)."""
        result = merge_results(self._cache_results)
        return {} if result is None else {"x-pdserve-cache": result}

    def served_from_cache(self, prompt_tokens: int) -> None:
        """A prompt was answered from the response cache: no admission, no engine."""
        self._observer.served_from_cache(prompt_tokens)

    def rendered(self) -> None:
        """vLLM's layer rendered the prompt and handed it over (a timing mark)."""
        self._observer.rendered()

    def prefilled(self) -> None:
        """The prefill pool returned the prompt's KV handle (a timing mark)."""
        self._observer.prefilled()

    def answered(self) -> None:
        """The answer's first bytes are out (a timing mark)."""
        self._observer.answered()

    def release(self, ticket: Ticket) -> None:
        """A generation ended: its tokens go back to the budget (once)."""
        if ticket in self._tickets:
            self._tickets.discard(ticket)
            self._gate.release(ticket)

    def observe(self, output: Any) -> None:
        """A ``RequestOutput`` delta arrived: time its new tokens."""
        self._observer.tokens(sum(len(choice.token_ids) for choice in output.outputs))

    def faulted(self) -> None:
        """A stage failed on the way (retried or not): the canary gate counts it."""
        self._observer.faulted()

    def record_failure(self, error: BaseException) -> None:
        """Keep the first failure: the router answers it (and counts it by its status)."""
        if self.failure is None:
            self.failure = error

    def finish(self, outcome: m.Outcome) -> None:
        """The request ended this way (the first call wins)."""
        self._observer.finish(outcome)
