"""Request metrics of the router (shell: applies ``RequestTimer`` results to the recorder).

Module-level so that the ingress's exception handlers and its request path share one
recorder per router process.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cluster import metrics as m
from cluster.recorder import Recorder
from router.timing import RequestTimer

RECORDER = Recorder()

# Requests refused before their model is known are counted under this label.
UNKNOWN = "unknown"


def count_refusal(status: int, model: str = UNKNOWN, version: str = UNKNOWN) -> None:
    """Count a request answered with an error status before it reached the engines."""
    tags = {"model": model, "version": version, "path": UNKNOWN,
            "outcome": m.outcome_for_status(status)}
    RECORDER.inc(m.REQUESTS, tags)


def retry_counter(version: str, on_fault: Callable[[str], None] = lambda request_id: None,
                  ) -> Callable[[str, str, str, str], None]:
    """What the flow of ``version`` calls when a stage failed: counts it with the action
    the retry policy chose (``pdserve_retries_total``) and tells ``on_fault`` which
    request it was."""
    def count(stage: str, reason: str, action: str, request_id: str) -> None:
        RECORDER.inc(m.RETRIES, {"version": version, "stage": stage, "reason": reason,
                                 "action": action})
        on_fault(request_id)
    return count


class RequestObserver:
    """Times one admitted request and records its metrics exactly once when it ends."""

    def __init__(self, model: str, version: str, arrival: float, clock=time.monotonic,
                 on_finish: Callable[[str, str, m.Outcome, RequestTimer, bool], None]
                 | None = None):
        """``on_finish(model, version, outcome, timer, faulted)`` is called once when it
        ends (the canary gate's samples); ``faulted``: a stage of it failed on the way,
        whether or not a retry saved it."""
        # The path is known once the prompt is rendered (``routed``).
        self._tags = {"model": model, "version": version, "path": UNKNOWN}
        self._on_finish = on_finish
        self._clock = clock
        self._prompt_tokens = 0
        self._done = False
        self._faulted = False
        self._prompts = self._cached_prompts = 0
        self.timer = RequestTimer(arrival=arrival)

    def routed(self, path: str, prompt_tokens: int) -> None:
        """The rendered prompt's length and the path it takes (prompts of a batch add up)."""
        self._tags["path"] = path
        self._prompt_tokens += prompt_tokens
        self._prompts += 1

    def served_from_cache(self, prompt_tokens: int) -> None:
        """A prompt was answered from the response cache. A request all of whose prompts
        were is counted under the path "cache", and kept out of the latency histograms and
        the canary gate: a replay measures neither the engines nor the version."""
        self.routed("cache", prompt_tokens)
        self._cached_prompts += 1

    def faulted(self) -> None:
        """A stage of this request failed (the retry policy decided what followed)."""
        self._faulted = True

    def rendered(self) -> None:
        """vLLM's layer handed the rendered prompt over."""
        self.timer.render(self._clock())

    def dispatched(self) -> None:
        self.timer.dispatch(self._clock())

    def prefilled(self) -> None:
        """The prefill pool returned the prompt's KV handle."""
        self.timer.prefill(self._clock())

    def answered(self) -> None:
        """The answer's first bytes are out (a stream's first event, a unary answer)."""
        self.timer.answer(self._clock())

    def tokens(self, count: int) -> None:
        """``count`` new tokens arrived together (one engine output)."""
        self.timer.chunk(self._clock(), count)

    def finish(self, outcome: m.Outcome) -> None:
        if self._done:
            return
        self._done = True
        if self._prompts and self._cached_prompts == self._prompts:
            RECORDER.inc(m.REQUESTS, {**self._tags, "outcome": outcome})
            return
        if self._on_finish is not None:
            self._on_finish(self._tags["model"], self._tags["version"], outcome, self.timer,
                            self._faulted)
        RECORDER.inc(m.REQUESTS, {**self._tags, "outcome": outcome})
        timer = self.timer
        if timer.queue_time is not None:
            RECORDER.observe(m.QUEUE, self._tags, timer.queue_time)
        if outcome != "ok":
            return
        RECORDER.inc(m.PROMPT_TOKENS, self._tags, self._prompt_tokens)
        RECORDER.inc(m.GENERATION_TOKENS, self._tags, timer.tokens)
        RECORDER.inc(m.OUTPUT_CHUNKS, self._tags, timer.chunks)
        if timer.ttft is not None:
            RECORDER.observe(m.TTFT, self._tags, timer.ttft)
        if timer.e2e is not None:
            RECORDER.observe(m.E2E, self._tags, timer.e2e)
        for gap in timer.inter_token_gaps:
            RECORDER.observe(m.ITL, self._tags, gap)
        for stage, seconds in timer.stages().items():
            RECORDER.observe(m.STAGE, {**self._tags, "stage": stage}, seconds)
