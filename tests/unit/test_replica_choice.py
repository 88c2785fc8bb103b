"""Replica choice (pure): prefix hashing, the prefix index, the pending tally, both rankings."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig, parse_config
from router.replica_choice import (
    ChainMemo,
    DecodeCacheBelief,
    DecodePolicy,
    OtherRouters,
    PendingTally,
    PrefillPolicy,
    PrefixIndex,
    ReplicaLoad,
    decode_score,
    finished_of,
    load_from_stats,
    prefix_block_hashes,
    rank_decode,
    rank_prefill,
    water_fill_shares,
)

tokens = st.lists(st.integers(0, 50_000), max_size=300)
DECODE = DecodePolicy.from_config(DecodeRoutingConfig(), max_num_seqs=256)


def prefill_policy(block_size: int = 16, **routing) -> PrefillPolicy:
    """The prefill policy of ``router.routing.prefill`` with ``routing`` set."""
    return PrefillPolicy.from_config(PrefillRoutingConfig(**routing), block_size)

block_sizes = st.integers(1, 32)
replica_ids = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=6,
                       unique=True)


# -- prefix hashing ---------------------------------------------------------------------


@given(tokens, tokens, block_sizes, st.integers(0, 80))
def test_extending_a_prompt_keeps_its_chain_as_a_prefix(prompt, more, block_size, max_blocks):
    short = prefix_block_hashes(prompt, block_size, max_blocks)
    long = prefix_block_hashes(prompt + more, block_size, max_blocks)
    assert long[:len(short)] == short
    assert len(short) == min(len(prompt) // block_size, max_blocks)  # full blocks only


@given(tokens, block_sizes, st.integers(0, 49_999))
def test_chains_part_from_the_first_differing_block(prompt, block_size, token):
    if len(prompt) < 2 * block_size:
        prompt = prompt + [0] * (2 * block_size - len(prompt))
    changed = [*prompt]
    changed[block_size] = token if token != prompt[block_size] else token + 1  # block 1
    a, b = (prefix_block_hashes(p, block_size) for p in (prompt, changed))
    assert a[0] == b[0]
    assert a[1] != b[1]


@given(tokens, block_sizes)
def test_a_block_hash_covers_everything_before_it(prompt, block_size):
    """Equal blocks after a different first block hash apart: h_i names the whole prefix."""
    if len(prompt) < 2 * block_size:
        prompt = prompt + [0] * (2 * block_size - len(prompt))
    changed = [prompt[0] + 1, *prompt[1:]]
    a, b = (prefix_block_hashes(p, block_size) for p in (prompt, changed))
    assert all(x != y for x, y in zip(a, b, strict=True))


def test_hashing_rejects_nonsense_sizes():
    with pytest.raises(ValueError):
        prefix_block_hashes([1, 2, 3], 0)


# -- prefix index -----------------------------------------------------------------------


@settings(max_examples=200)
@given(st.lists(st.tuples(tokens, st.sampled_from("abc")), max_size=40), st.integers(1, 50))
def test_index_stays_bounded_and_keeps_the_latest_chain(routed, capacity):
    index = PrefixIndex(capacity)
    for prompt, replica in routed:
        hashes = prefix_block_hashes(prompt, 4)
        index.record(hashes, replica)
        assert len(index) <= capacity
        if 0 < len(hashes) <= capacity:
            assert index.match(hashes)[replica] == len(hashes)


def test_index_matches_the_deepest_block_each_replica_prefilled():
    index = PrefixIndex(100)
    prompt = list(range(64))
    chain = prefix_block_hashes(prompt, 16)             # 4 blocks
    index.record(chain, "a")
    index.record(chain[:2], "b")                        # b took over blocks 0-1 later
    assert index.match(chain) == {"a": 4, "b": 2}       # a still holds all four
    index.forget("a")
    assert index.match(chain) == {"b": 2}


def test_index_evicts_least_recently_routed_first():
    index = PrefixIndex(4)
    old, new = prefix_block_hashes(range(32), 8), prefix_block_hashes(range(100, 116), 8)
    index.record(old, "a")
    index.record(new, "b")                              # 4 + 2 > 4: old's oldest go
    assert index.match(new) == {"b": 2}
    assert index.match(old) == {"a": 4}                 # its deepest blocks remain


# -- pending tally ----------------------------------------------------------------------


def test_tally_counts_until_completion_or_a_later_report():
    tally = PendingTally(max_age_s=30)
    tally.add("r1", "a", 100, now=10)
    tally.add("r2", "a", 50, now=12)
    assert (tally.tokens("a"), tally.requests("a")) == (150, 2)
    tally.observe_report("a", reported_at=11)           # includes r1, not r2
    assert (tally.tokens("a"), tally.requests("a")) == (50, 1)
    tally.discard("r2", "a")
    assert len(tally) == 0 and tally.tokens("a") == 0


def test_tally_moves_a_rerouted_request_and_ignores_the_old_replicas_completion():
    tally = PendingTally()
    tally.add("r1", "a", 100, now=0)
    tally.add("r1", "b", 100, now=1)                    # a rejected it; Serve fell back to b
    tally.discard("r1", "a")                            # completion of the rejected attempt
    assert (tally.tokens("a"), tally.tokens("b")) == (0, 100)
    tally.discard("r1", "b")
    assert len(tally) == 0


def test_tally_expires_entries_nobody_completed():
    tally = PendingTally(max_age_s=5)
    tally.add("r1", "a", 10, now=0)
    tally.expire(now=4)
    assert tally.requests("a") == 1
    tally.expire(now=6)
    assert tally.requests("a") == 0


def test_a_completion_the_last_report_counted_is_taken_off_it_until_a_later_report():
    tally = PendingTally(max_age_s=30)
    tally.add("r1", "a", 100, now=10)
    tally.observe_report("a", reported_at=11)           # the report counts r1 running
    assert (tally.requests("a"), tally.finished_requests("a")) == (0, 0)
    tally.complete("r1", "a", now=12)
    assert (tally.finished_requests("a"), tally.finished_tokens("a")) == (1, 100)
    tally.observe_report("a", reported_at=11)           # the same report, read again
    assert tally.finished_requests("a") == 1
    tally.observe_report("a", reported_at=12.5)         # taken after the completion
    assert (tally.finished_requests("a"), tally.finished_tokens("a")) == (0, 0)


def test_a_completion_no_report_counted_and_a_rejected_attempts_take_nothing_off():
    tally = PendingTally()
    tally.add("r1", "a", 100, now=10)
    tally.complete("r1", "a", now=11)                   # no report since the send
    tally.add("r2", "a", 50, now=12)
    tally.observe_report("a", reported_at=13)
    tally.complete("r2", "b", now=14)                   # not where it runs
    assert tally.finished_requests("a") == tally.finished_requests("b") == 0
    tally.add("r2", "b", 50, now=15)                    # re-routed: a's report no longer counts
    tally.complete("r2", "a", now=16)
    assert tally.finished_requests("a") == 0 and tally.requests("b") == 1


def test_finished_entries_expire_and_go_with_their_replica():
    tally = PendingTally(max_age_s=5, max_running_s=100)
    for key, replica in (("r1", "a"), ("r2", "b")):
        tally.add(key, replica, 10, now=0)
        tally.observe_report(replica, reported_at=1)
        tally.complete(key, replica, now=2)
    tally.forget_replica("b")
    assert (tally.finished_requests("a"), tally.finished_requests("b")) == (1, 0)
    tally.expire(now=8)                                 # a never reported again
    assert tally.finished_requests("a") == 0
    tally.add("r3", "a", 10, now=8)
    tally.observe_report("a", reported_at=9)
    tally.expire(now=200)                               # still running, long forgotten
    tally.complete("r3", "a", now=201)
    assert tally.finished_requests("a") == 0


def test_what_finished_since_the_report_is_taken_off_it_never_below_zero():
    load = ReplicaLoad("a", queued_prefill_tokens=300, running_seqs=1, waiting_seqs=1,
                       pending_tokens=50, pending_requests=1, finished_tokens=500,
                       finished_requests=3)
    assert (load.prefill_queue, load.sequences) == (50, 1)
    load = ReplicaLoad("a", queued_prefill_tokens=300, running_seqs=4, finished_tokens=100,
                       finished_requests=1)
    assert (load.prefill_queue, load.sequences) == (200, 3)


# -- reading stats ----------------------------------------------------------------------


def test_missing_stats_read_as_an_empty_current_replica():
    load = load_from_stats("a", {}, now=100, stale_after_s=5, pending_tokens=7)
    assert load == ReplicaLoad("a", pending_tokens=7)
    assert load_from_stats("a", None, now=100, stale_after_s=5).stale is False


def test_old_reports_are_stale_and_garbage_reads_as_missing():
    stats = {"queued_prefill_tokens": "lots", "running_seqs": 3, "kv_usage": 1.7,
             "max_num_seqs": 0, "reported_at": 90.0}
    load = load_from_stats("a", stats, now=100, stale_after_s=5)
    assert (load.queued_prefill_tokens, load.running_seqs, load.kv_usage) == (0, 3, 1.0)
    assert load.max_num_seqs is None and load.stale
    assert not load_from_stats("a", stats, now=94, stale_after_s=5).stale


def test_a_replica_whose_engine_stopped_stepping_reads_as_stale_though_it_reports():
    # A hung engine under a live replica: current reports, frozen figures. With its
    # streams gone elsewhere it reads idle, and would draw the next request.
    hung = {"running_seqs": 0, "reported_at": 99.5, "engine_stalled_s": 12.0}
    busy = {"running_seqs": 30, "reported_at": 99.5}
    loads = [load_from_stats(r, stats, now=100, stale_after_s=5)
             for r, stats in (("hung", hung), ("busy", busy))]
    assert loads[0].stale and not loads[1].stale
    assert rank_decode(loads, DECODE)[0] == "busy"
    # a step that has taken a while, or garbage, is not a stall
    for stalled in (4.0, "long", None):
        assert not load_from_stats("a", {**hung, "engine_stalled_s": stalled}, now=100,
                                   stale_after_s=5).stale


# -- prefill ranking --------------------------------------------------------------------

POLICY = prefill_policy(max_imbalance_tokens=1000)


def _loads(queues: dict[str, int], stale: frozenset = frozenset()) -> list[ReplicaLoad]:
    return [ReplicaLoad(r, queued_prefill_tokens=q, stale=r in stale) for r, q in queues.items()]


@given(replica_ids, st.data(), st.integers(0, 5000), st.integers(1, 64), st.integers(0, 15))
def test_equal_loads_go_to_the_replica_holding_the_prefix(ids, data, queue, blocks, extra):
    holder = data.draw(st.sampled_from(ids))
    prompt = list(range(blocks * 16 + extra))
    index = PrefixIndex(1000)
    index.record(prefix_block_hashes(prompt, 16), holder)
    choice = rank_prefill(len(prompt), index.match(prefix_block_hashes(prompt, 16)),
                          _loads(dict.fromkeys(ids, queue)), POLICY, random.Random(0))
    assert choice.ranking[0] == holder
    assert choice.cached_tokens == min(blocks * 16, len(prompt) - 1)


@given(st.integers(0, 20_000), st.integers(0, 20_000), st.integers(1, 8192),
       st.integers(0, 512), st.integers(0, 5000))
def test_affinity_bonus_is_the_saved_prefill_and_respects_the_cap(
    queue_a, queue_b, prompt_tokens, cached_blocks, cap
):
    """Two replicas, a holds part of the prompt: brute-force the rule."""
    policy = prefill_policy(max_imbalance_tokens=cap)
    choice = rank_prefill(prompt_tokens, {"a": cached_blocks},
                          _loads({"a": queue_a, "b": queue_b}), policy)
    saved = min(cached_blocks * 16, prompt_tokens - 1)
    if queue_a - min(queue_a, queue_b) > cap:
        saved = 0
    cost_a, cost_b = queue_a + prompt_tokens - saved, queue_b + prompt_tokens
    expected = "a" if (cost_a, -saved, queue_a, "a") < (cost_b, 0, queue_b, "b") else "b"
    assert choice.ranking == (expected, "b" if expected == "a" else "a")


@settings(max_examples=200)
@given(st.integers(2, 5), st.lists(st.integers(0, 600), min_size=1, max_size=300),
       st.integers(0, 3000), st.integers(0, 2**32))
def test_a_hot_prefix_spreads_once_the_imbalance_exceeds_the_cap(n, suffixes, cap, seed):
    """Every request shares a 512-token system prompt; none completes. The chosen replica's
    queue never exceeds the shortest by more than the cap, so no replica gets more than an
    equal share plus the cap plus one prompt."""
    policy = prefill_policy(max_imbalance_tokens=cap)
    index, queues, rng = PrefixIndex(10_000), {f"r{i}": 0 for i in range(n)}, random.Random(seed)
    system = list(range(512))
    longest = 0
    for i, suffix in enumerate(suffixes):
        prompt = system + [100_000 + i] * suffix
        hashes = prefix_block_hashes(prompt, 16)
        choice = rank_prefill(len(prompt), index.match(hashes), _loads(queues), policy, rng)
        first = choice.ranking[0]
        assert queues[first] - min(queues.values()) <= min(cap, choice.cached_tokens)
        queues[first] += len(prompt)
        index.record(hashes, first)
        longest = max(longest, len(prompt))
    total = sum(queues.values())
    assert max(queues.values()) <= total / n + cap + longest
    if total > cap + longest:
        assert sum(1 for q in queues.values() if q) > 1


def test_a_hot_prefix_stays_put_while_the_others_are_as_busy():
    queues = {"a": 3000, "b": 2600}
    prompt = list(range(1000))
    index = PrefixIndex(100)
    index.record(prefix_block_hashes(prompt, 16), "a")
    choice = rank_prefill(1000, index.match(prefix_block_hashes(prompt, 16)), _loads(queues),
                          POLICY)
    assert choice.ranking == ("a", "b")    # 3000 + 8 beats 2600 + 1000
    queues["a"] = 3700                     # 1100 over b: past the 1000-token cap
    choice = rank_prefill(1000, index.match(prefix_block_hashes(prompt, 16)), _loads(queues),
                          POLICY)
    assert choice.ranking == ("b", "a") and choice.cached_tokens == 0


def test_pending_tokens_count_like_reported_ones():
    loads = [ReplicaLoad("a", queued_prefill_tokens=100),
             ReplicaLoad("b", queued_prefill_tokens=0, pending_tokens=500)]
    assert rank_prefill(10, {}, loads, POLICY).ranking == ("a", "b")


def test_stale_replicas_rank_last_even_when_idle():
    loads = _loads({"a": 0, "b": 9000, "c": 50}, stale=frozenset({"a"}))
    assert rank_prefill(100, {"a": 5}, loads, POLICY).ranking == ("c", "b", "a")


# -- decode ranking ---------------------------------------------------------------------

decode_loads = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 50), st.floats(0, 1), st.booleans(),
              st.integers(0, 20), st.sampled_from([None, 64, 256])),
    min_size=1, max_size=8,
)


def _decode(rows) -> list[ReplicaLoad]:
    return [ReplicaLoad(f"r{i}", running_seqs=run, waiting_seqs=wait, kv_usage=kv, stale=stale,
                        pending_requests=pending, max_num_seqs=max_seqs)
            for i, (run, wait, kv, stale, pending, max_seqs) in enumerate(rows)]


@given(decode_loads, st.integers(0, 2**32))
def test_decode_ranks_least_loaded_first_full_next_stale_last(rows, seed):
    policy = DECODE
    loads = _decode(rows)
    ranking = rank_decode(loads, policy, random.Random(seed))
    by_id = {load.replica_id: load for load in loads}
    groups = [(by_id[r].stale, by_id[r].kv_usage >= policy.kv_high_water) for r in ranking]
    assert groups == sorted(groups)
    scores = [decode_score(by_id[r], policy) for r in ranking]
    for i in range(len(ranking) - 1):
        assert groups[i] != groups[i + 1] or scores[i] <= scores[i + 1]


def test_decode_picks_the_least_loaded():
    loads = [ReplicaLoad("a", running_seqs=10, kv_usage=0.5, max_num_seqs=100),
             ReplicaLoad("b", running_seqs=30, kv_usage=0.1, max_num_seqs=100),   # 0.4
             ReplicaLoad("c", running_seqs=0, kv_usage=0.96),                     # full
             ReplicaLoad("d", running_seqs=5, kv_usage=0.2, max_num_seqs=100,
                         pending_requests=30)]                                    # 0.55
    assert rank_decode(loads, DECODE) == ("b", "d", "a", "c")


# -- decode: prefix affinity below the load terms ---------------------------------------

AFFINE = DecodePolicy.from_config(DecodeRoutingConfig(), max_num_seqs=100, block_size=16)


def test_equal_loads_go_to_the_replica_holding_the_prompts_head():
    loads = [ReplicaLoad(r, running_seqs=4, kv_usage=0.2) for r in ("a", "b", "c")]
    assert rank_decode(loads, AFFINE, matched_blocks={"b": 4}, prompt_tokens=100)[0] == "b"
    # the deeper match wins between two holders
    assert rank_decode(loads, AFFINE, matched_blocks={"b": 2, "c": 5},
                       prompt_tokens=100)[:2] == ("c", "b")


def test_a_pinned_replica_ranks_first_among_the_live_fresh_and_not_full():
    loads = [ReplicaLoad("a", running_seqs=0), ReplicaLoad("b", running_seqs=90),
             ReplicaLoad("c", running_seqs=0, kv_usage=0.99),
             ReplicaLoad("d", running_seqs=0, stale=True)]
    assert rank_decode(loads, AFFINE, pinned="b")[:2] == ("b", "a")
    assert rank_decode(loads, AFFINE, pinned="c")[:2] == ("a", "b")   # full: after them
    assert rank_decode(loads, AFFINE, pinned="d")[0] == "a"          # stale: last
    assert rank_decode(loads, AFFINE, pinned="gone") == rank_decode(loads, AFFINE)


def test_the_decode_belief_holds_prompts_routed_and_the_answers_that_finished():
    belief = DecodeCacheBelief(block_size=4, max_blocks=64, capacity=1000, max_requests=2)
    prompt = tuple(range(10))                       # 2 whole blocks
    belief.routed("r1", prompt, "a")
    assert belief.holder(prompt + (99,) * 8) == ("a", 8)
    belief.finished("r1", (*prompt, 50, 51, 52, 53, 54, 55, 56))   # 16 fed back: 4 blocks
    assert belief.holder((*prompt, 50, 51, 52, 53, 54, 55, 56, 7)) == ("a", 16)
    belief.finished("r1", prompt + (9,) * 20)      # already finished: not recorded again
    assert belief.holder(prompt + (9,) * 20) == ("a", 8)
    belief.finished("unknown", (5,) * 40)           # routed elsewhere, or long forgotten
    assert belief.holder((5,) * 40) == (None, 0)


@given(tokens, tokens, st.integers(1, 8), st.integers(0, 40))
def test_a_chain_goes_on_from_its_heads_chain_as_if_hashed_whole(head, tail, block, limit):
    """A prompt's chain, then the same prompt with its answer: going on from the prompt's
    chain gives exactly the chain of hashing it all (the decode belief's finished())."""
    whole = prefix_block_hashes(head + tail, block, limit)
    assert prefix_block_hashes(head + tail, block, limit,
                               prefix_block_hashes(head, block, limit)) == whole


def test_the_memo_hashes_a_prompt_tuple_once_and_holds_only_the_last_few():
    memo = ChainMemo(size=4)
    prompts = [tuple(range(n, n + 64)) for n in range(3)]
    chain = memo.chain(prompts[0], 16, 64)
    assert chain == prefix_block_hashes(prompts[0], 16, 64)
    assert memo.chain(prompts[0], 16, 64) is chain            # the same tuple: kept
    assert memo.chain(tuple(prompts[0]), 16, 64) is chain     # tuple(t) is t: the same
    assert memo.chain(prompts[0], 16, 2) == chain[:2]         # another length: its own
    assert memo.chain(prompts[0], 8, 64) == prefix_block_hashes(prompts[0], 8, 64)
    equal = tuple(list(prompts[0]))       # an equal tuple, another object: hashed anew
    assert equal is not prompts[0] and memo.chain(equal, 16, 64) == chain
    kept = memo.chain(prompts[1], 16, 64)
    memo.chain(prompts[2], 16, 64)                            # the oldest goes
    assert memo.chain(prompts[1], 16, 64) is kept
    assert memo.chain(prompts[0], 16, 64) is not chain        # hashed again
    as_list = list(prompts[1])                                # a list may change: hashed
    assert memo.chain(as_list, 16, 64) == prefix_block_hashes(as_list, 16, 64)
    as_list[0] = 99
    assert memo.chain(as_list, 16, 64) == prefix_block_hashes(as_list, 16, 64)


def test_a_finished_request_records_its_answer_going_on_from_its_prompts_chain():
    belief = DecodeCacheBelief(block_size=4, max_blocks=64, capacity=1000)
    prompt = tuple(range(10))
    belief.routed("r1", prompt, "a")
    belief.finished("r1", (*prompt, 50, 51, 52, 53, 54, 55, 56), prompt)
    assert belief.holder((*prompt, 50, 51, 52, 53, 54, 55, 56, 7)) == ("a", 16)


def test_the_decode_belief_forgets_old_requests_and_replicas_that_left():
    belief = DecodeCacheBelief(block_size=4, max_blocks=64, capacity=1000, max_requests=2)
    for number in range(3):
        belief.routed(f"r{number}", (number,) * 8, "a")
    belief.finished("r0", (0,) * 20)                # beyond max_requests: forgotten
    assert belief.holder((0,) * 20) == ("a", 8)
    belief.routed("r3", (3,) * 8, "b")
    belief.forget("b")
    belief.finished("r3", (3,) * 20)
    assert belief.holder((3,) * 20) == (None, 0)
    assert belief.holder((1,) * 8) == ("a", 8)


@pytest.mark.parametrize(("holder_seqs", "held_blocks", "first"), [
    (5, 8, "holder"),   # one stream busier, holding all 128 tokens: one slot; the tie
    #                     goes to the replica that saves the transfer
    (6, 8, "other"),    # two streams busier: more than the bonus is worth
    (5, 4, "other"),    # one stream busier holding half: half a slot
])
def test_affinity_is_worth_at_most_one_stream_slot(holder_seqs, held_blocks, first):
    loads = [ReplicaLoad("holder", running_seqs=holder_seqs, max_num_seqs=100),
             ReplicaLoad("other", running_seqs=4, max_num_seqs=100)]
    ranking = rank_decode(loads, AFFINE, matched_blocks={"holder": held_blocks},
                          prompt_tokens=128)
    assert ranking[0] == first


def test_a_replica_this_request_failed_on_ranks_after_every_live_one_but_before_a_dead():
    """Even holding the whole prompt, idle, and pinned: its engine may be hung, reporting
    the load it had when it stopped."""
    loads = [ReplicaLoad("hung", max_num_seqs=100), ReplicaLoad("busy", running_seqs=90,
                                                                   max_num_seqs=100),
             ReplicaLoad("stale", stale=True), ReplicaLoad("dead", dead=True)]
    ranking = rank_decode(loads, AFFINE, matched_blocks={"hung": 8}, prompt_tokens=128,
                          pinned="hung", avoid={"hung"})
    assert ranking == ("busy", "stale", "hung", "dead")
    assert rank_decode(loads, AFFINE, avoid={"hung"}, rng=random.Random(0),
                       others=50)[-2:] == ("hung", "dead")
    prefill = [ReplicaLoad("hung"), ReplicaLoad("busy", queued_prefill_tokens=5000),
               ReplicaLoad("dead", dead=True)]
    assert rank_prefill(100, {"hung": 6}, prefill, POLICY, avoid={"hung"}).ranking == (
        "busy", "hung", "dead")


def test_without_affinity_slots_a_match_changes_nothing():
    off = DecodePolicy.from_config(DecodeRoutingConfig(prefix_affinity_slots=0), 100, 16)
    loads = [ReplicaLoad("a", running_seqs=4), ReplicaLoad("b", running_seqs=4)]
    assert rank_decode(loads, off, matched_blocks={"b": 8}, prompt_tokens=128) == ("a", "b")


@given(decode_loads, st.data(), st.integers(1, 4000), st.floats(0, 4))
def test_the_first_choice_is_never_busier_than_the_least_loaded_by_more_than_the_bonus(
        rows, data, prompt_tokens, slots):
    policy = DecodePolicy.from_config(DecodeRoutingConfig(prefix_affinity_slots=slots),
                                      max_num_seqs=256, block_size=16)
    loads = _decode(rows)
    matched = {load.replica_id: data.draw(st.integers(0, 300)) for load in loads}
    first = rank_decode(loads, policy, matched_blocks=matched, prompt_tokens=prompt_tokens)[0]
    by_id = {load.replica_id: load for load in loads}
    chosen = by_id[first]
    group = [load for load in loads if (load.stale, load.kv_usage >= policy.kv_high_water)
             == (chosen.stale, chosen.kv_usage >= policy.kv_high_water)]
    least = min(decode_score(load, policy) for load in group)
    most_bonus = slots / (chosen.max_num_seqs or policy.default_max_num_seqs)
    assert decode_score(chosen, policy) <= least + most_bonus + 1e-9


# -- both: rankings are permutations ----------------------------------------------------


@given(replica_ids, st.data(), st.integers(0, 10_000), st.integers(0, 2**32))
def test_rankings_are_permutations_of_the_candidates(ids, data, prompt_tokens, seed):
    loads = [ReplicaLoad(r, queued_prefill_tokens=data.draw(st.integers(0, 10_000)),
                         running_seqs=data.draw(st.integers(0, 300)),
                         kv_usage=data.draw(st.floats(0, 1)), stale=data.draw(st.booleans()))
             for r in ids]
    matched = {r: data.draw(st.integers(0, 64)) for r in ids if data.draw(st.booleans())}
    rng = random.Random(seed) if data.draw(st.booleans()) else None
    prefill = rank_prefill(prompt_tokens, matched, loads, POLICY, rng).ranking
    decode = rank_decode(loads, DECODE, rng)
    assert sorted(prefill) == sorted(ids) == sorted(decode)


def test_no_candidates_no_ranking():
    assert rank_prefill(10, {}, [], POLICY).ranking == ()
    assert rank_decode([], DECODE) == ()


@pytest.mark.parametrize("routing", [
    {"prefill": {"max_blocks": -1}}, {"prefill": {"index_capacity": 0}},
    {"prefill": {"max_imbalance_tokens": -1}}, {"prefill": {"stale_after_s": 0}},
    {"decode": {"kv_high_water": 1.5}}, {"decode": {"kv_weight": -1}},
    {"decode": {"stale_after_s": 0}}, {"decode": {"kv_hi_water": 0.9}},
])
def test_the_config_refuses_nonsense_tunables(routing):
    with pytest.raises(ValueError, match=r"router\.routing\."):
        parse_config({"model": {"name": "m", "path": "/m"}, "router": {"routing": routing}})


def test_policies_are_built_from_the_routing_config_and_the_engines():
    config = parse_config({
        "model": {"name": "m", "path": "/m"}, "engine": {"block_size": 32},
        "router": {"routing": {
            "prefill": {"max_blocks": 8, "max_imbalance_tokens": 100, "index_capacity": 50,
                        "stale_after_s": 2},
            "decode": {"kv_weight": 0.5, "kv_high_water": 0.8, "stale_after_s": 3}}},
    })
    routing = config.router.routing
    assert PrefillPolicy.from_config(routing.prefill, config.engine.block_size) == (
        PrefillPolicy(block_size=32, max_blocks=8, max_imbalance_tokens=100,
                      index_capacity=50, stale_after_s=2))
    assert DecodePolicy.from_config(routing.decode, max_num_seqs=64, block_size=32) == (
        DecodePolicy(kv_weight=0.5, kv_high_water=0.8, default_max_num_seqs=64,
                     stale_after_s=3, affinity_slots=1.0, block_size=32, max_blocks=512,
                     index_capacity=100_000))
    # the defaults are the values the policies had in code before they moved to the config
    defaults = parse_config({"model": {"name": "m", "path": "/m"}}).router.routing
    assert PrefillPolicy.from_config(defaults.prefill, 16) == PrefillPolicy(
        block_size=16, max_blocks=64, max_imbalance_tokens=4096, index_capacity=100_000,
        stale_after_s=5.0)
    assert DecodePolicy.from_config(defaults.decode, 256) == DecodePolicy(
        kv_weight=1.0, kv_high_water=0.95, default_max_num_seqs=256, stale_after_s=5.0,
        affinity_slots=1.0)


# -- a replica whose engine died ----------------------------------------------------------


def test_a_report_of_a_dead_engine_marks_its_replica_dead():
    from cluster.engine.routing_stats import routing_stats_from
    from cluster.engine.stats import EngineStats

    report = routing_stats_from(EngineStats(role="decode", engine_id="d"), reported_at=5.0,
                                engine_dead=True)
    assert load_from_stats("r", report, now=5.0, stale_after_s=5).dead
    alive = routing_stats_from(EngineStats(role="decode", engine_id="d"), reported_at=5.0)
    assert "engine_dead" not in alive
    assert not load_from_stats("r", alive, now=5.0, stale_after_s=5).dead
    stalled = routing_stats_from(EngineStats(role="decode", engine_id="d"), reported_at=5.0,
                                 engine_stalled_s=6.25)
    assert stalled["engine_stalled_s"] == 6.25 and "engine_stalled_s" not in alive
    assert load_from_stats("r", stalled, now=5.0, stale_after_s=5).stale


def test_a_replica_with_a_dead_engine_ranks_last_in_both_pools_even_idle_and_fresh():
    # An idle replica with a dead engine looked like the least loaded one: every request
    # and every retry went to it until Serve replaced it.
    dead = ReplicaLoad("dead", dead=True)
    busy = ReplicaLoad("busy", queued_prefill_tokens=9000, running_seqs=200, kv_usage=0.99)
    stale = ReplicaLoad("stale", stale=True)
    assert rank_prefill(100, {"dead": 9}, [dead, busy, stale], POLICY).ranking == (
        "busy", "stale", "dead")
    assert rank_decode([dead, busy, stale], DECODE) == ("busy", "stale", "dead")
    assert rank_decode([dead], DECODE) == ("dead",)  # nothing else: still a candidate


# -- many routers: the first choice drawn by each replica's water-fill share -------------


def test_water_fill_pours_the_lowest_first_up_to_a_common_level():
    assert water_fill_shares({"a": 0, "b": 1, "c": 5}, 1) == {"a": 1.0}
    shares = water_fill_shares({"a": 0, "b": 1, "c": 5}, 3)     # level 2: a 2, b 1
    assert shares == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    # a unit raises a replica of weight 2 by half as much: it takes twice the share
    assert water_fill_shares({"a": 0, "b": 0}, 1, {"a": 2, "b": 1}) == pytest.approx(
        {"a": 2 / 3, "b": 1 / 3})
    with pytest.raises(ValueError):
        water_fill_shares({"a": 0}, 0)


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=2),
                       st.floats(-5, 5, allow_nan=False), min_size=1, max_size=6),
       st.floats(0.01, 100))
