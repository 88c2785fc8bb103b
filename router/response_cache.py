"""The router's response cache: stores, single flight and replay (shell).

``router.cache_policy`` decides what may be cached and under which key; this module keeps
the entries (``MemoryStore`` in the router replica, or ``RedisStore`` shared by several),
makes identical requests in flight compute once (``ResponseCache.lookup_or_lead``) and
turns a finished answer into a JSON entry and back (``encode_output``, ``replayed_output``).
A failing store is a miss, never a failed request. Why: docs/design.md, "A response cache
behind vLLM's layer, keyed by what the engine is given".
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cluster import metrics as m
from router.cache_policy import LRUStore, Unkeyable, bypass_reason, cache_key, canonical_request
from router.timing_metrics import RECORDER

if TYPE_CHECKING:
    from cluster.config import ResponseCacheConfig

logger = logging.getLogger(__name__)

# Finish reasons of a complete answer: only those are stored (an aborted or failed stream
# is not an answer).
COMPLETE = frozenset({"stop", "length"})


class CacheStore(Protocol):
    """Where entries live: bytes under a key, each for the store's TTL."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class MemoryStore:
    """Entries in this router replica's memory: LRU, bounded by bytes and age."""

    def __init__(self, max_bytes: int, max_entry_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self._lru = LRUStore(max_bytes, max_entry_bytes, ttl_s)
        self._clock = clock

    async def get(self, key: str) -> bytes | None:
        return self._lru.get(key, self._clock())

    async def put(self, key: str, value: bytes) -> None:
        self._lru.put(key, value, self._clock())

    def describe(self) -> dict[str, Any]:
        stats = self._lru.stats
        return {"store": "memory", "entries": stats.entries, "bytes": stats.bytes,
                "max_bytes": self._lru.max_bytes, "evicted": stats.evicted,
                "expired": stats.expired, "refused": stats.refused}


class RedisStore:
    """Entries in a Redis server shared by every router replica. Redis bounds the bytes
    (its ``maxmemory`` with an LRU policy); each entry expires after ``ttl_s``."""

    def __init__(self, url: str, max_entry_bytes: int, ttl_s: float,
                 timeout_s: float = 0.5):
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No retries: a cache that is down must cost a request one failed call, not a
        # series of backoffs (redis-py retries three times by default).
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s,
                                           retry=Retry(NoBackoff(), 0))
        self._url = url
        self._max_entry_bytes = max_entry_bytes
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self.errors = 0

    async def get(self, key: str) -> bytes | None:
        try:
            return await self._redis.get(_redis_key(key))
        except Exception as error:  # the cache is an optimisation: a miss, never a 500
            self._failed("get", error)
            return None

    async def put(self, key: str, value: bytes) -> None:
        if len(value) > self._max_entry_bytes:
            return
        try:
            await self._redis.set(_redis_key(key), value, px=self._ttl_ms)
        except Exception as error:
            self._failed("put", error)

    def describe(self) -> dict[str, Any]:
        return {"store": "redis", "errors": self.errors}

    def _failed(self, operation: str, error: BaseException) -> None:
        self.errors += 1
        RECORDER.inc(m.RESPONSE_CACHE_ERRORS, {"operation": operation})
        logger.warning("response cache: Redis %s failed (%r); answered as a miss",
                       operation, error)


def _redis_key(key: str) -> str:
    return f"pdserve:response:{key}"


class LeaderGone(Exception):
    """The request a follower was streaming from ended before its answer did (its client
    left, or its pools failed it)."""


