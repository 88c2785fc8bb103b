"""Benchmark workloads (pure: seeded, no I/O).

A workload is a list of ``PlannedRequest``: when to send it, its prompt (built from text,
distinct from every other prompt so vLLM's prefix cache cannot make it free) and how many
tokens to ask for. Lengths follow the reference chat traffic — prompts averaging ~500
tokens with a tail to 8K, outputs averaging ~300 — scaled by ``scale`` for small models
and machines.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

WorkloadName = Literal["reference", "interference"]

MAX_PROMPT_TOKENS = 8192

_WORDS = [
    "the",
    "river",
    "ran",
    "past",
    "old",
    "mills",
    "and",
    "quiet",
    "towns",
    "where",
    "people",
    "spoke",
    "of",
    "weather",
    "harvests",
    "trains",
    "letters",
    "markets",
    "bridges",
    "gardens",
    "lamps",
    "winter",
    "summer",
    "bread",
    "music",
    "ships",
    "stories",
    "a",
    "child",
    "asked",
    "why",
    "the",
    "sky",
    "turns",
    "red",
    "at",
    "dusk",
    "and",
    "the",
    "teacher",
    "explained",
    "light",
    "and",
    "dust",
    "engineers",
    "measured",
    "the",
    "load",
    "on",
    "every",
    "beam",
    "before",
    "the",
    "crowd",
    "crossed",
    "the",
    "new",
    "bridge",
]


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    send_at: float  # seconds after the start of the run
    prompt: str
    prompt_tokens: int  # its length in tokens (as counted when it was built)
    max_tokens: int
    kind: Literal["short", "long"]


@dataclass(frozen=True)
class WorkloadSpec:
    name: WorkloadName = "reference"
    rate: float = 1.0  # mean arrivals per second (Poisson)
    num_requests: int = 100
    seed: int = 0
    scale: float = 1.0  # multiplies every prompt and output length
    peak_factor: float = 1.0  # rate multiplier inside the peak window
    peak_window: tuple[float, float] | None = None  # seconds after start
    long_fraction: float = 0.1  # interference: share of 4-8K-token prompts
    max_model_len: int = MAX_PROMPT_TOKENS + 1024
    shared_prefix_tokens: int = 0  # >0: every prompt starts with the same text
    repeat_fraction: float = 0.0  # share of requests that repeat an earlier one exactly
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.repeat_fraction < 1:
            raise ValueError(f"repeat_fraction must be in [0, 1), not {self.repeat_fraction}")


def arrival_times(spec: WorkloadSpec, rng: random.Random) -> list[float]:
    """Poisson arrivals; inside ``peak_window`` the rate is ``rate * peak_factor``."""
    times, now = [], 0.0
    for _ in range(spec.num_requests):
        rate = spec.rate
        if spec.peak_window and spec.peak_window[0] <= now < spec.peak_window[1]:
            rate *= spec.peak_factor
        now += rng.expovariate(rate)
        times.append(now)
    return times


def _lognormal_with_mean(rng: random.Random, mean: float, sigma: float) -> float:
    # E[lognormal(mu, sigma)] = exp(mu + sigma^2 / 2)
    return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)


def request_lengths(spec: WorkloadSpec, rng: random.Random) -> tuple[int, int, str]:
    """(prompt tokens, output tokens, kind) of one request, before scaling."""
    if spec.name == "interference":
        if rng.random() < spec.long_fraction:
            return rng.randint(4096, MAX_PROMPT_TOKENS), rng.randint(8, 32), "long"
        return round(_lognormal_with_mean(rng, 200, 0.5)), rng.randint(48, 96), "short"
    prompt = min(round(_lognormal_with_mean(rng, 500, 1.0)), MAX_PROMPT_TOKENS)
    output = round(_lognormal_with_mean(rng, 300, 0.6))
    return prompt, output, "long" if prompt >= 2048 else "short"


def build_prompt(
    index: int,
    tokens: int,
    rng: random.Random,
    count_tokens: Callable[[str], int],
    shared_prefix: str = "",
) -> str:
    """Text of about ``tokens`` tokens that starts differently from every other prompt."""
    head = f"{shared_prefix}Request {index}, note {rng.randrange(10**9)}: "
    words = [head]
    # Grow by estimate, then trim: counting every step would be quadratic.
    while count_tokens("".join(words)) < tokens:
        missing = tokens - count_tokens("".join(words))
        words.extend(" " + rng.choice(_WORDS) for _ in range(max(1, missing // 6)))
    text = "".join(words)
    while count_tokens(text) > tokens and len(text) > len(head):
        text = text[: max(len(head), len(text) - max(1, (count_tokens(text) - tokens)))]
    return text


def plan(spec: WorkloadSpec, count_tokens: Callable[[str], int]) -> list[PlannedRequest]:
    """The whole seeded workload."""
    rng = random.Random(spec.seed)
    shared = ""
    if spec.shared_prefix_tokens:
        shared = (
            build_prompt(-1, spec.shared_prefix_tokens, random.Random(spec.seed + 1), count_tokens)
            + "\n"
        )
    requests: list[PlannedRequest] = []
    # Its own random stream: the arrival times stay those of the workload without repeats.
    repeats = random.Random(spec.seed + 2)
    for index, send_at in enumerate(arrival_times(spec, rng)):
        if requests and repeats.random() < spec.repeat_fraction:
            # A user asking what someone asked before (a response cache's hit).
            earlier = repeats.choice(requests)
            requests.append(PlannedRequest(index, send_at, earlier.prompt,
                                           earlier.prompt_tokens, earlier.max_tokens,
                                           earlier.kind))
            continue
        prompt_tokens, output_tokens, kind = request_lengths(spec, rng)
        prompt_tokens = max(8, round(prompt_tokens * spec.scale))
        output_tokens = max(1, round(output_tokens * spec.scale))
        output_tokens = min(output_tokens, spec.max_model_len - prompt_tokens - 16)
        prompt = build_prompt(index, prompt_tokens, rng, count_tokens, shared)
        # The distinct head can make a very short target longer: record the real length.
        real_length = count_tokens(prompt)
        requests.append(
            PlannedRequest(index, send_at, prompt, real_length, output_tokens, kind)
        )
    return requests
