"""The accounting around one request: admission ticket, metrics and outcome (shell).

``Router`` reads as the request's path; this object keeps the books. Every request that
reaches admission ends exactly one way (ok, refused, failed, cancelled), is counted once,
and gives its admission ticket back however its stream ends.

Kept out of ``router.server``: Serve captures the ingress class while that module is still
being imported, so helpers the class calls must live in a module imported before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi.responses import JSONResponse

from cluster import metrics as m
from cluster.engine.messages import TokenChunk
from router.admission_gate import AdmissionGate
from router.errors import APIError
from router.failures import client_error, error_response, failed_response
from router.timing_metrics import RequestObserver

T = TypeVar("T")


class RequestLifecycle:
    """One request from admission to its outcome; ``finish`` and ``fail`` count it once."""

    def __init__(self, gate: AdmissionGate, request_id: str, observer: RequestObserver):
        self.request_id = request_id
        self._gate = gate
        self._observer = observer
        self._ticket = None

    async def admit(self, cost: int, key: str, prompt_tokens: int) -> JSONResponse | None:
        """Wait for admission; a refusal (429/503) comes back as the response to send."""
        try:
            self._ticket = await self._gate.acquire(cost, key, prompt_tokens=prompt_tokens)
        except APIError as refusal:
            self._observer.finish(m.outcome_for_status(refusal.status))
            return error_response(refusal, self.request_id)
        except BaseException:  # cancelled: the client went away while queued
            self._observer.finish("cancelled")
            raise
        self._observer.dispatched()
        return None

    async def observed(self, chunks: AsyncIterator[TokenChunk]) -> AsyncIterator[TokenChunk]:
        """``chunks``, each timed, giving the admission ticket back however they end."""
        try:
            async for chunk in chunks:
                self._observer.chunk(chunk)
                yield chunk
        finally:
            if self._ticket is not None:
                self._gate.release(self._ticket)
                self._ticket = None
            await chunks.aclose()

    async def attempt(self, step: Awaitable[T]) -> tuple[T | None, JSONResponse | None]:
        """Await one step of the request: its result, or the error response to send.

        A failure inside the pools becomes an OpenAI error (counted); a cancellation (the
        client went away) is counted and propagates.
        """
        try:
            return await step, None
        except Exception as error:
            return None, failed_response(error, self.request_id, self._observer)
        except BaseException:
            self._observer.finish("cancelled")
            raise

    def stream_failure(self, error: Exception) -> APIError:
        """A failure after the status line was sent: counted, reported inside the stream."""
        api_error = client_error(error, self.request_id)
        self._observer.finish(m.outcome_for_status(api_error.status))
        return api_error

    def finish(self, outcome: m.Outcome) -> None:
        """The request ended this way (the first call wins)."""
        self._observer.finish(outcome)