class Recording:
    """The answer a leading request is computing: kept as it streams, for the requests that
    follow it (identical ones that arrived meanwhile) and, once complete, for the store."""

    def __init__(self, cache: ResponseCache, key: str):
        self._cache = cache
        self._key = key
        self._outputs: list[Any] = []     # what the leader's client got, in order
        self._ended = False               # the leader stopped: finished, failed or left
        self._news = asyncio.Event()      # set (and replaced) when either changes

    def add(self, output: Any) -> None:
        """One ``RequestOutput`` (a delta or the whole answer) passed to the leader's
        client; when it completes the answer, the entry is stored in the background."""
        self._outputs.append(output)
        if output.finished:
            self._ended = True
            self._store()
        self._wake()

    def close(self) -> None:
        """The leader is over. Followers whose answer is not complete go on without it."""
        if not self._ended:
            self._ended = True
            self._cache.forget(self._key, self)
            self._wake()

    async def follow(self, request_id: str, deltas: bool) -> AsyncIterator[Any]:
        """The leader's outputs under ``request_id``: as they come when ``deltas``, else
        one final output. Raises ``LeaderGone`` if the leader stops short of its end."""
        index, merged = 0, None
        while True:
            news = self._news  # taken before looking: an output added after wakes it
            while index < len(self._outputs):
                output = copy.deepcopy(self._outputs[index])
                index += 1
                output.request_id = request_id
                if not deltas:
                    merged = output if merged is None else _merged(merged, output)
                    output = merged
                if output.finished:
                    yield output
                    return
                if deltas:
                    yield output
            if self._ended:
                raise LeaderGone(f"the answer being computed for {self._key[:12]} stopped")
            await news.wait()

    def _wake(self) -> None:
        self._news.set()
        self._news = asyncio.Event()

    def _store(self) -> None:
        answer = copy.deepcopy(self._outputs[0])  # the clients' copies stay deltas
        for output in self._outputs[1:]:
            answer.add(output, aggregate=True)
        if all(choice.finish_reason in COMPLETE for choice in answer.outputs):
            self._cache.store_later(self._key, encode_output(answer), self)
        else:
            self._cache.forget(self._key, self)


def _merged(merged: Any, output: Any) -> Any:
    merged.add(output, aggregate=True)
    return merged


@dataclass
class Lookup:
    """What the cache has for a request: a stored answer (``entry``), an identical request
    computing it now (``leader``, to follow), or neither (``recording``: compute it)."""

    entry: dict | None = None
    leader: Recording | None = None
    recording: Recording | None = None


class ResponseCache:
    """One model version's response cache in one router replica."""

    def __init__(self, store: CacheStore, version: str, fingerprint: str):
        self._store = store
        self._version = version
        self._fingerprint = fingerprint
        self._in_flight: dict[str, Recording] = {}
        self._tasks: set[asyncio.Task] = set()

    def key_for(self, tenant: str, token_ids: Sequence[int], sampling: Any,
                extras: dict[str, Any]) -> str | None:
        """The entry's key for this request; None when its answer must not be cached."""
        if bypass_reason(sampling) is not None:
            return None
        try:
            canonical = canonical_request(token_ids, sampling, extras)
        except Unkeyable:
            return None
        return cache_key(self._fingerprint, tenant, canonical)

    async def lookup(self, key: str) -> Lookup:
        """A request computing ``key`` in this replica is followed (single flight: its
        outputs stream to every identical request that arrives meanwhile); else the
        store's entry; else the caller leads, recording what it computes."""
        leader = self._in_flight.get(key)
        if leader is not None:
            return Lookup(leader=leader)
        entry = await self._store.get(key)
        if entry is not None:
            return Lookup(entry=decode_output(entry))
        leader = self._in_flight.get(key)  # one may have started while the store answered
        if leader is not None:
            return Lookup(leader=leader)
        recording = self._in_flight[key] = Recording(self, key)
        return Lookup(recording=recording)

    def store_later(self, key: str, entry: bytes, recording: Recording) -> None:
        """Store ``entry`` in the background (the leader's stream does not wait for it).
        Until it is stored, a request that arrives follows the finished recording."""
        async def put() -> None:
            try:
                await self._store.put(key, entry)
            finally:
                self.forget(key, recording)

        task = asyncio.ensure_future(put())
        self._tasks.add(task)  # kept referenced until done
        task.add_done_callback(self._tasks.discard)

    def forget(self, key: str, recording: Recording) -> None:
        if self._in_flight.get(key) is recording:
            del self._in_flight[key]

    def count(self, result: str, prompt_tokens: int = 0, generated_tokens: int = 0) -> None:
        """Count one prompt's cache result; a hit also counts the tokens it saved."""
        RECORDER.inc(m.RESPONSE_CACHE_REQUESTS, {"version": self._version, "result": result})
        if result == "hit":
            tags = {"version": self._version}
            RECORDER.inc(m.RESPONSE_CACHE_SAVED_TOKENS, {**tags, "kind": "prompt"},
                          prompt_tokens)
            RECORDER.inc(m.RESPONSE_CACHE_SAVED_TOKENS, {**tags, "kind": "generation"},
                          generated_tokens)

    @property
    def in_flight(self) -> int:
        """Answers being computed that identical requests may be waiting on."""
        return len(self._in_flight)


