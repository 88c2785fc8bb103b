"""The traffic a plan is sized for (pure): the benchmark's workloads as lengths only, at
a rate, and a day's rate curve around its peak."""

from __future__ import annotations

import math
import random

from cluster.bench.workload import WorkloadSpec, arrival_times, request_lengths
from cluster.planner.des import SimRequest


def requests(spec: WorkloadSpec, prefix_hit: float = 0.0) -> list[SimRequest]:
    """``spec``'s arrivals and lengths (the benchmark's distributions, seeded; no text),
    each prompt with ``prefix_hit`` of its tokens in the prefix cache of its engine."""
    if not 0 <= prefix_hit < 1:
        raise ValueError(f"a prefix-cache hit rate is in [0, 1), not {prefix_hit}")
    rng = random.Random(spec.seed)
    lengths = random.Random(spec.seed + 1)
    result = []
    for send_at in arrival_times(spec, rng):
        prompt, output, _ = request_lengths(spec, lengths)
        prompt = max(8, round(prompt * spec.scale))
        output = max(1, min(round(output * spec.scale), spec.max_model_len - prompt - 16))
        result.append(SimRequest(send_at, prompt, output, int(prompt * prefix_hit)))
    return result


def mean_lengths(spec: WorkloadSpec, samples: int = 20_000) -> tuple[float, float]:
    """Mean prompt and output tokens of ``spec``'s requests (by sampling)."""
    rng = random.Random(spec.seed + 7)
    drawn = [request_lengths(spec, rng) for _ in range(samples)]
    return (sum(p for p, _, _ in drawn) / samples * spec.scale,
            sum(o for _, o, _ in drawn) / samples * spec.scale)


def diurnal_shape(peak_to_mean: float, night_share: float = 0.05,
                  hours: int = 24) -> list[float]:
    """Each hour's rate as a share of the peak hour's, for a day whose peak is
    ``peak_to_mean`` times its mean: ``night_share`` of the peak all day, plus one evening
    bump (a von Mises curve, its concentration solved for the ratio). The reference
    scenario: 5,200 requests/s at peak against 75 M a day (868/s on average), a ratio of 6.
    """
    if not 0 <= night_share < 1 / peak_to_mean <= 1:
        raise ValueError("need peak_to_mean >= 1 and night_share below 1 / peak_to_mean")

    def shape(kappa: float) -> list[float]:
        return [night_share + (1 - night_share)
                * math.exp(kappa * (math.cos(2 * math.pi * h / hours) - 1))
                for h in range(hours)]

    low, high = 0.0, 500.0
    for _ in range(100):
        kappa = (low + high) / 2
        if hours / sum(shape(kappa)) < peak_to_mean:
            low = kappa
        else:
            high = kappa
    return shape((low + high) / 2)
