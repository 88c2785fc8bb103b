"""Requests that killed an engine, remembered for a while (pure: clock passed in).

A quarantined request is answered 500 (router/retry.py, ``quarantines``), and OpenAI's
SDKs resend a 500 twice by default: each resend would meet a fresh engine and might kill
it too. So the router remembers what it quarantined, by a fingerprint of the request as
the engine saw it (prompt token ids and sampling parameters), and answers a resend at
once, before any engine sees it. Per router replica and bounded in size and time: a
resend that reaches another router replica, or comes after ``ttl_s``, meets an engine
again (and is quarantined again if it kills it).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def fingerprint(prompt_token_ids: Sequence[int], sampling: Any) -> str:
    """What identifies a request to an engine: its prompt's tokens and its sampling
    parameters (vLLM's ``SamplingParams``, by their repr: a resend's are identical)."""
    digest = hashlib.sha256(array("q", prompt_token_ids).tobytes())
    digest.update(repr(sampling).encode())
    return digest.hexdigest()


class QuarantineMemory:
    """Fingerprints of quarantined requests, each for ``ttl_s``, at most ``max_entries``
    (the oldest forgotten first)."""

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 1024):
        self._ttl_s, self._max_entries = ttl_s, max_entries
        self._until: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def remember(self, print_: str, now: float) -> None:
        self._until.pop(print_, None)
        self._until[print_] = now + self._ttl_s
        while len(self._until) > self._max_entries:
            self._until.popitem(last=False)

    def holds(self, print_: str, now: float) -> bool:
        until = self._until.get(print_)
        if until is None:
            return False
        if now >= until:
            del self._until[print_]
            return False
        return True
