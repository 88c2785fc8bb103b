"""The simulation's requests (pure): lengths, conversations, and their KV-block chains.

A request is not a token list here but a chain of KV-block ids (``block_chain``): two
requests share a block exactly when they share the whole prefix up to it (a system prompt
of their group, the earlier turns of their conversation), as the router's block hashes do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SimRequest:
    """One request of a simulation: when it comes, its lengths, and whom it shares KV with."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0      # of the prompt, in the prefix cache of whichever engine
    #                             prefills it (a hit rate assumed, not simulated)
    # Whom it shares KV blocks with (``block_chain``): its first ``group_tokens`` tokens
    # with the other requests of ``group`` (a system prompt), the rest with the other
    # turns of ``conversation``; -1: nobody.
    group: int = -1
    group_tokens: int = 0
    conversation: int = -1
    # Where the conversation's tokens changed ((first token, version) pairs, ascending):
    # a later turn repeats the turns before it token for token only up to the point where
    # its history stops matching (a re-tokenized answer), and its own tokens from there.
    # Empty: one version of the conversation (every turn repeats the others exactly).
    versions: tuple[tuple[int, int], ...] = ()
    # A later turn: it arrives ``think_s`` after request ``follows`` (an index into the
    # same list) finished; its ``arrival_s`` is not used.
    follows: int | None = None
    think_s: float = 0.0

    def next_versions(self, repeated_tokens: int) -> tuple[tuple[int, int], ...]:
        """The versions of the turn that follows this one and repeats its first
        ``repeated_tokens`` tokens (of its prompt and answer) exactly."""
        own = self.versions or ((0, 0),)
        kept = tuple(v for v in own if v[0] < repeated_tokens)
        return (*kept, (repeated_tokens, own[-1][1] + 1))


# How much of an answer the next turn repeats token for token: one share for every answer,
# or measured shares (tools/experiments/answer_reuse.py) of which each later turn draws one.
AnswerReuse = float | tuple[float, ...]


def check_answer_reuse(reuse: AnswerReuse) -> None:
    """Refuse an ``AnswerReuse`` that is not a share in [0, 1] or a tuple of such."""
    shares = reuse if isinstance(reuse, tuple) else (reuse,)
    if not shares or not all(0 <= share <= 1 for share in shares):
        raise ValueError(f"answer_reuse is a share in [0, 1] or some, not {reuse}")


def repeated_tokens(earlier: SimRequest, reuse: AnswerReuse, rng: random.Random) -> int:
    """The tokens of ``earlier``'s prompt and answer that the turn after it repeats
    exactly: its prompt and a share of its answer."""
    share = rng.choice(reuse) if isinstance(reuse, tuple) else reuse
    return earlier.prompt_tokens + int(earlier.output_tokens * share)


def block_chain(request: SimRequest, tokens: int, block_size: int) -> tuple[int, ...]:
    """Ids of the full KV blocks of the first ``tokens`` tokens of ``request``'s sequence
    (its prompt, then its answer). Each id names the whole prefix up to its block, as the
    router's block hashes do: a block of the group's head has the group's id at that
    place (``group * 2**24 + place``, not negative), a later one the conversation's
    version's (negative). A block holding a token of a later version is that version's.
    Empty for a request that shares nothing."""
    shared = request.group_tokens // block_size if request.group >= 0 else 0
    blocks = tokens // block_size
    if request.conversation < 0:
        blocks = min(blocks, shared)
    head = min(shared, blocks)
    group_base = request.group * _PLACES
    chain = tuple(range(group_base, group_base + head))
    versions = request.versions or ((0, 0),)
    for index, (start, version) in enumerate(versions):
        first = max(head, start // block_size)
        end = versions[index + 1][0] // block_size if index + 1 < len(versions) else blocks
        base = -1 - (request.conversation * _VERSIONS + version) * _PLACES
        chain += tuple(range(base - first, base - min(end, blocks), -1))
    return chain


_PLACES = 2**24      # blocks a sequence may have: 2**28 tokens in blocks of 16
_VERSIONS = 2**10    # turns a conversation may have