def test_water_fill_shares_sum_to_one_and_favour_the_lower(levels, amount):
    shares = water_fill_shares(levels, amount)
    assert sum(shares.values()) == pytest.approx(1.0)
    for low in shares:
        for high in levels:
            if levels[high] > levels[low]:
                assert shares.get(high, 0.0) <= shares[low] + 1e-9


def _first_choices(rank, draws: int = 4000) -> dict[str, float]:
    """How often each replica came first in ``draws`` rankings by ``rank(rng)``."""
    rng = random.Random(3)
    counts: dict[str, int] = {}
    for _ in range(draws):
        first = rank(rng)[0]
        counts[first] = counts.get(first, 0) + 1
    return {replica: count / draws for replica, count in counts.items()}


def test_with_other_routers_the_decode_first_choice_follows_the_water_fill():
    """Slots in use 0, 4 and 8 of 16 (scores 0, 0.25, 0.5), 11 streams from the others and
    this one: the level rises to 8 slots, so a takes 8 of 12 and b 4, c none."""
    policy = DecodePolicy.from_config(DecodeRoutingConfig(), max_num_seqs=16)
    loads = [ReplicaLoad("a", running_seqs=0), ReplicaLoad("b", running_seqs=4),
             ReplicaLoad("c", running_seqs=8)]
    seen = _first_choices(lambda rng: rank_decode(loads, policy, rng, others=11))
    assert seen["a"] == pytest.approx(8 / 12, abs=0.03)
    assert seen["b"] == pytest.approx(4 / 12, abs=0.03)
    assert "c" not in seen
    # every ranking still holds every replica; alone (others 0), or told not to spread,
    # or without a random source, the router ranks least loaded first as before
    assert sorted(rank_decode(loads, policy, random.Random(1), others=11)) == ["a", "b", "c"]
    assert _first_choices(lambda rng: rank_decode(loads, policy, rng)) == {"a": 1.0}
    lone = DecodePolicy.from_config(DecodeRoutingConfig(spread=False), max_num_seqs=16)
    assert _first_choices(lambda rng: rank_decode(loads, lone, rng, others=11)) == {"a": 1.0}
    assert rank_decode(loads, policy, others=11)[0] == "a"


