"""The per-request path through the pools: prefill → KV transfer → decode (shell).

The router holds Serve handles to both pools. A request is prefilled on a prefill replica,
whose answer is a KV handle; a decode replica then pulls the blocks (NIXL, inside vLLM)
and streams tokens. Every exit path of the stream (finished, client gone, error) leaves
no engine working on, or holding KV for, a request nobody reads.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from cluster.config import Deadlines
from cluster.engine.messages import EngineRequest, PrefillResult, Progress
from router.calls import answer_within
from router.decode_prefixes import DecodeCacheLink
from router.disaggregation import Route
from router.errors import Quarantined, quarantined, service_unavailable
from router.quarantine_memory import QuarantineMemory, fingerprint
from router.retry import (
    CRASHES,
    RETRYABLE,
    Action,
    Failure,
    PoolBreaker,
    RetryPolicy,
    continuation_differs,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How often a prefill call that has not answered checks whether its pool still has a
# replica (an empty pool would hold it until a replacement starts).
POOL_CHECK_S = 0.25


# Calls to give a KV handle up, while each meets a replica that died, and how long each
# may take (after it, the blocks are left to their lease).
RELEASE_ATTEMPTS = 3
RELEASE_S = 10.0
# How long /admin/stats waits for a pool's statistics (as /health waits for its pools): a
# replica that takes a call and never answers must not hold an operator's request for good.
POOL_STATS_S = 5.0
# A one-piece answer's decode replica says it is working this many times per gap deadline
# (router.deadlines.token_gap_s): one late sign of life does not fail the attempt.
PROGRESS_PER_GAP = 3


class PoolEmpty(Exception):
    """The pool has no replica left: a call to it would wait for a replacement."""


@dataclasses.dataclass
class _Crashes:
    """Engine crashes one request was in, over all its stages (router/retry.py)."""

    count: int = 0

    def seen(self, failure: Failure) -> int:
        """Count ``failure`` if it was a crash; the count before it."""
        before = self.count
        self.count += failure in CRASHES
        return before


class DisaggregatedFlow:
    """Runs requests through a prefill pool and a decode pool given as Serve handles,
    retrying, falling back and migrating as ``retry`` decides (router/retry.py)."""

    def __init__(self, prefill_handle, decode_handle, *, retry: RetryPolicy | None = None,
                 deadlines: Deadlines | None = None,
                 classify: Callable[[BaseException], Failure] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_retry: Callable[[str, Failure, Action, str], None] | None = None,
                 caller: tuple[str, str] | None = None,
                 prefill_replicas: Callable[[], int | None] = lambda: None,
                 decode_cache: DecodeCacheLink | None = None,
                 routed_to: Callable[[str, str], str | None] = lambda stage, request_id: None):
        """Without ``retry`` nothing is retried; without ``deadlines`` nothing times out.
        ``classify`` tells the policy what a failure was (default: Ray's and vLLM's
        exception types, router.failures); ``on_retry(stage, failure, action,
        request_id)`` counts each decision. ``caller``: this router replica's actor
        (namespace, name), stamped on each request so that engines abort the requests
        of a router replica that died (cluster/engine/callers.py).
        ``prefill_replicas()``: how many prefill replicas Serve's router here knows (None:
        not known yet); at 0 prompts go to the decode engine at once. ``decode_cache``:
        the decode pool's prefix belief (router/decode_prefixes.py), told each answer that
        finished, whose blocks its engine now holds. ``routed_to(stage, request_id)``: the
        replica of that stage's pool Serve's router sent the call to (None: unknown); a
        retry avoids the replica whose attempt failed (``EngineRequest.avoid_replicas``)."""
        self._prefill = prefill_handle
        self._decode = decode_handle.options(stream=True)
        self._decode_unary = decode_handle
        self._retry = retry or RetryPolicy(prefill_attempts=1, decode_attempts=1,
                                           max_migrations=0, prefill_cooldown_s=0)
        self._deadlines = deadlines or Deadlines(prefill_s=None, first_token_s=None,
                                                 token_gap_s=None)
        self._classify = classify or _failure_kind
        self._clock = clock
        self._on_retry = on_retry or (lambda stage, failure, action, request_id: None)
        self._quarantine = QuarantineMemory()  # what was quarantined, to refuse resends
        self._releases: set[asyncio.Future] = set()
        self._prefill_breaker = PoolBreaker(self._retry.prefill_cooldown_s)
        self._caller = caller
        self._prefill_replicas = prefill_replicas
        self.decode_cache = decode_cache
        self._routed_to = routed_to

    async def generate(
        self, request: EngineRequest, path: Route = "disaggregated", *, one_piece: bool = False,
        on_prefilled: Callable[[], None] = lambda: None,
    ) -> AsyncIterator[Any]:
        """Yield the request's vLLM ``RequestOutput`` deltas; the last is ``finished``.

        On the ``decode_local`` path the decode engine prefills the prompt itself.
        ``one_piece``: the decode engine sends the whole answer as one output (a unary
        request), with a ``Progress`` while it works (decode/progress.py). ``on_prefilled``
        is called when the prefill stage is over (a timing mark). A request quarantined
        moments ago is refused before any engine sees it (router/quarantine_memory.py).

        If the consumer stops early (client disconnect → cancellation or ``aclose``),
        the decode stream is cancelled, which aborts the request in the decode engine;
        the engine's connector then releases the prompt's blocks on the prefill side.
        """
        start = self._clock()
        # Fingerprinted only while something is remembered: almost never.
        if self._quarantine and self._quarantine.holds(
                fingerprint(request.prompt_token_ids, request.sampling), start):
            logger.warning("request %s refused: the same request made an engine fail "
                           "moments ago (quarantined)", request.request_id)
            self._on_retry("decode", "crashed", "refuse_resend", request.request_id)
            raise quarantined(request.request_id, resent=True)
        try:
            async for output in self._generate(request, path, start, one_piece, on_prefilled):
                yield output
        except Quarantined:
            self._quarantine.remember(
                fingerprint(request.prompt_token_ids, request.sampling), self._clock())
            raise

    async def _generate(self, request: EngineRequest, path: Route, start: float,
                        one_piece: bool, on_prefilled: Callable[[], None]
                        ) -> AsyncIterator[Any]:
        handle = None
        crashes = _Crashes()
        if self._caller is not None and request.caller is None:
            request = dataclasses.replace(request, caller=self._caller)
        if one_piece and (gap := self._deadlines.token_gap_s) is not None:
            request = dataclasses.replace(request,
                                          progress_interval_s=gap / PROGRESS_PER_GAP)
        if path == "disaggregated" and not self._prefill_breaker.allows(start):
            logger.info("request %s: the prefill pool failed moments ago; the decode "
                        "engine prefills it", request.request_id)
            path = "decode_local"
        if path == "disaggregated":
            handle = await self._prefill_with_retries(request, start, crashes)
            on_prefilled()
        async for output in self._decode_with_retries(request, handle, start, one_piece,
                                                       crashes):
            yield output

    async def _prefill_with_retries(self, request: EngineRequest, start: float,
                                    crashes: _Crashes):
        """The prefill's KV handle; None when the decode engine is to prefill instead."""
        attempts = 0
        while True:
            attempts += 1
            try:
                result = await self._prefill_once(request, start)
                self._prefill_breaker.succeeded()
                return result.handle
            except Exception as error:  # not CancelledError: the client left
                empty = isinstance(error, PoolEmpty)
                failure = "unavailable" if empty else self._classify(error)
                action = self._retry.after_prefill_failure(
                    failure, attempts, self._clock() - start, pool_empty=empty,
                    crashes_before=crashes.seen(failure))
                self._note("prefill", request, error, failure, action)
                if action == "quarantine":
                    raise quarantined(request.request_id) from error
                if action == "give_up":
                    raise
                request = self._avoiding("prefill", request, failure)
                if action == "decode_local":
                    if not empty:
                        # Every attempt failed: the pool as a whole, not one replica. Spare
                        # the next prompts the wait (router/retry.py, PoolBreaker). An empty
                        # pool needs no breaker: each prompt sees it at once.
                        self._prefill_breaker.failed(self._clock())
                    return None

    async def _prefill_once(self, request: EngineRequest, start: float) -> PrefillResult:
        """One prefill call, within the prefill deadline; ``PoolEmpty`` as soon as the pool
        has no replica (at the start, or while the call waits for one)."""
        if self._prefill_replicas() == 0:
            raise PoolEmpty("no prefill replica")
        response = self._prefill.prefill.remote(request)
        call = asyncio.ensure_future(response)
        try:
            async with asyncio.timeout(self._capped(self._deadlines.prefill_s, start)):
                while not (await asyncio.wait({call}, timeout=POOL_CHECK_S))[0]:
                    if self._prefill_replicas() == 0:
                        raise PoolEmpty("every prefill replica died while the prompt waited")
            return call.result()
        finally:
            if not call.done():
                # Left (a client gone, a deadline, an empty pool): cancel the call in the
                # replica too, where vLLM aborts it and frees its blocks.
                call.cancel()
                response.cancel()

    async def _decode_with_retries(self, request: EngineRequest, handle, start: float,
                                   one_piece: bool, crashes: _Crashes) -> AsyncIterator[Any]:
        sent: list[int] = []  # token ids already passed on (of the one choice, when n = 1)
        attempts = migrations = 0
        current = request
        while True:
            attempts += 1
            attempt_id = current.request_id
            stream = self._decode.generate.remote(current, handle)
            finished = False
            given_up = None  # the handle to free once this attempt is cancelled
            try:
                timeout = self._first_output_deadline(request, one_piece)
                while not finished:
                    output = await _within(anext(stream), self._capped(timeout, start))
                    timeout = self._deadlines.token_gap_s
                    if isinstance(output, Progress):  # a one-piece answer on its way
                        continue
                    _refuse_engine_end(output)
                    finished = output.finished
                    if output.outputs:
                        sent.extend(output.outputs[0].token_ids)
                    if finished:  # before the yield: a consumer may stop at the last output
                        self._decoded(request, current, sent)
                    yield output
                return
            except StopAsyncIteration:
                return  # ended without a finished output: aborted below
            except Exception as error:  # not GeneratorExit/CancelledError: the client left
                failure = self._classify(error)
                inexact = continuation_differs(request.sampling)
                action = self._retry.after_decode_failure(
                    failure, tokens_sent=len(sent), attempts=attempts,
                    migrations=migrations, elapsed_s=self._clock() - start,
                    choices=request.sampling.n, inexact=inexact is not None,
                    crashes_before=crashes.seen(failure))
                self._note("decode", request, error, failure, action)
                # Nobody will pull the blocks now: free them, unless the attempt only passed
                # a deadline. Its replica may be slow rather than gone, and could still pull
                # blocks the prefill engine had reused for another prompt; the lease frees
                # them instead.
                if handle is not None and not sent and failure != "deadline":
                    given_up = handle
                if action == "quarantine":
                    raise quarantined(request.request_id) from error
                if action == "give_up" and sent and inexact and failure in RETRYABLE:
                    raise service_unavailable(  # rather than an answer unlike the unfaulted
                        f"the stream was cut by an engine failure and cannot be continued "
                        f"exactly ({inexact}); retry") from error
                if action == "give_up":
                    raise
                handle = None  # the retry or continuation prefills on its decode engine
                if action == "migrate":
                    migrations += 1
                avoided = self._avoiding("decode", current, failure).avoid_replicas
                current = dataclasses.replace(continuation(request, sent, attempts),
                                              avoid_replicas=avoided)
            finally:
                if not finished:
                    stream.cancel()
                    logger.info("request %s stopped before it finished; aborted", attempt_id)
                if given_up is not None:  # after the cancel: the attempt's stream is over
                    self._release(f"{attempt_id}-release", given_up)

    def _avoiding(self, stage: str, request: EngineRequest, failure: Failure) -> EngineRequest:
        """``request``, its next attempt kept off the replica where this one failed. Only
        for a replica that may still look fine to the router (a deadline: a hung engine
        reports the load it had when it stopped; unavailable: it may be restarting); one
        that died leaves Serve's list at once."""
        replica = (self._routed_to(stage, request.request_id)
                   if failure in ("deadline", "unavailable", "crashed_shared") else None)
        if replica is None or replica in request.avoid_replicas:
            return request
        return dataclasses.replace(request,
                                   avoid_replicas=(*request.avoid_replicas, replica))

    def _decoded(self, request: EngineRequest, current: EngineRequest,
                 sent: list[int]) -> None:
        """``current`` (``request`` or its continuation) finished: its decode engine holds
        the prompt and the answer (one choice only: ``sent`` mixes the choices of n > 1)."""
        if self.decode_cache is not None and request.sampling.n == 1:
            self.decode_cache.finished(current.request_id, (*request.prompt_token_ids, *sent),
                                       request.prompt_token_ids)

    def _release(self, request_id: str, handle) -> None:
        """Ask a decode replica, in the background, to give ``handle`` up (vLLM's
        rejected-transfer notification); a failure only leaves the blocks to their lease.
        A replica that died is not asked again (Serve drops it), so the call is retried
        while that is the failure: the decode replica that failed is often the one asked."""
        async def release() -> None:
            for attempt in range(1, RELEASE_ATTEMPTS + 1):
                try:  # bounded, and never cancelled (router/calls.py)
                    await answer_within(self._decode_unary.release_handle.remote(
                        request_id, handle), RELEASE_S)
                    return
                except Exception as error:
                    if self._classify(error) == "died" and attempt < RELEASE_ATTEMPTS:
                        continue
                    logger.warning("request %s: releasing its KV handle failed (%r); its "
                                   "blocks are freed when their lease expires", request_id,
                                   error)
                    return

        task = asyncio.ensure_future(release())
        self._releases.add(task)  # kept referenced until done
        task.add_done_callback(self._releases.discard)

    def _capped(self, timeout_s: float | None, start: float) -> float | None:
        """``timeout_s``, or what is left of the whole request's deadline if that is less
        (the policy's ``request_s``: it gives the request up when that has passed)."""
        request_s = self._retry.request_s
        if request_s is None:
            return timeout_s
        left = max(0.0, start + request_s - self._clock())
        return left if timeout_s is None else min(timeout_s, left)

    def _first_output_deadline(self, request: EngineRequest, one_piece: bool) -> float | None:
        first, gap = self._deadlines.first_token_s, self._deadlines.token_gap_s
        if not one_piece or first is None or request.progress_interval_s is not None:
            return first  # a one-piece answer's replica sends Progress while it works
        # The one output comes when the whole answer is done: every token's gap counts.
        return None if gap is None else first + gap * request.sampling.max_tokens

    def _note(self, stage: str, request: EngineRequest, error: BaseException,
              failure: Failure, action: Action) -> None:
        if action == "quarantine":  # what it asked for, to find the cause; never its text
            logger.error("request %s quarantined: its %s engine died of an error of its "
                         "own (%s: %r); not retried. %d prompt tokens, sampling: %r",
                         request.request_id, stage, failure, error,
                         len(request.prompt_token_ids), request.sampling)
        else:
            log = logger.error if action == "give_up" else logger.warning
            log("request %s: %s failed (%s: %r); %s", request.request_id, stage, failure,
                error, action)
        self._on_retry(stage, failure, action, request.request_id)

    async def pool_answers(self, role: str) -> None:
        """Return once a replica of the ``role`` pool answered (raise if the call fails)."""
        await (self._prefill if role == "prefill" else self._decode_unary).stats.remote()

    async def pool_stats(self) -> dict[str, dict]:
        """Statistics of one replica of each pool (the one Serve routes the call to); 503
        for a pool none of whose replicas answers within ``POOL_STATS_S``."""
        stats = {}
        for pool, handle in (("prefill", self._prefill), ("decode", self._decode_unary)):
            try:  # never cancelled: router/calls.py
                stats[pool] = await answer_within(handle.stats.remote(), POOL_STATS_S)
            except TimeoutError:
                raise service_unavailable(
                    f"the {pool} pool did not answer within {POOL_STATS_S:g} s") from None
        return stats


