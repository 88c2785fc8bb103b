"""The quality a cost lever costs, from next-token distributions on held-out text (pure).

One variant against the baseline, both read through the running service.

Each held-out passage is sent as a completion with ``echo`` and ``logprobs``: the engine
returns, at every position of the passage, the log-probability of the token the text has
there and the most likely next tokens (vLLM's prompt logprobs, by token id). From those:

- perplexity: ``exp`` of the mean negative log-probability of the text's tokens;
- top-1 agreement: the share of positions where both pick the same most likely token;
- KL divergence of the candidate from the baseline, ``KL(P || Q)``, over the baseline's
  listed tokens plus one bucket for all the others. A token the candidate did not list
  gets the candidate's smallest listed probability, an upper bound on its own, and merging
  tokens into a bucket can only lower a divergence: the figure is a lower bound, tight
  when the lists cover most of the mass (the top 20 of a byte-level vocabulary do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling with return_tokens_as_token_ids


@dataclass(frozen=True)
class Position:
    """One position of a passage: the token the text has there, and the engine's listed
    next-token log-probabilities (the text's token always among them)."""

    actual: int
    logprobs: dict[int, float]

    @property
    def top(self) -> int:
        return max(self.logprobs, key=self.logprobs.__getitem__)


@dataclass(frozen=True)
class QualityDelta:
    positions: int
    perplexity_baseline: float
    perplexity_candidate: float
    top1_agreement: float
    kl_mean: float
    kl_p95: float

    def to_json(self) -> dict:
        return {key: round(value, 6) if isinstance(value, float) else value
                for key, value in asdict(self).items()}


def positions_from_echo(logprobs: dict, prompt_tokens: int) -> list[Position]:
    """The prompt's positions in an echoed completion's ``choices[0].logprobs``: the
    first token has no context and is left out, and so is what the engine generated
    after the prompt (its own choice, not the text's)."""
    positions = []
    listed = zip(logprobs["tokens"][:prompt_tokens], logprobs["top_logprobs"][:prompt_tokens],
                 strict=True)
    for token, top in listed:
        if top is None:
            continue
        positions.append(Position(_token_id(token),
                                  {_token_id(name): value for name, value in top.items()}))
    return positions


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"token {token!r} is not spelled by id (return_tokens_as_token_ids)")
    return int(token.removeprefix(TOKEN_ID_PREFIX))


def perplexity(passages: Sequence[Sequence[Position]]) -> float:
    """Perplexity of the text under the engine that produced ``passages``."""
    logprobs = [p.logprobs[p.actual] for passage in passages for p in passage]
    return math.exp(-sum(logprobs) / len(logprobs))


def kl_divergence(baseline: Position, candidate: Position) -> float:
    """KL(P || Q) at one position, over P's listed tokens and a bucket for the rest."""
    floor = min(candidate.logprobs.values())
    p = {token: math.exp(value) for token, value in baseline.logprobs.items()}
    q = {token: math.exp(candidate.logprobs.get(token, floor)) for token in p}
    p_rest, q_rest = max(0.0, 1 - sum(p.values())), max(1e-12, 1 - sum(q.values()))
    divergence = sum(pt * math.log(pt / q[token]) for token, pt in p.items() if pt > 0)
    if p_rest > 0:
        divergence += p_rest * math.log(p_rest / q_rest)
    return max(0.0, divergence)


def compare(baseline: Sequence[Sequence[Position]],
            candidate: Sequence[Sequence[Position]]) -> QualityDelta:
    """The candidate's quality against the baseline's on the same passages."""
    pairs = []
    for ours, theirs in zip(baseline, candidate, strict=True):
        if [p.actual for p in ours] != [p.actual for p in theirs]:
            raise ValueError("the two runs tokenized a passage differently")
        pairs.extend(zip(ours, theirs, strict=True))
    if not pairs:
        raise ValueError("no positions to compare")
    divergences = sorted(kl_divergence(p, q) for p, q in pairs)
    return QualityDelta(
        positions=len(pairs),
        perplexity_baseline=perplexity(baseline),
        perplexity_candidate=perplexity(candidate),
        top1_agreement=sum(p.top == q.top for p, q in pairs) / len(pairs),
        kl_mean=sum(divergences) / len(divergences),
        kl_p95=divergences[min(len(divergences) - 1, math.ceil(0.95 * len(divergences)) - 1)],
    )
