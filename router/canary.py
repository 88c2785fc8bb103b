"""The canary gate (pure): promote a canary step by step, hold, or roll it back.

``decide`` compares the canary with the baseline over one window of ``WindowStats``
(``OutcomeWindow`` builds them from per-request outcomes): roll back at once when the
canary is clearly worse, hold while either side has too few requests or a window has not
passed since the last change, else promote to the next of ``CanaryPolicy.steps`` (100: the
canary becomes the baseline). It reads no clock, and the evaluation command's veto is an
input too, asked for only once ``decide`` would promote. Why: docs/design.md, "Model
versions: their own pools, sticky weighted choice, a gate that steps".
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from cluster.percentile import p95

if TYPE_CHECKING:
    from cluster.config import CanaryConfig

Action = Literal["promote", "hold", "rollback"]
_SLACK = 1e-9  # thresholds are inclusive: a value equal to one up to float rounding passes


@dataclass(frozen=True)
class CanaryPolicy:
    """The gate's thresholds. Built with :meth:`from_config`: defaults and validation live
    in ``CanaryConfig`` (steps rising to 100, latency ratios of at least 1, ...)."""

    steps: tuple[int, ...]          # canary percentages, in order, ending at 100
    window_s: float                 # judge over this long, and wait this long per step
    min_requests: int               # per side, in the window, before judging at all
    max_error_rate_delta: float     # absolute: 0.01 = one percentage point worse
    max_ttft_p95_ratio: float       # canary p95 TTFT / baseline p95 TTFT
    max_itl_p95_ratio: float        # canary p95 inter-token latency / baseline's
    rollback_on_veto: bool          # an evaluation veto rolls back instead of holding
    max_samples_per_version: int    # memory bound of an OutcomeWindow

    @classmethod
    def from_config(cls, config: CanaryConfig) -> CanaryPolicy:
        """The gate of a validated ``canary`` section."""
        return cls(
            steps=tuple(config.steps), window_s=config.window_s,
            min_requests=config.min_requests, max_error_rate_delta=config.max_error_rate_delta,
            max_ttft_p95_ratio=config.max_ttft_p95_ratio,
            max_itl_p95_ratio=config.max_itl_p95_ratio,
            rollback_on_veto=config.rollback_on_veto,
            max_samples_per_version=config.max_samples_per_version,
        )

    def next_step(self, percent: int) -> int:
        """The step after ``percent`` (which must be 0 or one of the steps, not 100)."""
        return next(step for step in self.steps if step > percent)


@dataclass(frozen=True)
class WindowStats:
    """One version's outcomes over the window."""

    requests: int
    errors: int
    ttft_p95_s: float | None  # None: no request in the window reported a first token
    itl_p95_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class GateDecision:
    action: Action
    from_percent: int
    to_percent: int
    reason: str

    @property
    def completes_rollout(self) -> bool:
        """True when the canary has just become the new baseline."""
        return self.action == "promote" and self.to_percent == 100


class Outcome(NamedTuple):
    t: float
    ok: bool
    ttft_s: float | None
    itl_s: float | None


class OutcomeWindow:
    """Per-version request outcomes over the last ``window_s`` seconds, time passed in.

    ``itl_s`` is one number per request (its mean inter-token latency), so the p95 is over
    requests. Percentiles are exact over the samples kept; at most
    ``max_samples_per_version`` samples are kept per version (the newest), which bounds
    memory and, at high traffic, makes the statistics those of the newest samples.
    """

    def __init__(self, window_s: float, max_samples_per_version: int = 10_000):
        if window_s <= 0 or max_samples_per_version < 1:
            raise ValueError("window_s > 0 and max_samples_per_version >= 1 required")
        self.window_s = window_s
        self._cap = max_samples_per_version
        self._samples: dict[str, deque[Outcome]] = {}

    @classmethod
    def for_policy(cls, policy: CanaryPolicy) -> OutcomeWindow:
        return cls(policy.window_s, policy.max_samples_per_version)

    def record(self, t: float, version: str, ok: bool, ttft_s: float | None = None,
               itl_s: float | None = None) -> None:
        """One finished request of ``version`` at time ``t``."""
        samples = self._samples.setdefault(version, deque(maxlen=self._cap))
        samples.append(Outcome(t, ok, ttft_s, itl_s))

    def stats(self, version: str, now: float) -> WindowStats:
        """``version``'s outcomes with ``now - window_s < t <= now``."""
        start = now - self.window_s
        samples = self._samples.get(version, deque())
        while samples and samples[0].t <= start:  # recorded in time order: drop the expired
            samples.popleft()
        # a sample recorded out of time order may sit behind a newer one: filter every time
        kept = [s for s in samples if start < s.t <= now]
        return WindowStats(
            requests=len(kept),
            errors=sum(1 for s in kept if not s.ok),
            ttft_p95_s=p95([s.ttft_s for s in kept if s.ttft_s is not None]),
            itl_p95_s=p95([s.itl_s for s in kept if s.itl_s is not None]),
        )

    def forget(self, version: str) -> None:
        """Drop a version's samples (it was rolled back, or it is no longer served)."""
        self._samples.pop(version, None)