def test_the_draw_keeps_the_pinned_replica_first_and_skips_stale_dead_and_full_ones():
    policy = DecodePolicy.from_config(DecodeRoutingConfig(), max_num_seqs=16)
    loads = [ReplicaLoad("busy", running_seqs=12), ReplicaLoad("a", running_seqs=4),
             ReplicaLoad("b", running_seqs=4), ReplicaLoad("stale", stale=True),
             ReplicaLoad("dead", dead=True), ReplicaLoad("full", kv_usage=0.99)]
    assert _first_choices(lambda rng: rank_decode(loads, policy, rng, pinned="busy",
                                                  others=50)) == {"busy": 1.0}
    seen = _first_choices(lambda rng: rank_decode(loads, policy, rng, others=50))
    assert set(seen) == {"busy", "a", "b"}          # the live, fresh, not full tier only
    assert seen["a"] == pytest.approx(seen["b"], abs=0.04) and seen["busy"] < seen["a"]


def test_with_other_routers_the_prefill_first_choice_follows_the_water_fill():
    """Queues of 0 and 200 tokens, 100-token prompts: costs of 1 and 3 prompts. One prompt
    from the others and this one fill a up to b: all go to a. Seven and this one: the
    level rises to 6, a takes 5 of the 8 and b 3; the stale replica none."""
    loads = _loads({"a": 0, "b": 200, "stale": 0}, stale=frozenset({"stale"}))
    seen = _first_choices(lambda rng: rank_prefill(100, {}, loads, POLICY, rng, 1).ranking)
    assert seen == {"a": 1.0}
    seen = _first_choices(lambda rng: rank_prefill(100, {}, loads, POLICY, rng, 7).ranking)
    assert seen["a"] == pytest.approx(5 / 8, abs=0.03)
    assert seen["b"] == pytest.approx(3 / 8, abs=0.03)
    # the cached tokens are those of the replica drawn first (b holds 4 blocks)
    choices = {(c.ranking[0], c.cached_tokens) for c in (
        rank_prefill(100, {"b": 4}, loads, POLICY, random.Random(seed), 7)
        for seed in range(40))}
    assert choices == {("a", 0), ("b", 64)}


