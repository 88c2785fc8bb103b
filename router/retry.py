"""What to do when a stage of a request's path fails (pure: no Ray, no clock of its own).

Before the first token a failed prefill is retried, then left to the decode engine, and a
failed decode runs again decode-local; after it, a decode is migrated (the tokens sent
appended to the prompt) to another decode replica. Only the cluster's failures are
retried, within attempts per stage, migrations per request and a total time measured by
the caller's clock. Why: docs/design.md, "Retries, migration and deadlines".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cluster.config import RetryConfig

# Why a stage failed, as the shell classifies it. "died": the replica's actor is gone
# (Serve's router drops it at once and never sends it another call); "unavailable": any
# other fault of the cluster that may pass (an engine dead inside a live replica, a replica
# that did not answer, no capacity). "crashed": the engine died of an error of its own
# (not a signal: cluster/engine/death.py) with this request alone in it;
# "crashed_shared": so, with other requests in it too.
Failure = Literal["died", "unavailable", "deadline", "refused", "internal", "crashed",
                  "crashed_shared"]
# What the shell does next. "quarantine": give up, as a request that may kill engines.
Action = Literal["retry_prefill", "decode_local", "migrate", "give_up", "quarantine"]

RETRYABLE: frozenset[str] = frozenset({"died", "unavailable", "deadline", "crashed_shared"})
CRASHES: frozenset[str] = frozenset({"crashed", "crashed_shared"})


def quarantines(failure: Failure, crashes_before: int) -> bool:
    """Whether a request whose stage failed with ``failure``, after ``crashes_before``
    engine crashes with it in them (CRASHES), is kept off every other engine: its engine
    died of its own error with nothing else in it, or a second time with it among others.
    Retried, a request that makes engines fail would take the pool down one replica at a
    time. Among others, the first time, it is retried with them (the crash may be any
    one's doing; counted, a second crash is its own)."""
    return failure == "crashed" or (failure == "crashed_shared" and crashes_before > 0)


# vLLM samples greedily below this temperature (its _SAMPLING_EPS): a seed then changes
# nothing.
GREEDY_BELOW = 1e-5


def continuation_differs(sampling: Any) -> str | None:
    """Why a continuation (the tokens sent appended to the prompt, router/flow.py) of a
    request sampled with ``sampling`` (vLLM's ``SamplingParams``, read by attribute) would
    not give what an unfaulted run gives; None when it would (greedy, or random without a
    seed: any sample of the same distribution is as right as the unfaulted one)."""
    if getattr(sampling, "structured_outputs", None) is not None:
        return "its grammar would start again from its first state"
    if getattr(sampling, "presence_penalty", 0) or getattr(sampling, "frequency_penalty", 0):
        return "presence and frequency penalties count only the continuation's own tokens"
    if getattr(sampling, "bad_words", None):
        return "a bad word across the cut would not be seen"
    if (getattr(sampling, "seed", None) is not None
            and getattr(sampling, "temperature", 1.0) >= GREEDY_BELOW):
        return "a seeded sample's random sequence would start again from its seed"
    stop = getattr(sampling, "stop", None) or []
    if (not getattr(sampling, "include_stop_str_in_output", False)
            and max(map(len, stop), default=0) > 1):
        # vLLM holds back the last characters of a stream that may begin a stop string:
        # they never reached the client, and the continuation sees only its own text.
        return "text held back for its stop strings would be lost"
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds on retries (``router.retries`` in the config)."""

    prefill_attempts: int = 2     # on prefill replicas, before the decode engine prefills
    decode_attempts: int = 2      # decode runs started before the first token is sent
    max_migrations: int = 2       # continuations after tokens were sent
    max_retry_s: float = 60.0     # no new attempt this long after the request started

    prefill_cooldown_s: float = 10.0  # after a prefill pool failure, prompts skip it
    request_s: float | None = None    # the whole request's deadline (router.deadlines)

    @classmethod
    def from_config(cls, config: RetryConfig, request_s: float | None = None) -> RetryPolicy:
        return cls(prefill_attempts=config.prefill_attempts,
                   decode_attempts=config.decode_attempts,
                   max_migrations=config.max_migrations, max_retry_s=config.max_retry_s,
                   prefill_cooldown_s=config.prefill_cooldown_s, request_s=request_s)

    def _out_of_time(self, elapsed_s: float) -> bool:
        return elapsed_s >= self.max_retry_s or (
            self.request_s is not None and elapsed_s >= self.request_s)

    def after_prefill_failure(self, failure: Failure, attempts: int,
                              elapsed_s: float, pool_empty: bool = False,
                              crashes_before: int = 0) -> Action:
        """After the ``attempts``-th prefill attempt failed with ``failure``;
        ``pool_empty``: the pool has no replica left (a retry would wait for one);
        ``crashes_before``: engine crashes the request was in before this failure."""
        if quarantines(failure, crashes_before):
            return "quarantine"  # nor is it sent to a decode engine to prefill
        if failure not in RETRYABLE or self._out_of_time(elapsed_s):
            return "give_up"
        if attempts < self.prefill_attempts and not pool_empty:
            return "retry_prefill"
        return "decode_local"

    def after_decode_failure(self, failure: Failure, *, tokens_sent: int, attempts: int,
                             migrations: int, elapsed_s: float, choices: int,
                             inexact: bool, crashes_before: int = 0) -> Action:
        """After a decode run failed; ``attempts`` decode runs started so far, of which
        ``migrations`` were continuations; ``tokens_sent`` already reached the client;
        ``inexact``: a continuation would not give what an unfaulted run gives
        (``continuation_differs``); ``crashes_before``: engine crashes the request was in
        before this failure."""
        if quarantines(failure, crashes_before):
            return "quarantine"
        if failure not in RETRYABLE or self._out_of_time(elapsed_s):
            return "give_up"
        # A replica that died is never tried again, so retries after deaths are bounded
        # by the pool's size (and max_retry_s), not by the attempt counts: a whole pool
        # lost at once (a node) costs one failed call per replica, then the retry waits
        # for a replacement.
        died = failure == "died"
        if tokens_sent == 0:
            # Nothing sent: run it again; the decode engine prefills (the prefill's KV
            # may be gone with the replica that held the handle, or freed already).
            return "decode_local" if died or attempts < self.decode_attempts else "give_up"
        # Tokens sent: continuing is the only way to keep the stream whole.
        # Several choices stream interleaved: they cannot be continued one by one.
        if choices > 1 or inexact or (migrations >= self.max_migrations and not died):
            return "give_up"
        return "migrate"


class PoolBreaker:
    """Whether to send prompts to a pool that just failed (a circuit breaker; time passed in).

    The flow opens it when a prompt failed on every prefill attempt (the pool as a whole,
    not one replica, which a retry gets past). The pool is then skipped for
    ``cooldown_s``: while its replicas are being
    replaced, Serve would hold each new prompt until one is up (tens of seconds), when the
    decode engine could prefill it at once. After the cooldown prompts try the pool again;
    a success closes the breaker, a failure opens it for another cooldown.
    """

    def __init__(self, cooldown_s: float):
        self.cooldown_s = cooldown_s
        self._open_until = float("-inf")

    def allows(self, now: float) -> bool:
        return now >= self._open_until

    def failed(self, now: float) -> None:
        self._open_until = now + self.cooldown_s

    def succeeded(self) -> None:
        self._open_until = float("-inf")
