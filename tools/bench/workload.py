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
from dataclasses import dataclass, field, replace
from typing import Literal

WorkloadName = Literal["reference", "interference"]

MAX_PROMPT_TOKENS = 8192
LONG_PROMPT_TOKENS = 2048  # the reference workload's prompts from here on count as long
# apart from the seed: each shared head's words come from a random stream of its own
PREFIX_SEED_STRIDE = 7919

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
    # A later turn of a conversation: ``prompt`` is only its new message, sent
    # ``think_s`` after the answer to request ``follows`` came, appended to that request's
    # prompt and answer; ``prompt_tokens`` is then an estimate (the answer is not known).
    follows: int | None = None
    think_s: float = 0.0
    turn: int = 1
    prefix_group: int = -1  # which shared head it starts with (-1: none)
    # Sent instead of ``prompt`` when set: the prompt as token ids, exactly
    # ``prompt_tokens`` of them (trace replay, tools/bench/trace.py: no tokenizer between).
    prompt_token_ids: tuple[int, ...] | None = None


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
    shared_prefix_tokens: int = 0  # >0: every prompt starts with one of the shared heads
    prefix_groups: int = 1  # how many distinct shared heads (system prompts) there are
    repeat_fraction: float = 0.0  # share of requests that repeat an earlier one exactly
    turns: int = 1  # requests per conversation: each later turn carries the history
    think_s: float = 2.0  # mean pause between an answer and its conversation's next turn
    message_tokens: int = 48  # mean length of a later turn's new message, before scaling
    prompt_salt: str = ""  # put before every prompt: another salt shares no KV block
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.repeat_fraction < 1:
            raise ValueError(f"repeat_fraction must be in [0, 1), not {self.repeat_fraction}")
        if self.prefix_groups < 1:
            raise ValueError(f"prefix_groups must be at least 1, not {self.prefix_groups}")
        if self.turns < 1 or self.think_s < 0 or self.message_tokens < 1:
            raise ValueError("turns and message_tokens must be at least 1, think_s at least 0")


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


def lognormal_with_mean(rng: random.Random, mean: float, sigma: float) -> float:
    # E[lognormal(mu, sigma)] = exp(mu + sigma^2 / 2)
    return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)


def request_lengths(spec: WorkloadSpec, rng: random.Random) -> tuple[int, int, str]:
    """(prompt tokens, output tokens, kind) of one request, before scaling."""
    if spec.name == "interference":
        if rng.random() < spec.long_fraction:
            return rng.randint(4096, MAX_PROMPT_TOKENS), rng.randint(8, 32), "long"
        return round(lognormal_with_mean(rng, 200, 0.5)), rng.randint(48, 96), "short"
    prompt = min(round(lognormal_with_mean(rng, 500, 1.0)), MAX_PROMPT_TOKENS)
    output = round(lognormal_with_mean(rng, 300, 0.6))
    return prompt, output, "long" if prompt >= LONG_PROMPT_TOKENS else "short"


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


def shared_prefixes(spec: WorkloadSpec, count_tokens: Callable[[str], int]) -> list[str]:
    """The workload's shared heads (system prompts), ``prefix_groups`` of them, each about
    ``shared_prefix_tokens`` long; they differ within their first few tokens, so no two
    groups share a KV block."""
    if not spec.shared_prefix_tokens:
        return [""]
    return [build_prompt(-1 - group, spec.shared_prefix_tokens,
                         random.Random(spec.seed + 1 + PREFIX_SEED_STRIDE * group),
                         count_tokens) + "\n"
            for group in range(spec.prefix_groups)]


def plan(spec: WorkloadSpec, count_tokens: Callable[[str], int]) -> list[PlannedRequest]:
    """The whole seeded workload: ``num_requests`` requests, in conversations of
    ``turns`` (the first turns arrive at ``rate / turns``, so that all turns together
    come at about ``rate``)."""
    conversations = -(-spec.num_requests // spec.turns)
    first = _first_turns(replace(spec, num_requests=conversations,
                                 rate=spec.rate / spec.turns), count_tokens)
    return first + _later_turns(spec, first, count_tokens)


def _first_turns(spec: WorkloadSpec, count_tokens: Callable[[str], int]) -> list[PlannedRequest]:
    rng = random.Random(spec.seed)
    prefixes = shared_prefixes(spec, count_tokens)
    # Its own random stream: the arrival times stay those of the workload without heads.
    groups = random.Random(spec.seed + 3)
    salt = f"[{spec.prompt_salt}] " if spec.prompt_salt else ""
    requests: list[PlannedRequest] = []
    # Its own random stream: the arrival times stay those of the workload without repeats.
    repeats = random.Random(spec.seed + 2)
    for index, send_at in enumerate(arrival_times(spec, rng)):
        if requests and repeats.random() < spec.repeat_fraction:
            # A user asking what someone asked before (a response cache's hit).
            earlier = repeats.choice(requests)
            requests.append(PlannedRequest(index, send_at, earlier.prompt,
                                           earlier.prompt_tokens, earlier.max_tokens,
                                           earlier.kind, prefix_group=earlier.prefix_group))
            continue
        prompt_tokens, output_tokens, kind = request_lengths(spec, rng)
        prompt_tokens = max(8, round(prompt_tokens * spec.scale))
        output_tokens = max(1, round(output_tokens * spec.scale))
        output_tokens = min(output_tokens, spec.max_model_len - prompt_tokens - 16)
        group = groups.randrange(len(prefixes))
        prompt = salt + build_prompt(index, prompt_tokens, rng, count_tokens, prefixes[group])
        # The distinct head can make a very short target longer: record the real length.
        real_length = count_tokens(prompt)
        requests.append(PlannedRequest(
            index, send_at, prompt, real_length, output_tokens, kind,
            prefix_group=group if spec.shared_prefix_tokens else -1))
    return requests


def _later_turns(spec: WorkloadSpec, first: list[PlannedRequest],
                 count_tokens: Callable[[str], int]) -> list[PlannedRequest]:
    """Turns 2.. of each conversation, until ``num_requests`` in all: a short new message
    each, sent a think time after the answer before it. A conversation whose history
    would no longer fit the model's context ends early."""
    rng = random.Random(spec.seed + 4)  # its own stream: the first turns stay as they are
    latest: list[PlannedRequest | None] = list(first)
    later: list[PlannedRequest] = []
    for turn in range(2, spec.turns + 1):
        for conversation, previous in enumerate(latest):
            if len(first) + len(later) >= spec.num_requests:
                return later
            if previous is None:
                continue
            index = len(first) + len(later)
            message = "\n" + build_prompt(index, max(4, round(lognormal_with_mean(
                rng, spec.message_tokens, 0.5) * spec.scale)), rng, count_tokens)
            history = previous.prompt_tokens + previous.max_tokens + count_tokens(message)
            output_tokens = max(1, round(request_lengths(spec, rng)[1] * spec.scale))
            if history + output_tokens + 16 > spec.max_model_len:
                latest[conversation] = None
                continue
            think_s = rng.expovariate(1 / spec.think_s) if spec.think_s else 0.0
            latest[conversation] = PlannedRequest(
                index, 0.0, message, history, output_tokens,
                "long" if history >= LONG_PROMPT_TOKENS else "short",
                follows=previous.index, think_s=think_s, turn=turn,
                prefix_group=previous.prefix_group)
            later.append(latest[conversation])
    return later
