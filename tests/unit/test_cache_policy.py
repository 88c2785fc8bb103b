"""The response cache's decisions (router/cache_policy.py): what may be cached, the key, the
bounded store, and one answer's result from its prompts'."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field

import pytest

from router.cache_policy import (
    LRUStore,
    Unkeyable,
    bypass_reason,
    cache_key,
    canonical_request,
    merge_results,
)


class Kind(enum.Enum):
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class Structured:
    json: dict | None = None
    regex: str | None = None


@dataclass
class Sampling:
    """The shape of vLLM's ``SamplingParams`` as the policy reads it (fields by name)."""

    n: int = 1
    temperature: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] | None = None
    stop_token_ids: set[int] = field(default_factory=set)
    structured_outputs: Structured | None = None
    flat_logprobs: bool = False
    output_kind: Kind = Kind.DELTA
    stream_interval: int = 1
    skip_clone: bool = False


def key(sampling: Sampling, prompt=(1, 2, 3), tenant="key:a", version="v1@abc",
        extras=None) -> str:
    return cache_key(version, tenant, canonical_request(prompt, sampling, extras))


@pytest.mark.parametrize(("sampling", "reason"), [
    (Sampling(), None),                                   # greedy
    (Sampling(temperature=1e-6), None),                   # below vLLM's greedy threshold
    (Sampling(temperature=0.8, seed=7), None),            # seeded
    (Sampling(temperature=0.8), "sampled without a seed"),
    (Sampling(n=2), "several choices (n > 1)"),
    (Sampling(flat_logprobs=True), "flat logprobs"),
])
def test_only_a_determined_answer_is_cached(sampling, reason):
    assert bypass_reason(sampling) == reason


def test_the_same_request_gets_the_same_key_whatever_the_order_of_its_maps():
    a = Sampling(logit_bias={5: 1.0, 9: -2.0}, stop_token_ids={3, 1, 2})
    b = Sampling(logit_bias={9: -2.0, 5: 1.0}, stop_token_ids={2, 3, 1})
    assert key(a) == key(b)


@pytest.mark.parametrize("change", [
    {"max_tokens": 17}, {"stop": ["\n"]}, {"seed": 1}, {"temperature": 0.5, "seed": 1},
    {"logit_bias": {5: 1.0}}, {"structured_outputs": Structured(regex="[a-z]+")},
    {"structured_outputs": Structured(json={"type": "object"})},
])
def test_every_answer_shaping_field_is_in_the_key(change):
    assert key(dataclasses.replace(Sampling(), **change)) != key(Sampling())


def test_how_the_answer_is_delivered_is_not_in_the_key():
    streamed = Sampling(output_kind=Kind.DELTA, stream_interval=1)
    whole = Sampling(output_kind=Kind.FINAL_ONLY, stream_interval=8, skip_clone=True)
    assert key(streamed) == key(whole)


def test_the_prompt_the_tenant_the_version_and_the_extras_are_in_the_key():
    base = key(Sampling())
    assert key(Sampling(), prompt=(1, 2, 4)) != base
    assert key(Sampling(), tenant="key:b") != base
    assert key(Sampling(), version="v1@abd") != base          # the weights changed
    assert key(Sampling(), extras={"reasoning_ended": True}) != base


def test_a_field_without_a_canonical_form_is_unkeyable():
    with pytest.raises(Unkeyable):
        canonical_request([1], Sampling(structured_outputs=lambda: None))  # a callable


def test_nan_is_keyed_as_itself():
    assert key(Sampling(logit_bias={1: math.nan})) == key(Sampling(logit_bias={1: math.nan}))


@pytest.mark.parametrize(("results", "merged"), [
    ([], None), (["hit"], "hit"), (["hit", "hit"], "hit"), (["miss"], "miss"),
    (["hit", "miss"], "miss"), (["bypass"], "bypass"), (["hit", "bypass"], "bypass"),
    (["bypass", "miss"], "miss"),
])
def test_an_answer_is_a_hit_only_when_every_prompt_hit(results, merged):
    assert merge_results(results) == merged


def test_the_store_evicts_the_least_recently_used_to_fit_its_bytes():
    store = LRUStore(max_bytes=10, max_entry_bytes=10, ttl_s=60)
    store.put("a", b"aaaa", now=0)
    store.put("b", b"bbbb", now=0)
    assert store.get("a", now=1) == b"aaaa"     # a is now the most recently used
    store.put("c", b"cccc", now=2)              # 12 bytes: b goes
    assert store.get("b", now=2) is None
    assert store.get("a", now=2) == b"aaaa" and store.get("c", now=2) == b"cccc"
    assert (store.stats.entries, store.stats.bytes, store.stats.evicted) == (2, 8, 1)


def test_an_entry_expires_after_the_ttl_and_its_bytes_go_back():
    store = LRUStore(max_bytes=100, max_entry_bytes=100, ttl_s=10)
    store.put("a", b"aaaa", now=0)
    assert store.get("a", now=9.9) == b"aaaa"
    assert store.get("a", now=10) is None
    assert (store.stats.entries, store.stats.bytes, store.stats.expired) == (0, 0, 1)


def test_an_entry_larger_than_allowed_is_refused_and_replacing_one_keeps_the_count():
    store = LRUStore(max_bytes=100, max_entry_bytes=4, ttl_s=10)
    assert not store.put("big", b"12345", now=0)
    assert store.put("a", b"1234", now=0) and store.put("a", b"12", now=1)
    assert (store.stats.entries, store.stats.bytes, store.stats.refused) == (1, 2, 1)
    store.clear()
    assert (store.stats.entries, store.stats.bytes) == (0, 0)
    assert store.get("a", now=1) is None
