"""Choosing a model version: weighted splits, sticky users, monotone canary growth."""

import math
import random
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from router.versions import (
    Rollout,
    choose_version,
    split_for_canary,
    sticky_key_for,
    validate_weights,
)

KEYS = [f"user-{i}" for i in range(2000)]

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789.-", min_size=1, max_size=8)
weight_maps = st.dictionaries(names, st.integers(0, 100), min_size=1, max_size=4).filter(
    lambda weights: any(weights.values()))


def within_binomial_bound(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """|count - n p| within ``sigmas`` standard deviations (plus one for p near 0 or 1)."""
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


def assert_split_honours(counts: Counter, weights: dict[str, int], n: int) -> None:
    total = sum(weights.values())
    for version, weight in weights.items():
        assert within_binomial_bound(counts[version], n, weight / total), (counts, weights)
    assert set(counts) <= {v for v, w in weights.items() if w > 0}, "zero weight chosen"


@settings(max_examples=40, deadline=None)
@given(weight_maps, st.integers(0, 2**32))
def test_draws_split_traffic_per_the_weights(weights, seed):
    rng = random.Random(seed)
    n = 10_000
    counts = Counter(choose_version(weights, None, rng.random()) for _ in range(n))
    assert_split_honours(counts, weights, n)


@settings(max_examples=25, deadline=None)
@given(weight_maps, names, st.integers(0, 2**32))
def test_sticky_keys_spread_per_the_weights(weights, served, seed):
    # Hash quality: distinct keys land on versions as independent weighted draws would.
    n = 10_000
    counts = Counter(choose_version(weights, f"{seed}-{i}", None, served_name=served)
                     for i in range(n))
    assert_split_honours(counts, weights, n)


@settings(max_examples=100, deadline=None)
@given(weight_maps, st.text(min_size=1, max_size=20), names, st.floats(0, 0.999999))
def test_a_sticky_key_always_gets_the_same_version(weights, key, served, draw):
    first = choose_version(weights, key, None, served_name=served)
    assert first == choose_version(weights, key, draw, served_name=served)  # draw is ignored
    reordered = dict(reversed(list(weights.items())))
    assert first == choose_version(reordered, key, None, served_name=served)
    assert weights[first] > 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100), st.integers(0, 100), names, names)
def test_growing_the_canary_moves_only_baseline_users_onto_it(low, high, baseline, canary):
    assume(baseline != canary)
    low, high = min(low, high), max(low, high)
    before = {k: choose_version(split_for_canary(baseline, canary, low), k, None,
                                served_name="chat") for k in KEYS}
    after = {k: choose_version(split_for_canary(baseline, canary, high), k, None,
                               served_name="chat") for k in KEYS}
    for key in KEYS:
        if before[key] == canary:
            assert after[key] == canary, "a canary user was moved off the canary"
    moved = sum(before[k] != after[k] for k in KEYS)
    # the canary's share grew by (high - low) of 100: that many of the keys move, no more
    assert within_binomial_bound(moved, len(KEYS), (high - low) / 100)
    if low == 0:
        assert canary not in before.values()
    if high == 100:
        assert baseline not in after.values()


@settings(max_examples=60, deadline=None)
@given(weight_maps, st.data())
def test_changing_one_weight_moves_keys_only_onto_or_off_that_version(weights, data):
    # Holds for any number of versions: no order of versions is involved.
    version = data.draw(st.sampled_from(sorted(weights)))
    new_weight = data.draw(st.integers(0, 200))
    changed = {**weights, version: new_weight}
    assume(any(changed.values()))
    for key in KEYS[:500]:
        old = choose_version(weights, key, None)
        new = choose_version(changed, key, None)
        if old == new:
            continue
        if new_weight > weights[version]:
            assert new == version, "growing a version moved a key elsewhere"
        else:
            assert old == version, "shrinking a version moved a key that was not on it"


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, st.integers(1, 100), min_size=3, max_size=4), st.data())
def test_a_canary_step_among_several_versions_never_moves_a_canary_user(weights, data):
    baseline, canary = data.draw(st.permutations(sorted(weights)))[:2]
    step = data.draw(st.integers(1, weights[baseline]))
    stepped = {**weights, baseline: weights[baseline] - step, canary: weights[canary] + step}
    assume(any(stepped.values()))
    for key in KEYS[:500]:
        old, new = choose_version(weights, key, None), choose_version(stepped, key, None)
        assert old != canary or new == canary
        assert old in (new, baseline) or new == canary