def decide(policy: CanaryPolicy, current_percent: int, baseline: WindowStats,
           canary: WindowStats, veto: bool | None, now: float, last_change_at: float,
           *, veto_reason: str = "") -> GateDecision:
    """Promote, hold or roll back the canary now at ``current_percent``.

    ``veto``: the evaluation command's verdict on promoting (True: it said no; None: not
    run). ``last_change_at``: when the canary's percent last changed (or the rollout began).
    ``current_percent`` must be 0, 100 or one of the steps; at 0 (not running or rolled
    back) and at 100 (done) the gate only holds: restarting a rollout is an operator's act.
    """
    if current_percent not in policy.steps and current_percent != 0:
        raise ValueError(f"current_percent {current_percent} is neither 0 nor in {policy.steps}")
    if current_percent == 0:
        return _hold(current_percent, "no canary traffic (0%): nothing to judge")
    if current_percent == 100:
        return _hold(current_percent, "rollout complete: the canary is the baseline")
    too_few = _too_few(policy, baseline, canary)
    if too_few:
        return _hold(current_percent, too_few)
    checks = _checks(policy, baseline, canary)
    failed = [text for text, ok in checks if not ok]
    if failed:
        return GateDecision("rollback", current_percent, 0,
                            f"canary worse than baseline: {'; '.join(failed)}; "
                            f"roll back {current_percent}% -> 0%")
    waited = now - last_change_at
    if waited < policy.window_s:
        return _hold(current_percent, f"{waited:.0f}s of {policy.window_s:.0f}s since the "
                                      f"change to {current_percent}%: wait a full window")
    if veto:
        said = f": {veto_reason}" if veto_reason else ""
        if policy.rollback_on_veto:
            return GateDecision("rollback", current_percent, 0,
                                f"evaluation vetoed{said}; roll back {current_percent}% -> 0%")
        return _hold(current_percent, f"evaluation vetoed promotion{said}")
    return _promote(policy, current_percent, checks)


def _hold(percent: int, reason: str) -> GateDecision:
    return GateDecision("hold", percent, percent, f"hold at {percent}%: {reason}")


def _promote(policy: CanaryPolicy, percent: int, checks: list[tuple[str, bool]]) -> GateDecision:
    to = policy.next_step(percent)
    healthy = "; ".join(text for text, _ in checks)
    reason = f"canary healthy over {policy.window_s:.0f}s ({healthy}); promote {percent}% -> {to}%"
    if to == 100:
        reason += ": the canary becomes the new baseline"
    return GateDecision("promote", percent, to, reason)


def _too_few(policy: CanaryPolicy, baseline: WindowStats, canary: WindowStats) -> str:
    """Why there are too few requests to judge, or "" when there are enough."""
    short = [f"{side} has {stats.requests}/{policy.min_requests} requests in the window"
             for side, stats in (("canary", canary), ("baseline", baseline))
             if stats.requests < policy.min_requests]
    return ", ".join(short)


def _checks(policy: CanaryPolicy, baseline: WindowStats,
            canary: WindowStats) -> list[tuple[str, bool]]:
    """Each comparison as (text with the numbers, within its threshold)."""
    delta = canary.error_rate - baseline.error_rate
    checks = [(f"error rate {canary.error_rate:.2%} vs {baseline.error_rate:.2%} "
               f"(delta {delta * 100:+.2f} pp, limit {policy.max_error_rate_delta * 100:.2f} pp)",
               delta <= policy.max_error_rate_delta + _SLACK)]
    for name, c, b, limit in (
            ("TTFT", canary.ttft_p95_s, baseline.ttft_p95_s, policy.max_ttft_p95_ratio),
            ("ITL", canary.itl_p95_s, baseline.itl_p95_s, policy.max_itl_p95_ratio)):
        if c is None or b is None:
            continue  # nothing to compare (e.g. every request failed: the error check sees it)
        ratio = c / b if b > 0 else (math.inf if c > 0 else 1.0)
        checks.append((f"p95 {name} {c:.3f}s vs {b:.3f}s ({ratio:.2f}x, limit {limit:g}x)",
                       ratio <= limit + _SLACK))
    return checks
