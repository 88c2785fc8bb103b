"""How often a decode replica sends a stream's outputs to its router (pure).

At most one chunk per interval: after a chunk leaves, the replica waits out the rest of
the interval before it takes the next output, and vLLM merges the tokens made meanwhile
into one delta. The first and the last output leave at once, and so does a token after a
quiet spell of an interval. The interval follows the replica's load: its streams together
send at most ``router.stream_chunks_per_s`` chunks a second, so a lightly loaded replica
sends every token as its own chunk, and a busy one up to
``router.stream_chunk_interval_ms`` apart. Why and what it saves: docs/design.md, "A
stream leaves the decode pool in chunks, at most one per interval".
"""

from __future__ import annotations


def stream_interval(max_interval_s: float, streams: int, chunks_per_s: float) -> float:
    """The interval a stream's chunks keep while ``streams`` streams (this one included)
    leave the replica: their chunks together at most ``chunks_per_s``, so each stream's
    ``streams / chunks_per_s`` apart, never more than ``max_interval_s``. An interval
    shorter than the engine's step paces nothing: every token is a chunk. ``chunks_per_s``
    0: ``max_interval_s`` whatever the load."""
    if chunks_per_s <= 0:
        return max_interval_s
    return min(max_interval_s, max(1, streams) / chunks_per_s)


def hold_before_next(sent_at: float, now: float, interval_s: float, finished: bool) -> float:
    """Seconds to wait before taking the next output, a chunk having left at ``sent_at``.

    ``interval_s`` 0 sends every output as it comes; a finished stream has no next output.
    """
    if finished or interval_s <= 0:
        return 0.0
    return max(0.0, sent_at + interval_s - now)