def test_served_names_are_independent():
    weights = {"v1": 50, "v2": 50}
    same = sum(choose_version(weights, k, None, served_name="chat")
               == choose_version(weights, k, None, served_name="code") for k in KEYS)
    # independent 50/50 assignments agree for about half the keys (identical ones: all)
    assert within_binomial_bound(same, len(KEYS), 0.5)


@given(weight_maps, st.sampled_from([0.0, 0.5, 1 - 2**-53]), st.text(max_size=5))
def test_zero_weight_versions_are_never_chosen(weights, draw, key):
    padded = {**weights, "a-zero": 0, "zzz-zero": 0}
    assume(any(padded.values()))
    assert padded[choose_version(padded, None, draw)] > 0
    assert padded[choose_version(padded, key or None, draw)] > 0


def test_draws_map_through_cumulative_weights_in_name_order():
    weights = {"v2": 5, "v1": 95}
    assert choose_version(weights, None, 0.0) == "v1"
    assert choose_version(weights, None, 0.9499) == "v1"
    assert choose_version(weights, None, 0.95) == "v2"
    assert choose_version(weights, None, 1 - 2**-53) == "v2"


@pytest.mark.parametrize("weights", [{}, {"v1": 0}, {"v1": -1, "v2": 5}, {"v1": 1.5},
                                     {"v1": True}, {"": 3}])
def test_invalid_weights_are_refused(weights):
    with pytest.raises(ValueError):
        validate_weights(weights)
    with pytest.raises(ValueError):
        choose_version(weights, "alice", None)


@pytest.mark.parametrize("draw", [None, -0.1, 1.0, float("nan")])
def test_without_a_sticky_key_a_draw_in_the_unit_interval_is_required(draw):
    with pytest.raises(ValueError):
        choose_version({"v1": 1}, None, draw)


def test_split_for_canary():
    assert split_for_canary("v1", "v2", 5) == {"v1": 95, "v2": 5}
    assert split_for_canary("v1", "v2", 0) == {"v1": 100, "v2": 0}
    assert split_for_canary("v1", "v2", 100) == {"v1": 0, "v2": 100}
    for bad in (-1, 101, 5.0):
        with pytest.raises(ValueError):
            split_for_canary("v1", "v2", bad)
    with pytest.raises(ValueError):
        split_for_canary("v1", "v1", 5)


def test_rollout_moves_through_percents_and_the_canary_becomes_the_baseline():
    rollout = Rollout("chat", "v1", "v2", 5)
    assert rollout.weights == {"v1": 95, "v2": 5}
    assert rollout.at_percent(25) == Rollout("chat", "v1", "v2", 25)
    done = rollout.at_percent(100)
    assert done == Rollout("chat", "v2") and done.weights == {"v2": 1}
    assert done.choose("alice", None) == "v2"
    assert rollout.at_percent(0).choose("alice", None) == "v1"    # rolled back
    assert rollout.choose("alice", None) == choose_version(rollout.weights, "alice", None,
                                                           served_name="chat")
    with pytest.raises(ValueError):
        Rollout("chat", "v1", None, 5)
    with pytest.raises(ValueError):
        done.at_percent(5)


def test_by_user_the_sticky_key_is_the_user_field_then_a_hashed_api_key():
    assert sticky_key_for("alice", "Bearer sk-1", by="user") == "user:alice"
    by_key = sticky_key_for(None, "Bearer sk-secret", by="user")
    assert by_key is not None and "secret" not in by_key
    assert by_key == sticky_key_for("", "Bearer sk-secret", by="user")
    assert sticky_key_for(None, None, by="user") is None
    assert sticky_key_for(None, "Basic abc", by="user") is None


def test_by_default_a_client_cannot_pick_its_version_with_the_user_field():
    """Else it could find a ``user`` the candidate answers and aim failures at it."""
    keyed = sticky_key_for(None, "Bearer sk-1")
    assert {sticky_key_for(user, "Bearer sk-1") for user in ("a", "b", "c")} == {keyed}
    assert sticky_key_for("alice", None) is None   # no key: each request is drawn