def cache_store(config: ResponseCacheConfig) -> CacheStore | None:
    """The store the config names; None when the cache is off."""
    if not config.enabled:
        return None
    if config.store == "redis":
        return RedisStore(config.redis_url, config.max_entry_bytes, config.ttl_s)
    return MemoryStore(config.max_bytes, config.max_entry_bytes, config.ttl_s)


def version_fingerprint(version: str, checkpoint: Path) -> str:
    """What identifies a version's weights: its name, its checkpoint's path and each file's
    name, size and modification time (a rebuilt or replaced checkpoint changes it, and
    with it every key: its old entries are never served)."""
    digest = hashlib.sha256(f"{version}\0{checkpoint.resolve()}\0".encode())
    if checkpoint.is_dir():
        for path in sorted(checkpoint.rglob("*")):
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path.relative_to(checkpoint)}\0{stat.st_size}\0"
                              f"{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


# ---- entries ---------------------------------------------------------------------------

def encode_output(output: Any) -> bytes:
    """A finished ``RequestOutput`` as an entry (JSON; ids and timings left out)."""
    document = {
        "prompt_logprobs": _encode_logprobs(output.prompt_logprobs),
        "num_cached_tokens": output.num_cached_tokens,
        "outputs": [{
            "index": choice.index, "text": choice.text,
            "token_ids": list(choice.token_ids),
            "cumulative_logprob": choice.cumulative_logprob,
            "logprobs": _encode_logprobs(choice.logprobs),
            "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason,
        } for choice in output.outputs],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_output(entry: bytes) -> dict[str, Any]:
    return json.loads(entry)


def replayed_output(entry: dict[str, Any], request_id: str, prompt_token_ids: list[int]):
    """The stored answer as this request's one, finished ``RequestOutput``."""
    from vllm.outputs import CompletionOutput, RequestOutput

    outputs = [CompletionOutput(
        index=choice["index"], text=choice["text"], token_ids=choice["token_ids"],
        cumulative_logprob=choice["cumulative_logprob"],
        logprobs=_decode_logprobs(choice["logprobs"]),
        finish_reason=choice["finish_reason"], stop_reason=choice["stop_reason"],
    ) for choice in entry["outputs"]]
    return RequestOutput(request_id, None, prompt_token_ids,
                         _decode_logprobs(entry["prompt_logprobs"]), outputs, finished=True,
                         num_cached_tokens=entry["num_cached_tokens"])


def generated_tokens(entry: dict[str, Any]) -> int:
    return sum(len(choice["token_ids"]) for choice in entry["outputs"])


def _encode_logprobs(logprobs: Any) -> list | None:
    """Per position: None, or [token id, logprob, rank, decoded token] per candidate."""
    if logprobs is None:
        return None
    return [None if position is None else
            [[token, lp.logprob, lp.rank, lp.decoded_token] for token, lp in position.items()]
            for position in logprobs]


def _decode_logprobs(encoded: list | None) -> list | None:
    if encoded is None:
        return None
    from vllm.logprobs import Logprob

    return [None if position is None else
            {token: Logprob(logprob, rank, decoded) for token, logprob, rank, decoded
             in position}
            for position in encoded]
