"""A stream's chunk pacing (decode/pacing.py): at most one chunk per interval."""

from __future__ import annotations

import pytest

from decode.pacing import hold_before_next, stream_interval


def test_a_chunk_is_followed_by_the_rest_of_the_interval():
    assert hold_before_next(sent_at=10.0, now=10.005, interval_s=0.02,
                            finished=False) == pytest.approx(0.015)


def test_an_interval_already_past_holds_nothing():
    # the yield itself took longer than the interval (a lagging consumer): send at once
    assert hold_before_next(sent_at=10.0, now=10.03, interval_s=0.02, finished=False) == 0.0


def test_interval_zero_sends_every_output_as_it_comes():
    assert hold_before_next(sent_at=10.0, now=10.0, interval_s=0.0, finished=False) == 0.0


def test_nothing_waits_after_the_last_output():
    assert hold_before_next(sent_at=10.0, now=10.0, interval_s=0.02, finished=True) == 0.0


def test_paced_stream_sends_at_most_one_chunk_per_interval():
    """Replays a 3 ms-per-token engine against the rule: tokens made while a chunk holds
    join the next one. The first token leaves at once, no token waits an interval or more,
    and there are about as many chunks as intervals in the stream."""
    interval, step, tokens = 0.02, 0.003, 100
    made = [0.1 + i * step for i in range(tokens)]
    sent_at: list[float] = []   # per token, when its chunk left
    chunks, clock = 0, 0.0
    while len(sent_at) < tokens:
        clock = max(clock, made[len(sent_at)])       # take the next output (merged)
        ready = sum(1 for t in made[len(sent_at):] if t <= clock)
        sent_at.extend([clock] * ready)
        chunks += 1
        clock += hold_before_next(clock, clock, interval, finished=len(sent_at) == tokens)
    assert sent_at[0] == made[0]
    assert max(s - m for s, m in zip(sent_at, made, strict=True)) < interval
    assert chunks <= 2 + (made[-1] - made[0]) / interval
    assert chunks < tokens / 4


def test_a_lightly_loaded_replica_sends_each_token_as_it_comes():
    # one stream under 400 chunks/s: 2.5 ms, shorter than a step; every token is a chunk
    assert stream_interval(0.02, streams=1, chunks_per_s=400) == pytest.approx(0.0025)


def test_a_busier_replica_spaces_its_streams_chunks_up_to_the_interval():
    assert stream_interval(0.02, streams=4, chunks_per_s=400) == pytest.approx(0.01)
    assert stream_interval(0.02, streams=8, chunks_per_s=400) == pytest.approx(0.02)
    assert stream_interval(0.02, streams=64, chunks_per_s=400) == pytest.approx(0.02)


def test_no_chunk_budget_paces_every_stream_at_the_interval():
    assert stream_interval(0.02, streams=1, chunks_per_s=0) == 0.02
    assert stream_interval(0.0, streams=9, chunks_per_s=400) == 0.0