def test_other_routers_are_what_a_replica_finished_less_this_routers_own_completions():
    alone, shared = OtherRouters(), OtherRouters()
    finished = 0
    for second in range(1, 31):                    # one report a second
        for _ in range(5):                         # 5 of this router's requests finish
            alone.completed("r", second - 0.5)
            shared.completed("r", second - 0.5)
        finished += 5
        alone.observe("r", finished, float(second))
        shared.observe("r", finished + 20 * second, float(second))   # and 20 of others'
        alone.observe("r", finished, float(second))                  # read again: no-op
    assert alone.per_period() == 0.0
    assert shared.per_period() == pytest.approx(20.0, rel=0.01)
    # a completion that reached this router just after the report that counted it is
    # evened out by the next report, and below one request a period counts as none
    edge = OtherRouters()
    for second in range(1, 11):
        edge.completed("r", second + 0.01)
        edge.observe("r", second, float(second))
    assert edge.per_period() == 0.0
    # a replaced engine's counter starts again: no negative rate from it, and nothing
    # estimated until two gaps between its reports are in the window
    for second in range(31, 41):
        shared.observe("r", 3 + 20 * (second - 31), float(second))
        if second == 32:
            assert shared.per_period() == 0.0
    assert shared.per_period() == pytest.approx(20.0, rel=0.01)
    shared.forget("r")
    assert shared.per_period() == 0.0 and shared.estimate() == 0.0


