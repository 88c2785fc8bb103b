"""What a soak's answers add up to (pure): each answer judged against the same request's
unfaulted answer, the counts the run is judged by, TTFT percentiles per phase, and the
memory slope of the cluster's processes."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """One request's end as the client saw it."""

    kind: str                 # the workload's request kind, or "poison:<name>"
    phase: str                # "unfaulted" or "faulted"
    status: int | None        # HTTP status; None: no response (connection lost, timeout)
    text: str = ""            # what arrived
    finished: bool = False    # a finish_reason arrived (a stream ran to its end)
    error_code: int | None = None  # an error event's code inside a 200 stream
    ttft_s: float | None = None    # first text of a stream
    expected_status: int = 200     # a poison request's right answer


def verdict(answer: Answer, reference: str | None) -> str:
    """One of: ok, refused (the 4xx a request deserved), lost, truncated, altered, 5xx,
    migration_refused (a 503 event on a stream pdserve cannot continue exactly: penalties,
    held-back stop strings; router/retry.py), wrong_status (a poison answered otherwise
    than expected)."""
    if answer.status is None:
        return "lost"
    if answer.kind.startswith("poison:"):
        if answer.status == answer.expected_status:
            return "ok" if answer.status == 200 else "refused"
        return "5xx" if answer.status >= 500 else "wrong_status"
    if answer.status >= 500:
        return "5xx"
    if answer.status != 200:
        return "wrong_status"
    if answer.error_code is not None:
        return "migration_refused" if answer.error_code == 503 else "5xx"
    if reference is None or answer.text == reference:
        return "ok" if answer.finished else "truncated"
    if reference.startswith(answer.text) and not answer.finished:
        return "truncated"
    return "altered"


def tally(answers: Iterable[Answer], references: dict[str, str],
          key_of) -> dict[str, Counter]:
    """Verdict counts per phase; ``key_of(answer)`` names the request whose reference
    applies (None for a poison request)."""
    counts: dict[str, Counter] = {}
    for answer in answers:
        reference = references.get(key_of(answer)) if key_of(answer) is not None else None
        counts.setdefault(answer.phase, Counter())[verdict(answer, reference)] += 1
    return counts


def percentile(values: Sequence[float], share: float) -> float | None:
    """The ``share`` quantile by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1))
    return ordered[rank]


def slope_per_minute(samples: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) samples, per minute; None under two."""
    if len(samples) < 2:
        return None
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_v = sum(v for _, v in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    if spread == 0:
        return None
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread
