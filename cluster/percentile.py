"""Percentiles of observed values (pure): the one definition behind every p50/p95/p99.

The canary gate compares a canary's p95 with its baseline's, the autoscaling policies
compare a pool's p95 with its SLO, and the benchmark reports p95s against the same SLOs;
all of them call ``percentile`` here, so "p95" means the same thing wherever it appears.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0 <= q <= 100) of ``values`` by nearest rank; None if empty.

    Nearest rank: the smallest observed value with at least ``q`` percent of the values at
    or below it (the ``ceil(q * n / 100)``-th smallest; ``q = 0`` gives the minimum).

    Chosen over linear interpolation because an SLO reads "95% of requests get their first
    token within 500 ms", and the nearest-rank p95 is exactly the bound that statement
    needs: at least 95% of the samples are at or below it, and it is a latency some
    request really had. Linear interpolation reports a value between two samples that no
    request had and, on the small samples of a canary window or a benchmark class, loses
    that guarantee: over 57 requests its p95 lies between the 4th- and 3rd-slowest, with
    only 54 of 57 (94.7%) at or below it. The median of an even count is the lower of the
    two middle values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    # q * n / 100 rather than q / 100 * n: exact for integer q and n, so a rank that
    # should be whole (95% of 20 = 19) is not pushed to the next one by float rounding.
    rank = math.ceil(q * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]


def p95(values: Iterable[float]) -> float | None:
    """The nearest-rank 95th percentile of ``values``; None when empty."""
    return percentile(values, 95)
