"""Prefix hashing and the prefix → replica index (pure): a prompt's leading blocks as a hash
chain, memoised per prompt tuple, and an LRU map of the replica that last took each chain.
The reasoning: docs/design.md, "Replica choice" and "The next turn stays on its decode engine".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from router.replica_choice.loads import ReplicaId

BlockHash = int


def prefix_block_hashes(
    token_ids: Sequence[int], block_size: int, max_blocks: int = 64,
    known: Sequence[BlockHash] = (),
) -> tuple[BlockHash, ...]:
    """Hash chain over the prompt's leading full blocks: ``h_i = H(h_{i-1}, block_i)``.

    ``h_i`` identifies the whole prefix up to block ``i``, so two prompts share ``h_i``
    exactly when (up to hash collisions) they share their first ``i + 1`` blocks. Only
    full blocks count, as an engine's prefix cache only reuses full blocks; at most
    ``max_blocks`` are hashed, bounding the work per request. ``known``: the chain of a
    prefix of ``token_ids`` already hashed (a prompt's, for its prompt and answer), which
    the chain goes on from instead of hashing those blocks again.

    ``hash`` of a tuple of ints is not salted by PYTHONHASHSEED, so the chain is the same in
    every process of one Python version; it is ~7x cheaper than a cryptographic hash, and a
    collision costs only a misplaced cache hint.
    """
    if block_size < 1 or max_blocks < 0:
        raise ValueError("block_size >= 1 and max_blocks >= 0 required")
    num_blocks = min(len(token_ids) // block_size, max_blocks)
    hashes = list(known[:num_blocks])
    previous = hashes[-1] if hashes else 0
    for start in range(len(hashes) * block_size, num_blocks * block_size, block_size):
        previous = hash((previous, *token_ids[start:start + block_size]))
        hashes.append(previous)
    return tuple(hashes)


class ChainMemo:
    """The hash chains of the last few prompts, by the identity of their token tuple.

    One request's prompt is one tuple in the router's process, hashed by several readers
    of one belief (which replica holds its head: the path choice, then the decode router's
    ranking and its record of where the prompt went): up to 512 blocks, ~0.1 ms at 8K
    tokens, each time. The memo keeps a reference to each tuple it holds, so no other
    object can take its id while it is there. Not thread-safe: its owner guards it.
    """

    def __init__(self, size: int = 64):
        self._size = size
        # (id of the tuple, block size, blocks) -> (the tuple, its chain)
        self._chains: OrderedDict[tuple[int, int, int],
                                  tuple[Sequence[int], tuple[BlockHash, ...]]] = OrderedDict()

    def chain(self, token_ids: Sequence[int], block_size: int,
              max_blocks: int) -> tuple[BlockHash, ...]:
        """``prefix_block_hashes(token_ids, block_size, max_blocks)``, computed once per
        tuple (a list is hashed every time: it may change)."""
        if not isinstance(token_ids, tuple):
            return prefix_block_hashes(token_ids, block_size, max_blocks)
        key = (id(token_ids), block_size, max_blocks)
        kept = self._chains.get(key)
        if kept is not None and kept[0] is token_ids:
            self._chains.move_to_end(key)
            return kept[1]
        chain = prefix_block_hashes(token_ids, block_size, max_blocks)
        self._chains[key] = (token_ids, chain)
        while len(self._chains) > self._size:
            self._chains.popitem(last=False)
        return chain


class PrefixIndex:
    """Bounded LRU map: block-chain hash → the replica that last prefilled that prefix.

    It is the router's belief about the engines' prefix caches, not their truth: engines
    evict on their own. Size ``capacity`` (in blocks) around the pool's total prefix-cache
    blocks; a larger index only remembers prefixes the engines have already dropped.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._owner: OrderedDict[BlockHash, ReplicaId] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def match(self, hashes: Sequence[BlockHash]) -> dict[ReplicaId, int]:
        """Per replica, how many leading blocks of this chain it is believed to hold.

        A replica recorded for ``h_i`` prefilled the whole prefix up to block ``i``, so its
        match is the deepest such ``i`` (+1), even if shallower entries were taken over by
        another replica or evicted. Reading does not refresh recency: only routing does.
        """
        matched: dict[ReplicaId, int] = {}
        for depth, block_hash in enumerate(hashes, start=1):
            owner = self._owner.get(block_hash)
            if owner is not None:
                matched[owner] = depth
        return matched

    def record(self, hashes: Sequence[BlockHash], replica_id: ReplicaId) -> None:
        """``replica_id`` has (been sent to) prefill this chain: it now owns every block."""
        for block_hash in hashes:
            self._owner[block_hash] = replica_id
            self._owner.move_to_end(block_hash)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, replica_id: ReplicaId) -> None:
        """Drop a replica that left the pool (its cache went with it)."""
        for block_hash in [h for h, owner in self._owner.items() if owner == replica_id]:
            del self._owner[block_hash]

