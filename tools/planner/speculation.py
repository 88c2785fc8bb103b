"""Speculative decoding on the decode pool, as the planner models it (pure).

A step of a speculating engine verifies ``draft_tokens`` drafted tokens beside a
decoding sequence's own, one target pass over ``draft_tokens + 1`` tokens, for the share
``drafting_share`` of its steps that have drafts (prompt lookup drafts only where the
last few tokens occurred earlier in the context; a draft model always drafts). The
drafts are accepted in order until the first rejection, and the target's own token at
that place is kept too, so a drafting step gains 1 to ``draft_tokens + 1`` tokens. With
each draft accepted with probability ``alpha``, independently (Leviathan et al., 2023),
it gains ``(1 - alpha ** (k + 1)) / (1 - alpha)`` on average.

vLLM counts the tokens drafted, those accepted and those generated (pdserve's
``/admin/stats``: ``spec_draft_tokens``, ``spec_accepted_tokens``,
``generation_tokens``; docs/cost.md). Accepted over drafted gives ``alpha``
(:func:`from_accepted_share`); drafted over the steps (generated less accepted: each
step makes one token of its own) gives the drafting share. The drafter itself costs
nothing here: pdserve's decode pool drafts by prompt lookup, on the CPU, beside the step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# from_accepted_share's bisection: halvings of [0, 1] (2**-50: exact in a float)
_BISECTIONS = 50


@dataclass(frozen=True)
class Speculation:
    draft_tokens: int     # num_speculative_tokens
    alpha: float          # each draft's chance of acceptance, given those before it were
    drafting_share: float = 1.0   # of a sequence's steps, those with drafts

    def __post_init__(self) -> None:
        if self.draft_tokens < 1 or not 0 <= self.alpha < 1:
            raise ValueError("speculation needs 1 or more draft tokens and an acceptance "
                             "in [0, 1)")
        if not 0 < self.drafting_share <= 1:
            raise ValueError(f"a drafting share is in (0, 1], not {self.drafting_share}")

    @property
    def drafting_tokens_per_step(self) -> float:
        """A sequence's expected tokens from one step that verifies drafts."""
        return (1 - self.alpha ** (self.draft_tokens + 1)) / (1 - self.alpha)

    @property
    def tokens_per_step(self) -> float:
        """A sequence's expected tokens from one step, drafting or not."""
        return 1 + self.drafting_share * (self.drafting_tokens_per_step - 1)

    @property
    def drafts_per_step(self) -> float:
        """Tokens a sequence's step verifies beside its own, on average."""
        return self.drafting_share * self.draft_tokens

    @property
    def accepted_share(self) -> float:
        """Accepted drafts over drafted ones, as vLLM counts them."""
        return (self.drafting_tokens_per_step - 1) / self.draft_tokens

    def drafts(self, rng: random.Random) -> int:
        """Tokens one sequence's next step drafts: all or none."""
        return self.draft_tokens if rng.random() < self.drafting_share else 0

    def gained(self, rng: random.Random) -> int:
        """One drafting step's tokens for a sequence: its accepted drafts, then the
        target's."""
        accepted = 0
        while accepted < self.draft_tokens and rng.random() < self.alpha:
            accepted += 1
        return accepted + 1


def from_accepted_share(draft_tokens: int, accepted_share: float,
                        drafting_share: float = 1.0) -> Speculation:
    """The speculation whose accepted / drafted tokens is ``accepted_share`` (what vLLM
    reports) with ``draft_tokens`` drafts on ``drafting_share`` of the steps."""
    if not 0 <= accepted_share < 1:
        raise ValueError(f"an accepted share is in [0, 1), not {accepted_share}")
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):      # accepted_share grows with alpha
        middle = (low + high) / 2
        if Speculation(draft_tokens, middle).accepted_share < accepted_share:
            low = middle
        else:
            high = middle
    return Speculation(draft_tokens, low, drafting_share)


def from_counts(draft_tokens: int, drafted: int, accepted: int, generated: int
                ) -> Speculation:
    """The speculation an engine's counters describe (``spec_draft_tokens``,
    ``spec_accepted_tokens``, ``generation_tokens`` of ``/admin/stats``), at
    ``draft_tokens`` a drafting step."""
    steps = generated - accepted
    if drafted <= 0 or not 0 <= accepted <= drafted or steps <= 0:
        raise ValueError(f"counters of speculation want 0 <= accepted <= drafted and "
                         f"accepted < generated, not drafted {drafted}, accepted {accepted}, "
                         f"generated {generated}")
    share = drafted / (draft_tokens * steps)
    if share > 1:
        raise ValueError(f"{drafted} drafted tokens in {steps} steps is more than "
                         f"{draft_tokens} a step")
    return from_accepted_share(draft_tokens, accepted / drafted, share)
