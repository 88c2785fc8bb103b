"""Where each request's time to its first event went, from pdserve's stage histogram (pure).

pdserve records every answered request's stages (``pdserve_request_stage_seconds``,
router/timing.py), and each engine the time a finished request spent queued and being
prefilled there (``pdserve_engine_request_seconds``, keyed here "<pool> engine <phase>"):
the engines' part of the router's ``prefill`` and ``first_token`` stages, the rest being
hops between processes. Of those hops the replicas time the ones to and from their engine
core (the same histogram's phases ``to_engine`` and ``from_engine``, keyed "<pool> replica
to engine" and "<pool> engine to replica"); what is left is Serve's calls, the routers
and the replicas' own code. A benchmark scrapes the Prometheus text before and after its run; the
difference is that run's requests alone, whatever ran before. Quantiles are read from the
bucket counts the way Prometheus's ``histogram_quantile`` does (linear within a bucket).
Means are exact: Ray's metrics exporter rebuilds a histogram's sum from the midpoints of
the buckets its observations fell in, so each observation is also summed into a counter
(``cluster/metrics.py``, EXACT_SUMS), and the means are read from those.
"""

from __future__ import annotations

import math
from collections import defaultdict

from cluster import metrics as m
from router.timing import STAGES

# (stage, series) -> value summed over processes and other labels; series is "sum",
# "count" or a bucket's upper bound.
StageSamples = dict[tuple[str, str], float]


# The engines' phases, in the order a disaggregated request meets them.
ENGINE_PARTS = tuple(f"{pool} engine {phase}" for pool in ("prefill", "decode")
                     for phase in ("queued", "prefill"))
# Each replica's hops to its engine core and back around those phases (vLLM's AsyncLLM:
# its input processing, the engine core's input socket; its output socket, AsyncLLM's
# output handler): serving time, which the engine process's own figures leave out.
HOP_PHASES = {"to_engine": "replica to engine", "from_engine": "engine to replica"}
HOP_PARTS = tuple(f"{pool} {name}" for pool in ("prefill", "decode")
                  for name in HOP_PHASES.values())


# vLLM's own server records the same two engine phases of each finished request (its
# ``FinishedRequestStats``, which pdserve's engines export as ``queued`` and ``prefill``),
# in histograms whose first bucket bound (0.3 s) is far too coarse for a median at this
# size; their sums are exact, so they give means.
VLLM_PHASES = {"vllm:request_queue_time_seconds": "engine queued",
               "vllm:request_prefill_time_seconds": "engine prefill"}
# (phase, "sum" or "count") -> value summed over engines and models
VllmPhaseTotals = dict[tuple[str, str], float]


def vllm_phase_totals(families) -> VllmPhaseTotals:
    """The ``VLLM_PHASES`` histograms' sums and counts out of a vLLM server's parsed
    ``/metrics``."""
    totals: VllmPhaseTotals = defaultdict(float)
    for family in families:
        phase = VLLM_PHASES.get(family.name)
        for sample in family.samples if phase else ():
            series = sample.name.rsplit("_", 1)[-1]
            if series in ("sum", "count"):
                totals[(phase, series)] += sample.value
    return dict(totals)


def vllm_phase_means(before: VllmPhaseTotals,
                     after: VllmPhaseTotals) -> dict[str, dict[str, float]]:
    """Per phase of the requests finished between two scrapes: requests and mean (s)."""
    result = {}
    for phase in VLLM_PHASES.values():
        count = after.get((phase, "count"), 0.0) - before.get((phase, "count"), 0.0)
        if count > 0:
            total = after.get((phase, "sum"), 0.0) - before.get((phase, "sum"), 0.0)
            result[phase] = {"requests": count, "mean_s": total / count}
    return result


def stage_samples(families) -> StageSamples:
    """The stage and engine-phase histograms' samples out of ``prometheus_client``'s
    parsed families."""
    samples: StageSamples = defaultdict(float)
    for family in families:
        for sample in family.samples:
            part, series = _part_of(sample)
            if part is None:
                continue
            key = sample.labels["le"] if series == "bucket" else series
            samples[(part, key)] += sample.value
    return dict(samples)


def _part_of(sample) -> tuple[str | None, str]:
    """The breakdown part a sample belongs to, and its series (bucket, sum, count, or
    ``exact_sum``: the histogram's companion counter, metrics.EXACT_SUMS)."""
    for spec in (m.STAGE, m.ENGINE_PHASE):
        exact_sum = m.EXACT_SUMS[spec.name].exported_name
        if sample.name == exact_sum or sample.name.startswith(spec.exported_name + "_"):
            series = ("exact_sum" if sample.name == exact_sum
                      else sample.name[len(spec.exported_name) + 1:])
            labels = sample.labels
            if spec is m.STAGE:
                return labels.get("stage"), series
            if "pool" in labels and "phase" in labels:
                pool, phase = labels["pool"], labels["phase"]
                if phase in HOP_PHASES:
                    return f"{pool} {HOP_PHASES[phase]}", series
                return f"{pool} engine {phase}", series
    return None, ""


def answered(before: StageSamples, after: StageSamples) -> int:
    """Requests recorded between the two scrapes (each records its first token's stage)."""
    return round(_delta(before, after, "first_token", "count"))


def decoded(before: StageSamples, after: StageSamples) -> int:
    """Requests the decode engines finished between the two scrapes (their phases are
    exported by the engine replicas, a few seconds apart from the router's stages)."""
    return round(_delta(before, after, "decode engine queued", "count"))


def breakdown(before: StageSamples, after: StageSamples) -> dict[str, dict[str, float]]:
    """Per stage that happened between the scrapes: requests, mean, p50 and p95 (s)."""
    result = {}
    for stage in (*STAGES, *ENGINE_PARTS, *HOP_PARTS):
        count = _delta(before, after, stage, "count")
        if count <= 0:
            continue
        buckets = sorted(
            (float(key), _delta(before, after, stage, key))
            for (name, key) in after
            if name == stage and key not in ("sum", "count", "exact_sum"))
        # the exact sum where the cluster exports it (one that predates it: the midpoints)
        total = (_delta(before, after, stage, "exact_sum") if (stage, "exact_sum") in after
                 else _delta(before, after, stage, "sum"))
        result[stage] = {
            "requests": count,
            "mean_s": total / count,
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
    lines = [f"  {'stage (ms)':<24}{'requests':>9}{'mean':>9}{'p50':>9}{'p95':>9}"]
    headings = {_first(stages, ENGINE_PARTS): "  of which in the engines:",
                _first(stages, HOP_PARTS): "  and between each replica and its engine:"}
    for stage, row in stages.items():
        if stage in headings:
            lines.append(headings[stage])
        lines.append(f"  {stage:<24}{row['requests']:>9.0f}{row['mean_s'] * 1000:>9.1f}"
                     f"{row['p50_s'] * 1000:>9.1f}{row['p95_s'] * 1000:>9.1f}")
    return "\n".join(lines)


def _first(stages: dict[str, dict[str, float]], parts: tuple[str, ...]) -> str | None:
    return next((stage for stage in stages if stage in parts), None)


def _delta(before: StageSamples, after: StageSamples, stage: str, key: str) -> float:
    return after.get((stage, key), 0.0) - before.get((stage, key), 0.0)
