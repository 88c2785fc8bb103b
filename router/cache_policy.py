"""The response cache's decisions (pure): what may be cached, under which key, for how long.

Only an answer the request determines is stored (greedy, or seeded, with one choice). The
key is the request as the engine is given it (prompt token ids and the answer-shaping
``SamplingParams`` fields, not how the answer is delivered), scoped by the version's
fingerprint and the tenant. ``LRUStore`` bounds a router replica's entries by bytes, entry
size and age, with the caller's clock. Why: docs/design.md, "A response cache behind
vLLM's layer, keyed by what the engine is given".
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

CacheResult = Literal["hit", "miss", "bypass"]

# vLLM samples greedily below this temperature (vllm/sampling_params.py, _SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5

# How the answer is delivered, not what it is: a stream and a unary request share an entry.
DELIVERY_FIELDS = frozenset({"output_kind", "stream_interval", "skip_clone"})


class Unkeyable(ValueError):
    """A request field with no canonical form (a callable, an object without fields)."""


def bypass_reason(sampling: Any) -> str | None:
    """Why the answer to a request with these ``SamplingParams`` must not be cached (None:
    it may be). Only a determined answer is stored: otherwise one sample would be replayed
    to every later request, where each should get its own."""
    if getattr(sampling, "n", 1) != 1:
        return "several choices (n > 1)"
    if sampling.temperature >= GREEDY_TEMPERATURE and sampling.seed is None:
        return "sampled without a seed"
    if getattr(sampling, "flat_logprobs", False):
        return "flat logprobs"
    return None


def canonical_request(token_ids: Sequence[int], sampling: Any,
                      extras: Mapping[str, Any] | None = None) -> str:
    """The request as one canonical string: the prompt's token ids, every answer-shaping
    field of ``sampling`` (a msgspec struct or a dataclass) and ``extras`` (what else the
    engine is given: the reasoning state). Raises ``Unkeyable`` for a field with no
    canonical form."""
    fields = {name: _plain(value) for name, value in _fields(sampling)
              if name not in DELIVERY_FIELDS}
    # The ids packed and digested, not written out as JSON: 10x faster on a long prompt.
    prompt = hashlib.sha256(array("q", token_ids).tobytes()).hexdigest()
    document = {"prompt": prompt, "prompt_tokens": len(token_ids), "sampling": fields,
                "extras": _plain(dict(extras or {}))}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=True)


def cache_key(version_fingerprint: str, tenant: str, canonical: str) -> str:
    """The entry's key: a digest of the version, the tenant and the canonical request."""
    digest = hashlib.sha256()
    for part in (version_fingerprint, tenant, canonical):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def merge_results(results: Iterable[CacheResult]) -> CacheResult | None:
    """One answer's cache result from its prompts' (a batched completion has several): a
    hit only when every prompt hit, a miss when any was computed for the cache."""
    seen = set(results)
    if not seen:
        return None
    if seen == {"hit"}:
        return "hit"
    return "miss" if "miss" in seen else "bypass"


def _fields(value: Any) -> list[tuple[str, Any]]:
    if hasattr(value, "__struct_fields__"):  # msgspec.Struct (SamplingParams)
        return [(name, getattr(value, name)) for name in value.__struct_fields__]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(field.name, getattr(value, field.name)) for field in dataclasses.fields(value)]
    raise Unkeyable(f"{type(value).__name__} has no fields to key on")


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data that is equal exactly when the values are."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # JSON would merge 1 and 1.0 (harmless) but not NaN with itself: name them.
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return sorted(([_plain(key), _plain(item)] for key, item in value.items()),
                      key=json.dumps)
    if isinstance(value, set | frozenset):
        return sorted((_plain(item) for item in value), key=json.dumps)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return {"__type__": type(value).__name__,
            "fields": {name: _plain(item) for name, item in _fields(value)}}


@dataclass
class StoreStats:
    """What one ``LRUStore`` holds and has done."""

    entries: int = 0
    bytes: int = 0
    evicted: int = 0     # pushed out by the byte bound
    expired: int = 0     # found older than the TTL
    refused: int = 0     # larger than one entry may be


class LRUStore:
    """Entries by key, least recently used evicted first, bounded by total bytes, entry
    size and age (``now`` is the caller's clock, in seconds)."""

    def __init__(self, max_bytes: int, max_entry_bytes: int, ttl_s: float):
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self.ttl_s = ttl_s
        self.stats = StoreStats()
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()

    def get(self, key: str, now: float) -> bytes | None:
        """The entry under ``key`` (now the most recently used), None if absent or expired."""
        found = self._entries.get(key)
        if found is None:
            return None
        value, stored_at = found
        if now - stored_at >= self.ttl_s:
            self._drop(key)
            self.stats.expired += 1
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: bytes, now: float) -> bool:
        """Store ``value`` (replacing an entry of the same key); False when it is larger
        than one entry may be. Evicts the least recently used until the bytes fit."""
        if len(value) > self.max_entry_bytes:
            self.stats.refused += 1
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (value, now)
        self.stats.entries += 1
        self.stats.bytes += len(value)
        while self.stats.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats.evicted += 1
        return True

    def clear(self) -> None:
        """Forget every entry (the counts of what was done stay)."""
        self._entries.clear()
        self.stats.entries = self.stats.bytes = 0

    def _drop(self, key: str) -> None:
        value, _ = self._entries.pop(key)
        self.stats.entries -= 1
        self.stats.bytes -= len(value)
