"""The planner's simulator with prefix caches and conversations (tools/planner/des.py):
shared heads computed once per engine, the next turn kept on the decode engine that holds
its history, eviction when the KV is needed, and every prompt token counted once, where
the engines' counters would count it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cluster.config import DecodeRoutingConfig
from tools.bench.workload import WorkloadSpec
from tools.planner.des import ClusterSpec, EngineLimits, SimRequest, Simulation, block_chain
from tools.planner.replay import trace_requests
from tools.planner.workload import requests

BLOCK = 16


def step(new_tokens: int, pairs: float, context: int) -> float:
    return 0.002 + 2e-5 * new_tokens


def cluster(prefill: int = 1, decode: int = 1, threshold: int = 0,
            decode_kv_tokens: int = 10**6, **routing) -> ClusterSpec:
    return ClusterSpec(prefill, decode, step, step, lambda tokens: 0.001 + 1e-6 * tokens,
                       decode_limits=EngineLimits(2048, 64, decode_kv_tokens),
                       threshold_tokens=threshold, report_interval_s=0,
                       decode_routing=DecodeRoutingConfig(**routing) if routing else None)


def taken_in(result, pool: str) -> int:
    return sum(result.prompt_tokens[pool].values())


def test_a_chain_names_each_shared_prefix_and_only_it():
    one = SimRequest(0, 600, 10, group=3, group_tokens=512, conversation=7)
    other = replace(one, conversation=8)
    later_turn = replace(one, prompt_tokens=900)
    chain = block_chain(one, one.prompt_tokens, BLOCK)
    assert len(chain) == 600 // BLOCK
    assert block_chain(other, 600, BLOCK)[:32] == chain[:32]          # the group's head
    assert set(block_chain(other, 600, BLOCK)[32:]).isdisjoint(chain[32:])
    assert block_chain(later_turn, 900, BLOCK)[:len(chain)] == chain  # the turn before
    assert block_chain(replace(one, group=4), 600, BLOCK)[0] != chain[0]
    lone = SimRequest(0, 600, 10, group=3, group_tokens=512)          # no conversation
    assert block_chain(lone, 600, BLOCK) == chain[:32]
    assert block_chain(SimRequest(0, 600, 10), 600, BLOCK) == ()


def test_a_shared_head_is_computed_once_per_engine_and_pulled_once():
    """One after another, so each finds the one before it cached: the prefill engine
    computes the 512-token head once, the decode engine pulls it once."""
    work = [SimRequest(i * 1.0, 600, 8, group=0, group_tokens=512) for i in range(5)]
    result = Simulation(cluster(), work).run()
    assert {o.path for o in result.outcomes} == {"disaggregated"}
    assert result.prompt_tokens["prefill"] == {
        "computed": 600 + 4 * 88, "cached": 4 * 512, "transferred": 0}
    assert result.prompt_tokens["decode"] == {
        "computed": 0, "cached": 4 * 512, "transferred": 600 + 4 * 88}


def test_the_next_turn_stays_on_the_decode_engine_that_holds_its_history():
    """Three turns of one conversation beside busy traffic on two decode replicas: the
    first turn is disaggregated (400 tokens over a threshold of 256); each later one is
    decode-local, pinned to the replica that answered, computing only its new message."""
    turns = [SimRequest(0.0, 400, 40, conversation=0),
             SimRequest(0.0, 400 + 40 + 30, 40, conversation=0, follows=0, think_s=0.5),
             SimRequest(0.0, 470 + 40 + 30, 40, conversation=0, follows=1, think_s=0.5)]
    noise = [SimRequest(0.01 * i, 100, 20, conversation=100 + i) for i in range(200)]
    result = Simulation(cluster(decode=2, threshold=256), turns + noise,
                        random.Random(1)).run()
    assert [o.path for o in result.outcomes[:3]] == ["disaggregated", "decode_local",
                                                     "decode_local"]
    # Turn 2 finds turn 1's prompt and answer less its last token (439 tokens: 27 blocks,
    # 432 tokens) and computes 38; turn 3 finds 509 (31 blocks, 496) and computes 44. The
    # noise computes its 100 tokens each.
    assert result.prompt_tokens["decode"]["computed"] == 200 * 100 + 38 + 44
    assert result.prompt_tokens["prefill"]["computed"] == 400
    assert result.arrivals[1] == pytest.approx(result.outcomes[0].e2e_s + 0.5)
    assert result.arrivals[2] == pytest.approx(
        result.arrivals[1] + result.outcomes[1].e2e_s + 0.5)
    # Without the cache-aware path they go through the prefill pool, whose engine holds
    # the turn before's prompt only: 470 - 400 and 540 - 464 tokens computed there.
    without = Simulation(cluster(decode=2, threshold=256, cache_aware_path=False),
                         turns + noise, random.Random(1)).run()
    assert [o.path for o in without.outcomes[:3]] == ["disaggregated"] * 3
    assert without.prompt_tokens["prefill"]["computed"] == 400 + 70 + 76


def test_a_full_cache_evicts_the_least_recently_used_blocks():
    """A decode engine with room for one 600-token sequence keeps a finished one's blocks
    only until the next needs the room: alternating two groups never hits."""
    work = [SimRequest(i * 1.0, 600, 8, group=i % 2, group_tokens=512) for i in range(6)]
    roomy = Simulation(cluster(threshold=10**6), work).run()
    tight = Simulation(cluster(threshold=10**6, decode_kv_tokens=640), work).run()
    assert roomy.prompt_tokens["decode"]["cached"] == 4 * 512
    assert tight.prompt_tokens["decode"]["cached"] == 0
    assert taken_in(tight, "decode") == taken_in(roomy, "decode") == 6 * 600


def test_every_prompt_token_is_taken_in_once_per_pool_it_visits():
    spec = WorkloadSpec(rate=20, num_requests=600, seed=2, scale=0.5, turns=3, think_s=0.2,
                        shared_prefix_tokens=256, prefix_groups=4)
    work = requests(spec)
    result = Simulation(cluster(prefill=2, decode=3, threshold=256), work,
                        random.Random(0)).run()
    assert all(o.e2e_s is not None for o in result.outcomes)
    prefilled = [r for r, o in zip(work, result.outcomes, strict=True)
                 if o.path == "disaggregated"]
    assert taken_in(result, "prefill") == sum(r.prompt_tokens for r in prefilled)
    assert taken_in(result, "decode") == sum(r.prompt_tokens for r in work)
    assert 0 < result.prompt_tokens["decode"]["transferred"] \
        <= sum(r.prompt_tokens for r in prefilled)
    assert result.prompt_tokens["decode"]["cached"] > 0
    assert result.prompt_tokens["prefill"]["cached"] > 0


def test_the_planners_conversations_are_the_benchmarks():
    """First turns at rate / turns; each later turn is the history (prompt, answer) plus a
    new message, behind the same shared head, after the turn it follows."""
    spec = WorkloadSpec(rate=6, num_requests=300, seed=1, turns=3, think_s=2,
                        shared_prefix_tokens=300, prefix_groups=5)
    work = requests(spec)
    first = [r for r in work if r.follows is None]
    assert len(work) == 300 and len(first) == 100
    assert first[-1].arrival_s == pytest.approx(100 / 2, rel=0.25)
    assert {r.group for r in first} == set(range(5))
    assert all(r.prompt_tokens >= 308 and r.group_tokens == 300 for r in first)
    for later in (r for r in work if r.follows is not None):
        before = work[later.follows]
        assert later.prompt_tokens > before.prompt_tokens + before.output_tokens
        assert (later.group, later.conversation) == (before.group, before.conversation)
    assert requests(replace(spec, turns=1))[0].conversation == -1


def test_a_recorded_conversation_is_replayed_with_its_shared_blocks():
    def record(index, sent_at, prompt, follows=None, group=-1):
        return {"index": index, "sent_at": sent_at, "prompt_tokens": prompt,
                "output_tokens": 10, "first_token_at": sent_at + 0.1,
                "token_times": [sent_at + 0.2], "follows": follows, "prefix_group": group}

    records = [record(0, 0.0, 300, group=1), record(1, 0.5, 300, group=2),
               record(2, 2.0, 350, follows=0, group=1), record(3, 4.0, 400, follows=2,
                                                              group=1)]
    replayed = trace_requests(records, shared_prefix_tokens=256)
    assert [r.conversation for r in replayed] == [0, 1, 0, 0]
    assert [(r.group, r.group_tokens) for r in replayed] == [(1, 256), (2, 256), (1, 256),
                                                             (1, 256)]
    assert all(r.follows is None for r in replayed)   # sent when they were: open loop
    # repeating half of each answer: turn 2 is new from 300 + 5 tokens, turn 3 from 355
    halves = trace_requests(records, shared_prefix_tokens=256, answer_reuse=0.5)
    assert [r.versions for r in halves] == [(), (), ((0, 0), (305, 1)),
                                            ((0, 0), (305, 1), (355, 2))]


def test_a_later_turn_shares_its_history_only_up_to_where_it_repeats_the_answer():
    """The next turn repeats the prompt and the answer's first 40 tokens (its text then
    tokenized differently): the blocks after that are its own, and a third turn keeps the
    second's from there."""
    one = SimRequest(0, 320, 160, conversation=5)
    two = replace(one, prompt_tokens=520, versions=one.next_versions(360), follows=0)
    answered = block_chain(one, 320 + 160 - 1, BLOCK)
    chain = block_chain(two, 520, BLOCK)
    assert chain[:22] == answered[:22]                   # 360 tokens: 22 whole blocks
    assert set(chain[22:]).isdisjoint(answered)
    three = replace(two, prompt_tokens=900, versions=two.next_versions(600))
    assert block_chain(three, 900, BLOCK)[:37] == block_chain(two, 700, BLOCK)[:37]
    assert set(block_chain(three, 900, BLOCK)[37:]).isdisjoint(block_chain(two, 700, BLOCK))


