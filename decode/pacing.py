"""How often a decode replica sends a stream's outputs to its router (pure).

Every output a decode replica yields is one Ray round trip to the router and, through
vLLM's OpenAI layer there, one SSE event through Serve's proxy: on this project's CPU
machines those hops cost a large share of a decode step's CPU per token, and they take it
from the engines (docs/benchmarks.md, "The hot path"). So a stream sends at most one
chunk per interval: after a chunk leaves, the replica waits out the rest of the interval
before it takes the next output, and vLLM merges the tokens made meanwhile into one delta
(its per-request output collector does that for a consumer that falls behind).

What this keeps: the first output leaves at once (TTFT unchanged), so does the last
(nothing waits after it), and a token made after a quiet spell of at least the interval
leaves at once: an engine slower than one token per interval streams every token as it
exists. Only tokens made faster than that are grouped, each delayed by less than the
interval.
"""

from __future__ import annotations


def hold_before_next(sent_at: float, now: float, interval_s: float, finished: bool) -> float:
    """Seconds to wait before taking the next output, a chunk having left at ``sent_at``.

    ``interval_s`` 0 sends every output as it comes; a finished stream has no next output.
    """
    if finished or interval_s <= 0:
        return 0.0
    return max(0.0, sent_at + interval_s - now)