def test_a_routing_report_carries_the_finished_requests_counter():
    from cluster.engine.routing_stats import routing_stats_from
    from cluster.engine.stats import EngineStats

    stats = EngineStats(role="decode", engine_id="d", requests_finished=7)
    assert finished_of(routing_stats_from(stats, reported_at=1.0)) == 7
    assert finished_of({"requests_finished": "7"}) is None and finished_of(None) is None


# -- the random-choice baseline -----------------------------------------------------------


def test_random_choice_is_uniform_over_usable_replicas_blind_to_load_and_prefixes():
    """The benchmark's baseline (``random_choice``): a loaded replica holding none of the
    prompt is first as often as an idle one holding all of it; a dead, avoided or stale
    replica is never first while a usable one is left."""
    loads = [ReplicaLoad("idle", queued_prefill_tokens=0),
             ReplicaLoad("busy", queued_prefill_tokens=50_000, running_seqs=200,
                         kv_usage=0.9),
             ReplicaLoad("dead", dead=True), ReplicaLoad("stale", stale=True),
             ReplicaLoad("avoided")]
    prefill = prefill_policy(random_choice=True)
    decode = DecodePolicy.from_config(DecodeRoutingConfig(random_choice=True),
                                      max_num_seqs=256)
    rng = random.Random(7)
    firsts = {"prefill": [], "decode": []}
    for _ in range(2000):
        firsts["prefill"].append(rank_prefill(
            64, {"idle": 4}, loads, prefill, rng, avoid={"avoided"}).ranking[0])
        firsts["decode"].append(rank_decode(
            loads, decode, rng, {"idle": 4}, 64, pinned="idle", avoid={"avoided"})[0])
    for pool, chosen in firsts.items():
        assert set(chosen) == {"idle", "busy"}, pool
        assert 900 <= chosen.count("busy") <= 1100, pool   # 1,000 expected; sd ~22
    ranking = rank_decode(loads, decode, rng, avoid={"avoided"})
    assert ranking[2:] == ("stale", "avoided", "dead")


def test_the_routing_config_turns_the_random_baseline_on_per_pool():
    routing = parse_config({"model": {"name": "m", "path": "/m"}, "router": {"routing": {
        "prefill": {"random_choice": True}}}}).router.routing
    assert PrefillPolicy.from_config(routing.prefill, 16).random_choice
    assert not DecodePolicy.from_config(routing.decode, 256).random_choice
