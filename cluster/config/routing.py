"""The ``router.routing`` section of the config: replica choice in the two pools (pure).
"""

from __future__ import annotations

from pydantic import Field

from cluster.strict import StrictModel


class PoolRoutingConfig(StrictModel):
    """What both pools' routers share: the prefix index that says which replica's prefix
    cache holds a prompt's head, and when a load report is too old to trust."""

    max_blocks: int = Field(
        64, ge=0, description="leading KV blocks of a prompt hashed for affinity (bounds "
        "the router's work per request)")
    index_capacity: int = Field(
        100_000, ge=1, description="KV blocks of prefixes the router remembers; size it "
        "around the pool's total prefix-cache blocks")
    stale_after_s: float = Field(
        5.0, gt=0, description="a replica whose last load report is older ranks last")
    spread: bool = Field(
        True, description="when other router replicas send to the pool too, draw the "
        "first choice by each replica's share of the requests expected before the next "
        "load report, as one dispatcher would fill the pool (routers that cannot see "
        "each other's sends would otherwise all pick the same least loaded replica); "
        "false: always the least loaded. One router alone ranks the same either way")
    random_choice: bool = Field(
        False, description="a benchmark's baseline, not for serving: each request's first "
        "choice drawn uniformly among the replicas that are alive, fresh and not to be "
        "avoided, blind to load and prefixes (`bench variants` measures what the "
        "ranking gains over it)")


class PrefillRoutingConfig(PoolRoutingConfig):
    """How the prefill pool's router weighs prefix-cache affinity against queued work
    (``router/replica_choice/ranking.py``; the block size is ``engine.block_size``)."""

    max_imbalance_tokens: int = Field(
        4096, ge=0, description="most queued prefill tokens a replica holding the prompt's "
        "prefix may have beyond the shortest queue and still be preferred for it")


class DecodeRoutingConfig(PoolRoutingConfig):
    """How the decode pool's router picks the least loaded replica (the share of sequence
    slots in use, of the engine's ``max_num_seqs``, plus weighted KV-cache use), less the
    prefix affinity of a replica that holds the prompt's head."""

    max_blocks: int = Field(
        512, ge=0, description="leading KV blocks of a prompt hashed for affinity and for "
        "the cache-aware path (bounds the router's work per request: ~0.2 us a block); a "
        "conversation longer than this counts its tail as uncached. 512: 8K tokens in "
        "blocks of 16, ~0.1 ms of hashing")
    kv_weight: float = Field(
        1.0, ge=0, description="weight of KV-cache use against the share of sequence slots "
        "(1: a full cache weighs as much as max_num_seqs running sequences)")
    kv_high_water: float = Field(
        0.95, gt=0, le=1, description="KV-cache use above which a replica ranks after the "
        "others (another sequence there would force preemption)")
    prefix_affinity_slots: float = Field(
        1.0, ge=0, description="what holding a prompt's whole head in its prefix cache is "
        "worth to a replica, in sequence slots (it pulls only the rest over NIXL); below "
        "the load terms: a stream goes at most this many streams past the least loaded "
        "replica (0: no affinity)")
    cache_aware_path: bool = Field(
        True, description="compare only the prompt tokens missing from the prefix cache of "
        "the decode replica believed to hold the longest head of the prompt with "
        "router.disaggregation_threshold_tokens, and send a request under it to that "
        "replica decode-local: the next turn of a conversation, whose prompt and answer "
        "that engine computed, skips the prefill pool and the transfer (false: the whole "
        "prompt's length decides); docs/design.md, 'The next turn stays on its decode "
        "engine'")


class RoutingConfig(StrictModel):
    """Replica choice of the two engine pools (Serve request routers)."""

    prefill: PrefillRoutingConfig = PrefillRoutingConfig()
    decode: DecodeRoutingConfig = DecodeRoutingConfig()