# Ways an engine ends a request on its own: it could not compute it (a failed KV load
# under vLLM's "fail" policy, say), or it aborted it (its caller looked dead, it was shutting
# down). The router's own aborts never reach here: it stops reading first.
ENGINE_ENDINGS = frozenset({"error", "abort"})


def _refuse_engine_end(output: Any) -> None:
    """A failed attempt (retried, migrated), never a successful answer with whatever
    text came before it."""
    ending = next((choice.finish_reason for choice in output.outputs
                   if choice.finish_reason in ENGINE_ENDINGS), None)
    if ending is not None:
        raise service_unavailable(f"the engine ended the request ({ending}); retry")


def continuation(request: EngineRequest, sent: list[int], attempt: int) -> EngineRequest:
    """``request`` to run again after ``attempt`` failed: the tokens already ``sent``
    appended to its prompt, and what is left of its token limits. Exact for greedy
    decoding; unseeded random sampling goes on from this point (as right a sample as the
    first); what it cannot reproduce is never continued (``continuation_differs``)."""
    sampling = copy.copy(request.sampling)
    sampling.max_tokens = request.sampling.max_tokens - len(sent)
    if getattr(sampling, "min_tokens", 0):
        sampling.min_tokens = max(0, sampling.min_tokens - len(sent))
    # Its own id: the engine that failed may still be aborting the first one.
    return dataclasses.replace(
        request, request_id=f"{request.request_id}-retry{attempt}",
        prompt_token_ids=(*request.prompt_token_ids, *sent), sampling=sampling,
        decode_replica=None)  # not back to the replica that failed it, if it still runs


async def _within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``awaitable``'s result; ``TimeoutError`` (and the awaitable cancelled) after
    ``timeout_s`` seconds (None: no limit)."""
    # asyncio.timeout, not wait_for: this runs once per streamed chunk, and wait_for
    # wraps each await in a task of its own.
    async with asyncio.timeout(timeout_s):
        return await awaitable


def _failure_kind(error: BaseException) -> Failure:
    from router.failures import failure_kind  # Ray's and vLLM's exception types

    return failure_kind(error)


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """``first`` followed by the rest of a stream whose head was already taken."""
    yield first
    async for item in rest:
        yield item
