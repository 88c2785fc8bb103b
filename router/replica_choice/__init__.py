"""Which engine replica gets a request (pure): prefix affinity for prefill, least load for decode.

``loads`` (a replica's report plus the local tally), ``prefixes`` (hash chains, the prefix
index), ``decode_cache`` (the decode pool's cache belief), ``pending`` (unreported sends and
completions), ``spread`` (other routers, water-fill shares), ``ranking`` (both rankings).
Nothing here reads a clock or a global random source: ``now`` and an optional
``random.Random`` are passed in, so a decision replays exactly in a test. The reasoning:
docs/design.md, "Replica choice: Serve request routers fed by replica reports".
"""

from __future__ import annotations

from router.replica_choice.decode_cache import DecodeCacheBelief
from router.replica_choice.loads import ReplicaLoad, finished_of, load_from_stats, reported_at_of
from router.replica_choice.pending import PendingTally
from router.replica_choice.prefixes import ChainMemo, PrefixIndex, prefix_block_hashes
from router.replica_choice.ranking import (
    DecodePolicy,
    PrefillPolicy,
    decode_score,
    rank_decode,
    rank_prefill,
)
from router.replica_choice.spread import OtherRouters, water_fill_shares

__all__ = [
    "ChainMemo",
    "DecodeCacheBelief",
    "DecodePolicy",
    "OtherRouters",
    "PendingTally",
    "PrefillPolicy",
    "PrefixIndex",
    "ReplicaLoad",
    "decode_score",
    "finished_of",
    "load_from_stats",
    "prefix_block_hashes",
    "rank_decode",
    "rank_prefill",
    "reported_at_of",
    "water_fill_shares",
]
