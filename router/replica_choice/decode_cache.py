"""What each decode replica is believed to hold in its prefix cache (pure): the prompts routed
to it and the finished requests' prompts and answers. The reasoning: docs/design.md, "The
next turn stays on its decode engine".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from router.replica_choice.loads import ReplicaId
from router.replica_choice.prefixes import (
    BlockHash,
    ChainMemo,
    PrefixIndex,
    prefix_block_hashes,
)


class DecodeCacheBelief:
    """What each decode replica is believed to hold in its prefix cache: the prompts routed
    to it and, once a request has finished there, its prompt and answer (the engine cached
    the answer's blocks as it generated them, so the next turn of the conversation finds
    them). Not thread-safe: router/decode_prefixes.py guards it.
    """

    def __init__(self, block_size: int, max_blocks: int, capacity: int,
                 max_requests: int = 10_000):
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._index = PrefixIndex(capacity)
        self._chains = ChainMemo()
        self._routed: OrderedDict[str, ReplicaId] = OrderedDict()
        self._max_requests = max_requests

    @property
    def settings(self) -> tuple[int, int, int]:
        """What two beliefs must share to be one (block size, blocks hashed, capacity)."""
        return self.block_size, self.max_blocks, self._index.capacity

    def hashes(self, token_ids: Sequence[int]) -> tuple[BlockHash, ...]:
        return self._chains.chain(token_ids, self.block_size, self.max_blocks)

    def match(self, token_ids: Sequence[int]) -> dict[ReplicaId, int]:
        """Per replica, how many leading blocks of ``token_ids`` it is believed to hold."""
        return self.match_chain(self.hashes(token_ids))

    def holder(self, token_ids: Sequence[int]) -> tuple[ReplicaId | None, int]:
        """The replica believed to hold the longest head of ``token_ids``, and how many
        tokens of it (``(None, 0)``: none holds a whole block)."""
        return self.holder_of_chain(self.hashes(token_ids), len(token_ids))

    def routed(self, request_id: str, token_ids: Sequence[int], replica: ReplicaId) -> None:
        """``request_id`` went to ``replica``, which will hold its prompt."""
        self.routed_chain(request_id, self.hashes(token_ids), replica)

    def finished(self, request_id: str, sequence: Sequence[int],
                 prompt: Sequence[int] = ()) -> None:
        """``request_id`` ended with ``sequence`` (prompt and answer) computed on the replica
        it was routed to (unknown, or forgotten: nothing recorded). The last generated
        token was never fed back, so its KV does not exist: it is left out. ``prompt``, the
        head of ``sequence`` the request was routed with, spares hashing it again."""
        if request_id in self._routed:
            known = self.hashes(prompt) if prompt else ()
            self.finished_chain(request_id, prefix_block_hashes(
                sequence[:-1], self.block_size, self.max_blocks, known))

    # The same, given the prompt's chain of block hashes instead of its tokens (the
    # planner's simulator, tools/planner/des.py, has prompts as chains, not tokens).

    def match_chain(self, chain: Sequence[BlockHash]) -> dict[ReplicaId, int]:
        return self._index.match(chain[:self.max_blocks])

    def holder_of_chain(self, chain: Sequence[BlockHash],
                        prompt_tokens: int) -> tuple[ReplicaId | None, int]:
        matched = self.match_chain(chain)
        if not matched:
            return None, 0
        replica = max(sorted(matched), key=lambda r: matched[r])
        return replica, min(matched[replica] * self.block_size, prompt_tokens)

    def routed_chain(self, request_id: str, chain: Sequence[BlockHash],
                     replica: ReplicaId) -> None:
        self._index.record(chain[:self.max_blocks], replica)
        self._routed[request_id] = replica
        self._routed.move_to_end(request_id)
        while len(self._routed) > self._max_requests:
            self._routed.popitem(last=False)

    def finished_chain(self, request_id: str, chain: Sequence[BlockHash]) -> None:
        """``chain``: of the prompt and answer, less the answer's last token."""
        replica = self._routed.pop(request_id, None)
        if replica is not None:
            self._index.record(chain[:self.max_blocks], replica)

    def forget(self, replica: ReplicaId) -> None:
        """A replica that left the pool (its cache went with it)."""
        self._index.forget(replica)
        for request_id in [r for r, owner in self._routed.items() if owner == replica]:
            del self._routed[request_id]
