"""The cluster's service-level objectives, one set for every reader (pure: pydantic only).

``PDServeConfig.slo`` is the one home of these numbers: the pools' autoscaling policies
scale out when a pool breaks them, the Grafana dashboard draws them as SLO lines, and the
benchmark counts a request as goodput when it meets them. A module of its own because the
autoscaling and benchmark modules read it and ``cluster.config`` imports both.
"""

from __future__ import annotations

from pydantic import Field

from cluster.strict import StrictModel


class SLOConfig(StrictModel):
    """Latency objectives of the served model, in seconds."""

    ttft_p95_s: float = Field(
        0.5, gt=0,
        description="p95 time to first token: the reference scenario's objective (under "
        "500 ms at the evening peak); the prefill pool scales out above it",
    )
    itl_p95_s: float = Field(
        0.05, gt=0,
        description="p95 inter-token latency: 50 ms (20 tokens/s per stream, faster than "
        "people read) is what the decode pool has always been scaled for; the decode pool "
        "scales out above it",
    )
    tpot_s: float = Field(
        0.1, gt=0,
        description="most mean time per output token (after the first) of one request that "
        "still counts as goodput in `pdserve bench`; 100 ms, the benchmark's target since "
        "its first published runs, so goodput figures stay comparable. Looser than "
        "itl_p95_s because it judges one request's mean, not the pool's tail",
    )
