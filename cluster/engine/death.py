"""Why an engine died, as the requests that were in it see it (pure: exit codes passed in).

A request whose engine died is retried on another replica (router/retry.py), unless the
death may have been its own doing: a request that makes an engine fail would take every
replica down, one retry at a time. Why: docs/design.md, "Quarantine: a request that
kills its engine is not retried".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

# "killed": a signal ended an engine process (a kill from outside, the kernel's OOM killer,
# the replica's own kill of a hung engine): nothing a request in it did wrong.
# "crashed": the engine ended of an error of its own, a Python exception in its core (vLLM
# then tells its client it is dead and exits with status 1), or it has not exited yet.
DeathCause = Literal["killed", "crashed"]


def death_cause(exit_codes: Sequence[int | None], killed_by_replica: bool) -> DeathCause:
    """How an engine whose processes ended with ``exit_codes`` (None: still running,
    negative: ended by that signal) died; ``killed_by_replica``: its replica killed it."""
    if killed_by_replica or any(code is not None and code < 0 for code in exit_codes):
        return "killed"
    return "crashed"
