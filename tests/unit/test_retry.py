"""Retry, fall back or migrate after a failed stage (router/retry.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from router.retry import RetryPolicy, continuation_differs

POLICY = RetryPolicy(prefill_attempts=2, decode_attempts=2, max_migrations=2, max_retry_s=30)


def decode(failure="unavailable", *, tokens_sent=0, attempts=1, migrations=0, elapsed_s=1.0,
           choices=1, inexact=False):
    return POLICY.after_decode_failure(failure, tokens_sent=tokens_sent, attempts=attempts,
                                       migrations=migrations, elapsed_s=elapsed_s,
                                       choices=choices, inexact=inexact)


def test_a_failed_prefill_is_retried_once_then_left_to_the_decode_engine():
    assert POLICY.after_prefill_failure("unavailable", attempts=1, elapsed_s=1) == "retry_prefill"
    assert POLICY.after_prefill_failure("deadline", attempts=1, elapsed_s=1) == "retry_prefill"
    assert POLICY.after_prefill_failure("unavailable", attempts=2, elapsed_s=1) == "decode_local"


@pytest.mark.parametrize("failure", ["refused", "internal"])
def test_what_the_cluster_did_not_cause_is_never_retried(failure):
    assert POLICY.after_prefill_failure(failure, attempts=1, elapsed_s=0) == "give_up"
    assert decode(failure) == "give_up"
    assert decode(failure, tokens_sent=5) == "give_up"


def test_nothing_starts_after_the_retry_time_is_spent():
    assert POLICY.after_prefill_failure("unavailable", attempts=1, elapsed_s=30) == "give_up"
    assert decode(elapsed_s=30) == "give_up"
    assert decode(tokens_sent=3, elapsed_s=30) == "give_up"


def test_a_decode_that_sent_nothing_runs_again_decode_local_within_its_attempts():
    assert decode(attempts=1) == "decode_local"
    assert decode(attempts=2) == "give_up"


def test_a_decode_that_sent_tokens_is_migrated_within_its_bound():
    assert decode(tokens_sent=7, attempts=1) == "migrate"
    assert decode(tokens_sent=7, attempts=3, migrations=1) == "migrate"
    assert decode(tokens_sent=7, attempts=3, migrations=2) == "give_up"


@pytest.mark.parametrize("changes", [{"choices": 2}, {"inexact": True}])
def test_streams_a_continuation_cannot_reproduce_are_not_migrated(changes):
    # n > 1 interleaves choices; an inexact one (continuation_differs) would alter the text.
    assert decode(tokens_sent=4, **changes) == "give_up"
    assert decode(tokens_sent=0, **changes) == "decode_local"  # nothing sent: start over


def test_the_policy_comes_from_the_config():
    from cluster.config import RetryConfig

    assert RetryPolicy.from_config(RetryConfig()) == RetryPolicy()
    assert RetryPolicy.from_config(RetryConfig(max_migrations=0)).max_migrations == 0


def test_a_breaker_skips_a_failed_pool_for_its_cooldown_then_tries_again():
    from router.retry import PoolBreaker

    breaker = PoolBreaker(cooldown_s=10)
    assert breaker.allows(0)
    breaker.failed(now=5)
    assert not breaker.allows(5) and not breaker.allows(14.9)
    assert breaker.allows(15)           # half open: prompts try the pool again
    breaker.failed(now=15)              # ... and it failed again
    assert not breaker.allows(20)
    breaker.succeeded()
    assert breaker.allows(20)


def test_with_the_prefill_pool_empty_a_retry_would_only_wait_for_a_replacement():
    assert POLICY.after_prefill_failure("unavailable", attempts=1, elapsed_s=1,
                                        pool_empty=True) == "decode_local"
    assert POLICY.after_prefill_failure("refused", attempts=1, elapsed_s=1,
                                        pool_empty=True) == "give_up"


def test_replicas_that_died_do_not_use_up_the_attempts_only_the_retry_time():
    """Serve never sends to a dead replica again: a pool lost at once costs one failed call
    per replica, then the retry waits for a replacement."""
    assert decode("died", attempts=5) == "decode_local"
    assert decode("unavailable", attempts=5) == "give_up"
    assert decode("died", tokens_sent=3, migrations=5) == "migrate"
    assert decode("deadline", tokens_sent=3, migrations=5) == "give_up"
    assert decode("died", attempts=5, elapsed_s=30) == "give_up"
    assert decode("died", tokens_sent=3, choices=2) == "give_up"  # still not continuable


def test_nothing_starts_once_the_whole_requests_deadline_passed():
    policy = RetryPolicy(max_retry_s=60, request_s=10)
    assert policy.after_prefill_failure("died", attempts=1, elapsed_s=10) == "give_up"
    assert policy.after_decode_failure("died", tokens_sent=3, attempts=1, migrations=0,
                                       elapsed_s=10, choices=1, inexact=False) == "give_up"
    assert policy.after_prefill_failure("died", attempts=1, elapsed_s=9) == "retry_prefill"


def test_a_request_alone_in_an_engine_that_crashed_is_quarantined_at_any_stage():
    assert POLICY.after_prefill_failure("crashed", attempts=1, elapsed_s=1) == "quarantine"
    assert decode("crashed") == "quarantine"
    assert decode("crashed", tokens_sent=5) == "quarantine"


def test_a_crash_among_other_requests_is_retried_once_then_quarantined():
    assert POLICY.after_prefill_failure("crashed_shared", attempts=1,
                                        elapsed_s=1) == "retry_prefill"
    assert decode("crashed_shared") == "decode_local"
    assert decode("crashed_shared", tokens_sent=5) == "migrate"
    # a second crash with the request in it, at whichever stage the first was
    assert POLICY.after_prefill_failure("crashed_shared", attempts=2, elapsed_s=1,
                                        crashes_before=1) == "quarantine"
    assert POLICY.after_decode_failure(
        "crashed_shared", tokens_sent=5, attempts=2, migrations=1, elapsed_s=1, choices=1,
        inexact=False, crashes_before=1) == "quarantine"


def test_deaths_the_request_did_not_cause_are_retried_after_a_crash_too():
    for failure in ("died", "unavailable", "deadline"):
        assert POLICY.after_decode_failure(
            failure, tokens_sent=5, attempts=2, migrations=1, elapsed_s=1, choices=1,
            inexact=False, crashes_before=1) == "migrate"


@pytest.mark.parametrize(("sampling", "why"), [
    ({"structured_outputs": object()}, "grammar"),
    ({"presence_penalty": 0.5}, "penalties"),
    ({"frequency_penalty": -1.0}, "penalties"),
    ({"bad_words": ["no"]}, "bad word"),
    ({"stop": ["END"]}, "held back"),
    ({"stop": ["x", "two"]}, "held back"),
    ({"seed": 5, "temperature": 1.0}, "seed"),
])
def test_a_continuation_that_would_differ_from_the_unfaulted_answer_says_why(sampling, why):
    assert why in continuation_differs(SimpleNamespace(**sampling))


@pytest.mark.parametrize("sampling", [
    {}, {"presence_penalty": 0, "frequency_penalty": 0.0, "bad_words": []},
    {"repetition_penalty": 1.3},  # vLLM counts the prompt too: the sent tokens still count
    {"stop": ["\n", "."]},         # one character: nothing is held back
    {"stop": ["END"], "include_stop_str_in_output": True},
    {"seed": 5, "temperature": 0.0},   # greedy: the seed draws nothing
    {"temperature": 0.8},              # unseeded: any sample is as right as the first
])
def test_a_continuation_that_gives_the_unfaulted_answer_is_allowed(sampling):
    assert continuation_differs(SimpleNamespace(**sampling)) is None
