"""The serving layer's cost in a replay, and how it grows with load (pure).

What the engines' step costs leave out is the serving layer: the hops of a request
through the proxy, the router and the replicas, and the processes that relay every
streamed token. On a machine where those processes share the engines' cores (this
project's test machine), their cost is not a constant. Their event loops are a queue
whose busy share grows with the tokens streamed per second, so a new request waits longer
for them, and the decode engine's steps share a core with them. The model:

    busy            = load_s * streamed tokens/s        (each part its own load_s)
    TTFT added      = (ttft_s + ttft_per_prompt_token_s * prompt tokens) / (1 - busy)
    decode steps    = the engine's * decode_slowdown / (1 - busy)

``ttft_per_prompt_token_s`` is the part that grows with the prompt: tokenizing, hashing
and relaying a longer request. Fitted on runs at two or more loads
(``fit_serving_cost``), it predicts the others; fitted on one, it is the constants it
was before (no load term). Where ``busy`` would reach 1 it is held at ``MAX_BUSY``: the
model says "saturated" there, not how long the queue grows.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MAX_BUSY = 0.95
# Runs whose streamed tokens/s lie closer together than this share of the highest are one
# load: their differences are the measurement's noise, not growth with load.
DISTINCT_LOADS = 0.25


@dataclass(frozen=True)
class ServingCost:
    ttft_s: float = 0.0                     # added to each TTFT at no load
    ttft_per_prompt_token_s: float = 0.0    # ... and per prompt token
    decode_slowdown: float = 1.0            # decode steps over the engine alone's, no load
    ttft_load_s: float = 0.0                # the hops' busy share per streamed token/s
    decode_load_s: float = 0.0              # the decode core's, taken by relaying

    def ttft_added(self, prompt_tokens: int, streamed_per_s: float) -> float:
        """Seconds the serving layer adds to a TTFT at this load."""
        return ((self.ttft_s + self.ttft_per_prompt_token_s * prompt_tokens)
                / _idle(self.ttft_load_s * streamed_per_s))

    def decode_factor(self, streamed_per_s: float) -> float:
        """The decode engine's steps at this load, over the engine alone's."""
        return self.decode_slowdown / _idle(self.decode_load_s * streamed_per_s)


def _idle(busy: float) -> float:
    return 1.0 - min(max(busy, 0.0), MAX_BUSY)


@dataclass(frozen=True)
class LoadPoint:
    """What one fitting run says about the serving layer at its load."""

    streamed_per_s: float           # the run's streamed tokens/s
    decode_slowdown: float          # the factor that makes its decode p50 the measured one
    # its TTFT residuals (measured minus the engines' simulated part) as a line in the
    # prompt's tokens: the slope, and the intercept that makes the TTFT p50 the measured
    ttft_s: float
    ttft_per_prompt_token_s: float


def streamed_per_s(first_sent_s: float, last_token_s: float, tokens: int) -> float:
    """A run's streamed tokens/s: every token it streamed over the time from its first
    request sent to its last token out (the same measure for a run and its replay)."""
    return tokens / max(last_token_s - first_sent_s, 1e-9)


def residual_slope(prompt_tokens: Sequence[int], residuals_s: Sequence[float]) -> float:
    """How the TTFT residuals grow with the prompt's tokens, robust to the few requests
    that queued: the median of the slopes between every two requests, each pair weighted
    by how far apart their prompts are (a weighted Theil-Sen), kept non-negative (more
    prompt never costs less)."""
    points = list(zip(prompt_tokens, residuals_s, strict=True))
    slopes = [((y2 - y1) / (x2 - x1), abs(x2 - x1))
              for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
    return max(0.0, _weighted_median(slopes)) if slopes else 0.0


def _weighted_median(values: Sequence[tuple[float, float]]) -> float:
    """The value below which half of the weight lies, of (value, weight) pairs."""
    ordered = sorted(values)
    half, seen = sum(w for _, w in ordered) / 2, 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def fit_serving_cost(points: Sequence[LoadPoint]) -> ServingCost:
    """The serving cost through the fitting runs' points. ``x / (1 - load * R)`` has an
    inverse that is a line in R, so each part's no-load value and load term come from a
    least-squares line through (R, 1 / value). With one load (runs within
    ``DISTINCT_LOADS`` of each other), or a line that would make load lower the cost, the
    part is a constant: the mean of its points."""
    if not points:
        raise ValueError("no runs to fit the serving cost on")
    rates = [p.streamed_per_s for p in points]
    decode_slowdown, decode_load = _inverse_line(rates, [p.decode_slowdown for p in points])
    ttft_s, ttft_load = _inverse_line(rates, [p.ttft_s for p in points])
    per_prompt = statistics.fmean(p.ttft_per_prompt_token_s * _idle(ttft_load * r)
                                  for p, r in zip(points, rates, strict=True))
    return ServingCost(ttft_s, per_prompt, decode_slowdown, ttft_load, decode_load)


def _inverse_line(rates: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """(value at no load, load_s) with ``value = at_zero / (1 - load_s * rate)``."""
    if min(values) <= 0:
        return statistics.fmean(values), 0.0
    inverses = [1.0 / v for v in values]
    mean_r, mean_inverse = statistics.fmean(rates), statistics.fmean(inverses)
    spread = sum((r - mean_r) ** 2 for r in rates)
    if max(rates) - min(rates) > DISTINCT_LOADS * max(rates):
        slope = sum((r - mean_r) * (i - mean_inverse) for r, i in
                    zip(rates, inverses, strict=True)) / spread
        intercept = mean_inverse - slope * mean_r
        if slope < 0 < intercept:
            return 1.0 / intercept, -slope / intercept
    return statistics.fmean(values), 0.0
