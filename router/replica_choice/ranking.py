"""The prefill and decode rankings (pure): prefix affinity against queued prefill work; least
load less a prefix-affinity bonus. The reasoning: docs/design.md, "Replica choice: Serve request
routers fed by replica reports"; dead, stale, avoided: "Retries, migration and deadlines".
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.replica_choice.loads import ReplicaId, ReplicaLoad
from router.replica_choice.spread import water_fill_shares

if TYPE_CHECKING:
    from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig


# ---------------------------------------------------------------------------------------
# Prefill: prefix affinity weighed against queued prefill work


@dataclass(frozen=True)
class PrefillPolicy:
    """The prefill ranking's tunables. Built with :meth:`from_config`: defaults and
    validation live in ``router.routing.prefill`` (``PrefillRoutingConfig``)."""

    block_size: int                   # the engines' KV block size (tokens)
    max_blocks: int                   # leading blocks hashed per prompt
    max_imbalance_tokens: int         # most extra queue an affinity replica may have
    index_capacity: int               # blocks remembered by the PrefixIndex
    stale_after_s: float              # a report older than this ranks its replica last
    spread: bool = True               # draw the first choice when other routers send too
    random_choice: bool = False       # a baseline: uniform among the usable replicas

    @classmethod
    def from_config(cls, config: PrefillRoutingConfig, block_size: int) -> PrefillPolicy:
        """The policy of ``router.routing.prefill`` for engines of ``block_size`` (the
        validated ``engine.block_size``: prefixes are hashed in the engines' blocks)."""
        return cls(block_size=block_size, max_blocks=config.max_blocks,
                   max_imbalance_tokens=config.max_imbalance_tokens,
                   index_capacity=config.index_capacity, stale_after_s=config.stale_after_s,
                   spread=config.spread, random_choice=config.random_choice)


@dataclass(frozen=True)
class PrefillChoice:
    ranking: tuple[ReplicaId, ...]  # every candidate, best first
    cached_tokens: int              # prompt tokens the first choice is believed to hold


def rank_prefill(
    prompt_tokens: int,
    matched_blocks: Mapping[ReplicaId, int],
    loads: Sequence[ReplicaLoad],
    policy: PrefillPolicy,
    rng: random.Random | None = None,
    others: float = 0.0,
    avoid: Collection[ReplicaId] = (),
) -> PrefillChoice:
    """Rank replicas by estimated prefill cost: queued tokens + tokens still to compute.

    A replica holding ``m`` blocks of the prompt saves ``m * block_size`` tokens (the engine
    recomputes at least the last prompt token). That saving is dropped for a replica whose
    queue exceeds the shortest current queue by more than ``max_imbalance_tokens``, so the
    first choice's queue never exceeds the shortest by more than
    ``min(max_imbalance_tokens, its saving)``. Ties prefer the larger saving, then the
    shorter queue. Replicas with stale stats come last, after them those in ``avoid`` (an
    earlier attempt of this request failed there), and those with a dead engine after
    them all (tried only when nothing else is left).

    ``others``: the requests other routers send the pool per report period
    (``OtherRouters``). When it is above 0, ``rng`` is given and the policy spreads, the
    first choice is drawn among the current replicas by their share of that many prompts
    like this one (and this one) poured over their estimated costs, lowest first
    (``water_fill_shares``).
    """
    if not loads:
        return PrefillChoice((), 0)
    current = [load for load in loads if not (load.stale or load.dead)] or list(loads)
    shortest = min(load.prefill_queue for load in current)
    tie = _tie_breaks(loads, rng)

    def saving(load: ReplicaLoad) -> int:
        if load.prefill_queue - shortest > policy.max_imbalance_tokens:
            return 0
        cached = matched_blocks.get(load.replica_id, 0) * policy.block_size
        return max(0, min(cached, prompt_tokens - 1))

    def key(load: ReplicaLoad):
        saved = saving(load)
        cost = load.prefill_queue + prompt_tokens - saved
        return (load.dead, load.replica_id in avoid, load.stale, cost, -saved,
                load.prefill_queue, tie[load.replica_id])

    if policy.random_choice:
        ranked = _at_random(loads, tie, avoid)
        return PrefillChoice(tuple(load.replica_id for load in ranked), saving(ranked[0]))
    keys = {load.replica_id: key(load) for load in loads}
    ranked = sorted(loads, key=lambda load: keys[load.replica_id])
    if policy.spread and others > 0 and rng is not None and prompt_tokens > 0:
        tier = keys[ranked[0].replica_id][:3]     # dead, avoided, stale
        in_draw = sum(1 for load in ranked if keys[load.replica_id][:3] == tier)
        # keys[r][3]: the estimated cost
        levels = {load.replica_id: keys[load.replica_id][3] / prompt_tokens
                  for load in ranked[:in_draw]}
        ranked = _draw_first(ranked, in_draw, levels, others + 1, rng)
    return PrefillChoice(tuple(load.replica_id for load in ranked), saving(ranked[0]))


# ---------------------------------------------------------------------------------------
# Decode: least loaded by KV use and sequences


@dataclass(frozen=True)
class DecodePolicy:
    """The decode ranking's tunables. Built with :meth:`from_config`: defaults and
    validation live in ``router.routing.decode`` (``DecodeRoutingConfig``)."""

    kv_weight: float                  # a full KV cache weighs as much as max_num_seqs streams
    kv_high_water: float              # above this, a replica is ranked after the others
    default_max_num_seqs: int         # when a replica does not report its own
    stale_after_s: float              # a report older than this ranks its replica last
    affinity_slots: float = 0.0       # a replica holding the whole prompt: this many slots
    block_size: int = 16              # the engines' KV block size (prefixes are hashed in it)
    max_blocks: int = 512             # leading blocks hashed per prompt (and answer)
    index_capacity: int = 100_000     # blocks remembered by the decode PrefixIndex
    spread: bool = True               # draw the first choice when other routers send too
    random_choice: bool = False       # a baseline: uniform among the usable replicas

    @classmethod
    def from_config(cls, config: DecodeRoutingConfig, max_num_seqs: int,
                    block_size: int = 16) -> DecodePolicy:
        """The policy of ``router.routing.decode`` for engines of ``max_num_seqs`` (what the
        pool's engines run with; replicas report their own, this covers the first second)
        and KV blocks of ``block_size``."""
        return cls(kv_weight=config.kv_weight, kv_high_water=config.kv_high_water,
                   default_max_num_seqs=max_num_seqs, stale_after_s=config.stale_after_s,
                   affinity_slots=config.prefix_affinity_slots, block_size=block_size,
                   max_blocks=config.max_blocks, index_capacity=config.index_capacity,
                   spread=config.spread, random_choice=config.random_choice)


def decode_score(load: ReplicaLoad, policy: DecodePolicy) -> float:
    """Load in [0, ~1 + kv_weight]: share of sequence slots in use plus weighted KV use.

    Sequences count running, waiting (the engine has no room for them yet) and this
    router's unreported sends.
    """
    max_num_seqs = load.max_num_seqs or policy.default_max_num_seqs
    return load.sequences / max_num_seqs + policy.kv_weight * load.kv_usage


def affinity_bonus(load: ReplicaLoad, matched_blocks: int, prompt_tokens: int,
                   policy: DecodePolicy) -> float:
    """What holding ``matched_blocks`` of a ``prompt_tokens`` prompt is worth, in the units
    of ``decode_score``: the share of the prompt's KV the pull would not move, times
    ``affinity_slots`` sequence slots."""
    if prompt_tokens <= 0 or matched_blocks <= 0 or policy.affinity_slots <= 0:
        return 0.0
    held = min(matched_blocks * policy.block_size, prompt_tokens) / prompt_tokens
    return held * policy.affinity_slots / (load.max_num_seqs or policy.default_max_num_seqs)


def rank_decode(
    loads: Sequence[ReplicaLoad], policy: DecodePolicy, rng: random.Random | None = None,
    matched_blocks: Mapping[ReplicaId, int] | None = None, prompt_tokens: int = 0,
    pinned: ReplicaId | None = None, others: float = 0.0,
    avoid: Collection[ReplicaId] = (),
) -> tuple[ReplicaId, ...]:
    """Every candidate, least loaded first (less the prefix-affinity bonus of the blocks
    ``matched_blocks`` says a replica holds of this ``prompt_tokens`` prompt; a tie goes
    to the larger bonus); above the KV high-water mark next; stale after them; then those
    in ``avoid`` (an earlier attempt of this request failed there: a hung engine reports
    the load it had when it stopped); a replica whose engine died last of all.

    ``pinned``: the replica whose prefix cache made this request decode-local
    (router/disaggregation.py) comes first among the live, fresh, not full ones, whatever
    its load: anywhere else the engine would prefill the whole prompt.

    ``others``: the requests other routers send the pool per report period
    (``OtherRouters``). When it is above 0, ``rng`` is given and the policy spreads, the
    first choice (unless pinned) is drawn among the best tier by its share of that many
    streams (and this one) poured over the replicas' scores less their bonus, lowest
    first, each stream taking a sequence slot (``water_fill_shares``)."""
    tie = _tie_breaks(loads, rng)
    if policy.random_choice:
        return tuple(load.replica_id for load in _at_random(loads, tie, avoid))
    matched = matched_blocks or {}

    def key(load: ReplicaLoad):
        full = load.kv_usage >= policy.kv_high_water
        bonus = affinity_bonus(load, matched.get(load.replica_id, 0), prompt_tokens, policy)
        return (load.dead, load.replica_id in avoid, load.stale, full,
                load.replica_id != pinned, decode_score(load, policy) - bonus, -bonus,
                tie[load.replica_id])

    keys = {load.replica_id: key(load) for load in loads}
    ranked = sorted(loads, key=lambda load: keys[load.replica_id])
    first = keys[ranked[0].replica_id][:5] if ranked else ()
    if policy.spread and others > 0 and rng is not None and first and first[4]:  # unpinned
        in_draw = sum(1 for load in ranked if keys[load.replica_id][:5] == first)
        slots = {load.replica_id: load.max_num_seqs or policy.default_max_num_seqs
                 for load in ranked[:in_draw]}
        # keys[r][5]: the score less the affinity bonus
        levels = {r: keys[r][5] for r in slots}
        ranked = _draw_first(ranked, in_draw, levels, others + 1, rng, slots)
    return tuple(load.replica_id for load in ranked)


def _at_random(loads: Sequence[ReplicaLoad], tie: Mapping[ReplicaId, object],
               avoid: Collection[ReplicaId]) -> list[ReplicaLoad]:
    """The random-choice baseline's ranking, blind to load and prefixes: the usable
    replicas first, then stale ones, then those to avoid, dead ones last; within each, in
    the order of ``tie`` (uniform when it was drawn)."""
    return sorted(loads, key=lambda load: (load.dead, load.replica_id in avoid, load.stale,
                                           tie[load.replica_id]))


def _tie_breaks(loads: Sequence[ReplicaLoad], rng: random.Random | None) -> dict[str, object]:
    """Equal scores are broken by replica id, or at random when ``rng`` is given (several
    router replicas would otherwise all send their first request to the same replica)."""
    if rng is None:
        return {load.replica_id: load.replica_id for load in loads}
    return {load.replica_id: rng.random() for load in loads}



def _draw_first(ranking: list[ReplicaLoad], in_draw: int, levels: Mapping[ReplicaId, float],
                amount: float, rng: random.Random,
                weights: Mapping[ReplicaId, float] | None = None) -> list[ReplicaLoad]:
    """``ranking`` with one of its first ``in_draw`` replicas, drawn by its water-fill
    share of ``amount``, moved to the front (the rest keep their order)."""
    shares = water_fill_shares({load.replica_id: levels[load.replica_id]
                                for load in ranking[:in_draw]}, amount, weights)
    point, total = rng.random(), 0.0
    for position, load in enumerate(ranking[:in_draw]):
        total += shares.get(load.replica_id, 0.0)
        if point < total:
            return [load, *ranking[:position], *ranking[position + 1:]]
    return ranking   # rounding left the point past the last share: keep the best