@pytest.mark.parametrize("reuse, path", [(1.0, "decode_local"), (0.1, "disaggregated")])
def test_a_history_that_repeats_little_of_the_answer_goes_back_through_prefill(reuse, path):
    """400 prompt tokens, a 300-token answer, a 30-token message: repeating the whole
    answer leaves 42 tokens to compute (under the threshold of 256: decode-local on the
    holder); repeating a tenth of it leaves 314 (disaggregated)."""
    first = SimRequest(0.0, 400, 300, conversation=0)
    second = SimRequest(0.0, 730, 10, conversation=0, follows=0, think_s=0.1,
                        versions=first.next_versions(400 + int(300 * reuse)))
    result = Simulation(cluster(decode=2, threshold=256), [first, second]).run()
    assert [o.path for o in result.outcomes] == ["disaggregated", path]


def test_the_planners_turns_repeat_the_answer_share_they_are_given():
    spec = WorkloadSpec(rate=2, num_requests=40, seed=3, turns=2, think_s=1)
    for reuse in (1.0, 0.25):
        work = requests(spec, answer_reuse=reuse)
        for later in (r for r in work if r.follows is not None):
            before = work[later.follows]
            assert later.versions[-1][0] == \
                before.prompt_tokens + int(before.output_tokens * reuse)
    with pytest.raises(ValueError, match="answer_reuse"):
        requests(spec, answer_reuse=1.5)
