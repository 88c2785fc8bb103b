"""What an engine replica reports to its pool's autoscaling policy (pure; time passed in).

Serve polls ``record_autoscaling_stats()`` on every replica and averages the values over
``look_back_period_s``; the policy (cluster.autoscaling) reads the names below. Latency
percentiles come from a sliding window of this replica's own observations; rates are
counter deltas between two reports. A replica that observed no latency in the window
leaves that key out, so an idle replica does not pull the pool's p95 down to 0.
"""

from __future__ import annotations

from collections import deque

from cluster.engine.stats import EngineStats
from cluster.percentile import percentile

# The names cluster.autoscaling's policies read (part of the engine side: a change here
# must restart engines, cluster.app.ENGINE_SOURCES).
QUEUED_PREFILL_TOKENS = "queued_prefill_tokens"  # prefill: prompt tokens waiting + in prefill
TTFT_P95_S = "ttft_p95_s"                        # prefill: p95 arrival -> prefill done, seconds
PROMPT_TOKENS_PER_S = "prompt_tokens_per_s"      # prefill: prompt tokens prefilled per second
RUNNING_SEQS = "running_seqs"                    # decode: sequences being decoded
KV_USAGE = "kv_usage"                            # decode: KV-cache blocks in use, 0..1
ITL_P95_S = "itl_p95_s"                          # decode: p95 inter-token latency, seconds
OUTPUT_TOKENS_PER_S = "output_tokens_per_s"      # decode: tokens generated per second

PREFILL_METRICS = (QUEUED_PREFILL_TOKENS, TTFT_P95_S, PROMPT_TOKENS_PER_S)
DECODE_METRICS = (RUNNING_SEQS, KV_USAGE, ITL_P95_S, OUTPUT_TOKENS_PER_S)

WINDOW_S = 30.0
MAX_SAMPLES = 20_000  # per window: memory stays bounded at any request rate


class LatencyWindow:
    """The latencies observed in the last ``window_s`` seconds."""

    def __init__(self, window_s: float = WINDOW_S, max_samples: int = MAX_SAMPLES):
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def observe(self, now: float, seconds: float) -> None:
        self._samples.append((now, seconds))

    def p95(self, now: float) -> float | None:
        while self._samples and self._samples[0][0] <= now - self._window_s:
            self._samples.popleft()
        return percentile((value for _, value in self._samples), 95)


class RateMeter:
    """Per-second rate of a counter between consecutive reads."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None

    def rate(self, now: float, count: int) -> float:
        last, self._last = self._last, (now, count)
        if last is None or now <= last[0]:
            return 0.0
        return max(0, count - last[1]) / (now - last[0])


class LoadReporter:
    """One engine's autoscaling metrics, from its ``EngineStats`` and observed latencies.

    The prefill pool's latency is the time from a request reaching the engine to its prompt
    being prefilled (the part of TTFT this pool adds); the decode pool's is the gap between
    generated tokens.
    """

    def __init__(self, role: str, window_s: float = WINDOW_S):
        self.role = role
        self.latency = LatencyWindow(window_s)
        self._rate = RateMeter()

    def report(self, stats: EngineStats, now: float) -> dict[str, float]:
        p95 = self.latency.p95(now)
        if self.role == "prefill":
            prompt_tokens = stats.prompt_tokens_computed + stats.prompt_tokens_cached
            report = {QUEUED_PREFILL_TOKENS: float(max(0, stats.queued_prefill_tokens)),
                      PROMPT_TOKENS_PER_S: self._rate.rate(now, prompt_tokens)}
            latency_key = TTFT_P95_S
        else:
            report = {RUNNING_SEQS: float(stats.num_running),
                      KV_USAGE: float(stats.kv_cache_usage),
                      OUTPUT_TOKENS_PER_S: self._rate.rate(now, stats.generation_tokens)}
            latency_key = ITL_P95_S
        if p95 is not None:
            report[latency_key] = p95
        return report
