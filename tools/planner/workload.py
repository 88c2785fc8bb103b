"""The traffic a plan is sized for (pure): the benchmark's workloads as lengths only, at
a rate (with their shared heads and conversations), or a recorded trace's lengths and
burstiness (tools/planner/trace_workload.py), and a day's rate curve around its peak."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from tools.bench.workload import (
    WorkloadSpec,
    arrival_times,
    lognormal_with_mean,
    request_lengths,
)
from tools.planner.des import (
    AnswerReuse,
    SimRequest,
    check_answer_reuse,
    repeated_tokens,
)
from tools.planner.trace_workload import trace_of


def requests(spec: WorkloadSpec, prefix_hit: float = 0.0,
             answer_reuse: AnswerReuse = 1.0) -> list[SimRequest]:
    """``spec``'s requests as the benchmark plans them (tools/bench/workload.py ``plan``),
    lengths only (no text; seeded, not token for token the benchmark's): conversations of
    ``turns`` whose first turns arrive at ``rate / turns``, every first prompt behind one
    of ``prefix_groups`` shared heads of ``shared_prefix_tokens`` when that is set, and
    each later turn the history plus a new message. ``prefix_hit``: a share of every
    prompt assumed in the prefix cache of its engine, beside what the simulation finds
    there. ``answer_reuse``: the share of an answer that the next turn's prompt repeats
    token for token (a history sent as text is tokenized again, and an answer's text need
    not give back its tokens: docs/planning.md), or measured shares each later turn draws
    one of; the rest of the history is new tokens."""
    if not 0 <= prefix_hit < 1:
        raise ValueError(f"a prefix-cache hit rate is in [0, 1), not {prefix_hit}")
    check_answer_reuse(answer_reuse)
    conversations = -(-spec.num_requests // spec.turns)
    first = first_turns(replace(spec, num_requests=conversations,
                                 rate=spec.rate / spec.turns), prefix_hit)
    return first + _later_turns(spec, first, prefix_hit, answer_reuse)


def first_turns(spec: WorkloadSpec, prefix_hit: float) -> list[SimRequest]:
    """``spec.num_requests`` first turns at ``spec.rate``, as ``requests`` builds them
    (lengths, shared heads, the prefix-cache share), seeded."""
    rng = random.Random(spec.seed)
    lengths = random.Random(spec.seed + 1)
    groups = random.Random(spec.seed + 3)
    shared = spec.shared_prefix_tokens
    result = []
    for index, send_at in enumerate(_arrival_times(spec, rng)):
        prompt, output = _lengths(spec, lengths)
        prompt = max(8, round(prompt * spec.scale))
        group = groups.randrange(spec.prefix_groups) if shared else -1
        if shared:   # the head, then at least the request's own few tokens
            prompt = max(prompt, shared + 8)
        output = max(1, min(round(output * spec.scale), spec.max_model_len - prompt - 16))
        result.append(SimRequest(send_at, prompt, output, int(prompt * prefix_hit),
                                 group=group, group_tokens=shared if shared else 0,
                                 conversation=index if spec.turns > 1 else -1))
    return result


def _arrival_times(spec: WorkloadSpec, rng: random.Random) -> list[float]:
    """``spec.num_requests`` arrivals at ``spec.rate``: its trace's burstiness, or the
    drawn workloads' Poisson."""
    trace = trace_of(spec)
    if trace is None:
        return arrival_times(spec, rng)
    return trace.arrival_times(spec.rate, spec.num_requests, rng)


def _lengths(spec: WorkloadSpec, rng: random.Random) -> tuple[int, int]:
    """One request's prompt and output tokens, before scaling: a pair of its trace's, or
    drawn as the benchmark draws them."""
    trace = trace_of(spec)
    if trace is None:
        return request_lengths(spec, rng)[:2]
    return trace.draw_lengths(rng)


def _later_turns(spec: WorkloadSpec, first: list[SimRequest], prefix_hit: float,
                 answer_reuse: AnswerReuse) -> list[SimRequest]:
    """Turns 2.. until ``num_requests`` in all, as the benchmark's: each a think time after
    the answer before it; a conversation whose history would not fit the context ends."""
    rng = random.Random(spec.seed + 4)
    reuse = random.Random(spec.seed + 5)
    latest: list[int | None] = list(range(len(first)))
    result = list(first)
    for _turn in range(2, spec.turns + 1):
        for conversation, previous in enumerate(latest):
            if len(result) >= spec.num_requests:
                return result[len(first):]
            if previous is None:
                continue
            before = result[previous]
            message = max(4, round(lognormal_with_mean(rng, spec.message_tokens, 0.5)
                                   * spec.scale))
            history = before.prompt_tokens + before.output_tokens + message
            output = max(1, round(request_lengths(spec, rng)[1] * spec.scale))
            if history + output + 16 > spec.max_model_len:
                latest[conversation] = None
                continue
            think_s = rng.expovariate(1 / spec.think_s) if spec.think_s else 0.0
            latest[conversation] = len(result)
            repeated = repeated_tokens(before, answer_reuse, reuse)
            result.append(replace(before, arrival_s=0.0, prompt_tokens=history,
                                  output_tokens=output,
                                  cached_tokens=int(history * prefix_hit),
                                  versions=before.next_versions(repeated),
                                  follows=previous, think_s=think_s))
    return result[len(first):]


def mean_lengths(spec: WorkloadSpec, samples: int = 20_000) -> tuple[float, float]:
    """Mean prompt and output tokens of ``spec``'s requests (by sampling; a trace's
    exactly)."""
    trace = trace_of(spec)
    if trace is not None:
        prompt, output = trace.mean_lengths()
        return prompt * spec.scale, output * spec.scale
    rng = random.Random(spec.seed + 7)
    drawn = [request_lengths(spec, rng) for _ in range(samples)]
    return (sum(p for p, _, _ in drawn) / samples * spec.scale,
            sum(o for _, o, _ in drawn) / samples * spec.scale)


def description(spec: WorkloadSpec) -> dict:
    """What traffic a plan was sized for: the drawn workload's name, or the trace's name,
    requests and how many were clipped to the context; the mean lengths; and the
    arrivals' process and burstiness (CV^2 of the gaps; peak over mean of a trace's
    10 s counts)."""
    prompt, output = mean_lengths(spec)
    trace = trace_of(spec)
    if trace is None:
        return {"source": spec.name, "mean_prompt_tokens": prompt,
                "mean_output_tokens": output, "arrivals": "poisson", "interarrival_cv2": 1.0}
    return {"source": "trace", "trace": trace.name, "requests": trace.requests,
            "clipped": trace.clipped, "max_model_len": trace.max_model_len,
            "mean_prompt_tokens": prompt, "mean_output_tokens": output,
            "arrivals": "gamma renewal", "interarrival_cv2": trace.interarrival_cv2,
            "peak_to_mean_10s": trace.peak_to_mean, "recorded_rate_per_s": trace.recorded_rate}


def diurnal_shape(peak_to_mean: float, night_share: float = 0.05,
                  hours: int = 24) -> list[float]:
    """Each hour's rate as a share of the peak hour's, for a day whose peak is
    ``peak_to_mean`` times its mean: ``night_share`` of the peak all day, plus one evening
    bump (a von Mises curve, its concentration solved for the ratio). The reference
    scenario: 5,200 requests/s at peak against 75 M a day (868/s on average), a ratio of 6.
    Hour 0 is the peak hour.
    """
    kappa = diurnal_concentration(peak_to_mean, night_share, hours)
    return [diurnal_share(h / hours, kappa, night_share) for h in range(hours)]


def diurnal_share(day_fraction: float, kappa: float, night_share: float) -> float:
    """The rate at ``day_fraction`` of a day after the peak, as a share of the peak's."""
    return night_share + (1 - night_share) * math.exp(
        kappa * (math.cos(2 * math.pi * day_fraction) - 1))


def diurnal_concentration(peak_to_mean: float, night_share: float = 0.05,
                          hours: int = 24) -> float:
    """The bump's concentration that makes the mean of ``hours`` hourly rates the peak's
    ``1 / peak_to_mean``."""
    if not 0 <= night_share < 1 / peak_to_mean <= 1:
        raise ValueError("need peak_to_mean >= 1 and night_share below 1 / peak_to_mean")

    def mean_share(kappa: float) -> float:
        return sum(diurnal_share(h / hours, kappa, night_share) for h in range(hours)) / hours

    low, high = 0.0, 500.0
    for _ in range(100):
        kappa = (low + high) / 2
        if 1 / mean_share(kappa) < peak_to_mean:
            low = kappa
        else:
            high = kappa
    return (low + high) / 2
