"""Where each request's time to its first event went, from pdserve's stage histogram (pure).

pdserve records every answered request's stages (``pdserve_request_stage_seconds``,
router/timing.py). A benchmark scrapes the Prometheus text before and after its run; the
difference is that run's requests alone, whatever ran before. Quantiles are read from the
bucket counts the way Prometheus's ``histogram_quantile`` does (linear within a bucket).
Means are approximate too: Ray's metrics exporter rebuilds a histogram's sum from the
midpoints of the buckets its observations fell in (``cluster/metrics.py``, STAGE_BUCKETS).
"""

from __future__ import annotations

import math
from collections import defaultdict

from cluster import metrics as m
from router.timing import STAGES

# (stage, series) -> value summed over processes and other labels; series is "sum",
# "count" or a bucket's upper bound.
StageSamples = dict[tuple[str, str], float]


def stage_samples(families) -> StageSamples:
    """The stage histogram's samples out of ``prometheus_client``'s parsed families."""
    name = m.STAGE.exported_name
    samples: StageSamples = defaultdict(float)
    for family in families:
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if stage is None or not sample.name.startswith(name):
                continue
            series = sample.name[len(name) + 1:]  # bucket, sum or count
            key = sample.labels["le"] if series == "bucket" else series
            samples[(stage, key)] += sample.value
    return dict(samples)


def answered(before: StageSamples, after: StageSamples) -> int:
    """Requests recorded between the two scrapes (each records its first token's stage)."""
    return round(_delta(before, after, "first_token", "count"))


def breakdown(before: StageSamples, after: StageSamples) -> dict[str, dict[str, float]]:
    """Per stage that happened between the scrapes: requests, mean, p50 and p95 (s)."""
    result = {}
    for stage in STAGES:
        count = _delta(before, after, stage, "count")
        if count <= 0:
            continue
        buckets = sorted(
            (float(key), _delta(before, after, stage, key))
            for (name, key) in after if name == stage and key not in ("sum", "count"))
        result[stage] = {
            "requests": count,
            "mean_s": _delta(before, after, stage, "sum") / count,
            "p50_s": quantile(0.5, buckets),
            "p95_s": quantile(0.95, buckets),
        }
    return result


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """``histogram_quantile(q)`` of cumulative ``(upper bound, count)`` buckets."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(upper):  # beyond the last finite bound: that bound
                return lower
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, cumulative
    return lower


def table(stages: dict[str, dict[str, float]]) -> str:
    """The breakdown as `pdserve bench` prints it (milliseconds)."""
    lines = [f"  {'stage (ms)':<13}{'requests':>9}{'mean':>9}{'p50':>9}{'p95':>9}"]
    for stage, row in stages.items():
        lines.append(f"  {stage:<13}{row['requests']:>9.0f}{row['mean_s'] * 1000:>9.1f}"
                     f"{row['p50_s'] * 1000:>9.1f}{row['p95_s'] * 1000:>9.1f}")
    return "\n".join(lines)


def _delta(before: StageSamples, after: StageSamples, stage: str, key: str) -> float:
    return after.get((stage, key), 0.0) - before.get((stage, key), 0.0)
