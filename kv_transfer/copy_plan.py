"""Which bytes a same-host KV read copies: NIXL descriptors turned into memory copies (pure).

A decode engine pulls KV as a NIXL READ: a list of local descriptors (its own blocks) and
a list of remote ones (the prefill engine's blocks), paired by position. When the prefill
engine's KV cache is shared memory that this process has mapped, the same READ is a
series of ``memmove`` calls from the mapping into the local blocks. This module decides
those calls; it touches no memory, so any address is just an int here.

Adjacent pairs (the next block follows the last on both sides, as consecutive blocks of
one layer do) merge into one copy: one long copy streams at memory speed, where one call
per block pays a call and a cold start per 16 KiB (docs/benchmarks.md, "KV-transfer
micro-benchmark").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Copy = tuple[int, int, int]  # (destination, source, length), as for memmove


@dataclass(frozen=True)
class Segment:
    """Memory of a peer mapped into this process: the peer's ``size`` bytes at
    ``peer_addr`` are readable here at ``local_addr``."""

    peer_addr: int
    size: int
    local_addr: int


class SegmentMap:
    """A peer's mapped segments, found by address."""

    def __init__(self, segments: Sequence[Segment]):
        ordered = sorted(segments, key=lambda segment: segment.peer_addr)
        self._peer = np.array([s.peer_addr for s in ordered], dtype=np.int64)
        self._end = np.array([s.peer_addr + s.size for s in ordered], dtype=np.int64)
        self._local = np.array([s.local_addr for s in ordered], dtype=np.int64)

    def local_addresses(self, addrs: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
        """Where the peer's ``lengths[i]`` bytes at ``addrs[i]`` are readable here; None
        when any of them is not all inside one mapped segment."""
        if len(self._peer) == 1:  # one cache, one segment: no search
            if addrs.min() < self._peer[0] or (addrs + lengths).max() > self._end[0]:
                return None
            return addrs + (self._local[0] - self._peer[0])
        if not len(self._peer):
            return None
        index = np.searchsorted(self._peer, addrs, side="right") - 1
        if index.min() < 0 or (addrs + lengths > self._end[index]).any():
            return None
        return self._local[index] + (addrs - self._peer[index])


def descriptor_table(descs) -> np.ndarray | None:
    """(address, length) rows of NIXL descriptors given as an Nx3 array or a list of
    (address, length, device) tuples, the forms vLLM passes; None for any other form."""
    if isinstance(descs, np.ndarray):
        if descs.ndim == 2 and descs.shape[1] == 3:
            return descs[:, :2].astype(np.int64)
        return None
    if isinstance(descs, list) and descs and all(
            isinstance(desc, tuple) and len(desc) == 3 for desc in descs):
        return np.array([desc[:2] for desc in descs], dtype=np.int64)
    return None


def copies_for_read(
    local_descs: np.ndarray, local_ids, remote_descs: np.ndarray, remote_ids,
    peer: SegmentMap,
) -> list[Copy] | None:
    """The copies that perform a READ of ``remote_descs[remote_ids[i]]`` into
    ``local_descs[local_ids[i]]`` for every ``i`` (tables from ``descriptor_table``),
    adjacent ones merged.

    None when the READ cannot be done by copying: the index lists differ in length or
    leave their table, a pair differs in length, or a remote descriptor lies outside the
    peer's mapped segments. The caller then lets NIXL move it.
    """
    local_ids = np.asarray(local_ids, dtype=np.int64)
    remote_ids = np.asarray(remote_ids, dtype=np.int64)
    if local_ids.shape != remote_ids.shape or local_ids.ndim != 1 or not len(local_ids):
        return None
    if min(local_ids.min(), remote_ids.min()) < 0:  # numpy would count from the end
        return None
    try:
        local, remote = local_descs[local_ids], remote_descs[remote_ids]
    except IndexError:  # past the end of a table
        return None
    lengths = local[:, 1]
    if not np.array_equal(remote[:, 1], lengths):
        return None
    sources = peer.local_addresses(remote[:, 0], lengths)
    if sources is None:
        return None
    return _merged(local[:, 0], sources, lengths)


def _merged(destinations: np.ndarray, sources: np.ndarray, lengths: np.ndarray) -> list[Copy]:
    """One copy per run of pairs that continue the previous one on both sides."""
    ends = lengths[:-1]
    breaks = np.flatnonzero((destinations[1:] != destinations[:-1] + ends)
                            | (sources[1:] != sources[:-1] + ends)) + 1
    if not len(breaks):  # the common case: one run
        return [(int(destinations[0]), int(sources[0]), int(lengths.sum()))]
    starts = np.concatenate(([0], breaks))
    run_lengths = np.add.reduceat(lengths, starts)
    return list(zip(destinations[starts].tolist(), sources[starts].tolist(),
                    run_lengths.tolist(), strict=True))
