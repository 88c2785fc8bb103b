"""Whether an engine that has work has stopped stepping (pure: times are passed in).

vLLM's scheduler reports its stats after every step, an empty one included, so a gap
between reports while the engine holds requests (by its own last report, or a request
handed to it since) is a stall. ``StepWatch`` keeps those times; ``is_stalled`` compares
with ``engine.stall_timeout_s``. Why: docs/design.md, "Retries, migration and deadlines".
"""

from __future__ import annotations


class StepWatch:
    """The time since an engine that had work last stepped."""

    def __init__(self) -> None:
        self._waiting_since: float | None = None  # work known and no step since
        self._unstepped = 0      # requests handed over since the last step
        self._held = False       # the last step left requests in the engine

    def submitted(self, now: float) -> None:
        """A request was handed to the engine at ``now``."""
        self._unstepped += 1
        if self._waiting_since is None:
            self._waiting_since = now

    def refused(self) -> None:
        """A request handed over since the last step never entered the engine (its input
        processor refused it): when it was the only work known, the engine has none, and
        no step will come to say so."""
        self._unstepped = max(0, self._unstepped - 1)
        if self._unstepped == 0 and not self._held:
            self._waiting_since = None

    def stepped(self, now: float, has_requests: bool) -> None:
        """The engine reported a step at ``now``, after which it holds ``has_requests``."""
        self._unstepped = 0
        self._held = has_requests
        self._waiting_since = now if has_requests else None

    def stalled_s(self, now: float) -> float:
        """Seconds the engine has had work and made no step; 0 while idle."""
        if self._waiting_since is None:
            return 0.0
        return max(0.0, now - self._waiting_since)


def is_stalled(stalled_s: float, limit_s: float | None) -> bool:
    """``stalled_s`` reached ``limit_s`` (``None``: never)."""
    return limit_s is not None and stalled_s >= limit_s
