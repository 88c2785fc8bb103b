"""A step cost model fitted to step times measured on real engines (pure).

    t = base + per_token * new_tokens + per_pair * token_pairs + per_context * context

``base`` is what a step costs whatever it computes (reading the weights, scheduling,
sampling, Python), ``per_token`` each token's pass through the weights, ``per_pair``
attention's (query, key) pairs and ``per_context`` reading the KV cache of the tokens the
batch holds. Fitted by least squares with every coefficient kept non-negative (a
coefficient the data would make negative is dropped and the rest refitted), so that more
work never predicts less time. ``pdserve plan calibrate`` measures the samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TERMS = ("base", "per_token", "per_pair", "per_context")


@dataclass(frozen=True)
class StepSample:
    new_tokens: int
    token_pairs: float
    context_tokens: int
    seconds: float


@dataclass(frozen=True)
class FittedCost:
    base: float
    per_token: float
    per_pair: float
    per_context: float

    def step_time(self, new_tokens: int, token_pairs: float, context_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        return (self.base + self.per_token * new_tokens + self.per_pair * token_pairs
                + self.per_context * context_tokens)

    def as_dict(self) -> dict[str, float]:
        return {term: getattr(self, term) for term in TERMS}


def _row(sample: StepSample) -> list[float]:
    return [1.0, sample.new_tokens, sample.token_pairs, sample.context_tokens]


def fit(samples: Sequence[StepSample]) -> FittedCost:
    """Non-negative least squares on relative error (each row weighted by 1 / its time, so
    that the many short decode steps count as much as the long prefills)."""
    if len(samples) < len(TERMS):
        raise ValueError(f"need at least {len(TERMS)} samples, got {len(samples)}")
    rows = np.array([_row(s) for s in samples])
    times = np.array([s.seconds for s in samples])
    weights = 1.0 / np.maximum(times, 1e-6)
    active = list(range(len(TERMS)))
    while True:
        solution, *_ = np.linalg.lstsq(rows[:, active] * weights[:, None], times * weights,
                                       rcond=None)
        if (solution >= 0).all():
            break
        active.pop(int(np.argmin(solution)))
    coefficients = dict.fromkeys(TERMS, 0.0)
    for index, value in zip(active, solution, strict=True):
        coefficients[TERMS[index]] = float(value)
    return FittedCost(**coefficients)


def relative_errors(cost: FittedCost, samples: Sequence[StepSample]) -> list[float]:
    """Predicted over measured, minus one, per sample."""
    return [cost.step_time(s.new_tokens, s.token_pairs, s.context_tokens) / s.seconds - 1
            for s in samples]
