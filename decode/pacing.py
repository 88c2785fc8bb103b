"""How often a decode replica sends a stream's outputs to its router (pure).

At most one chunk per interval (``router.stream_chunk_interval_ms``): after a chunk leaves,
the replica waits out the rest of the interval before it takes the next output, and vLLM
merges the tokens made meanwhile into one delta. The first and the last output leave at
once, and so does a token after a quiet spell of an interval. Why and what it saves:
docs/design.md, "A stream leaves the decode pool in chunks, at most one per interval".
"""

from __future__ import annotations


def hold_before_next(sent_at: float, now: float, interval_s: float, finished: bool) -> float:
    """Seconds to wait before taking the next output, a chunk having left at ``sent_at``.

    ``interval_s`` 0 sends every output as it comes; a finished stream has no next output.
    """
    if finished or interval_s <= 0:
        return 0.0
    return max(0.0, sent_at + interval_s - now)
