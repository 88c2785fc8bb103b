"""Benchmark workloads and statistics (pure parts of `pdserve bench`)."""

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.slo import SLOConfig
from tools.bench.stats import SLO, RequestRecord, ratio, summarise
from tools.bench.workload import WorkloadSpec, arrival_times, plan, shared_prefixes

REPO = Path(__file__).resolve().parents[2]


def count_bytes(text: str) -> int:  # the tiny model's tokenizer: one token per byte
    return len(text.encode())


def test_plan_is_seeded_and_prompts_are_distinct():
    spec = WorkloadSpec(num_requests=40, seed=3, scale=0.1)
    first, again = plan(spec, count_bytes), plan(spec, count_bytes)
    assert first == again
    assert len({r.prompt for r in first}) == 40
    # no two prompts share even their first KV block: the prefix cache cannot help
    assert len({r.prompt[:32] for r in first}) == 40
    assert plan(WorkloadSpec(num_requests=40, seed=4, scale=0.1), count_bytes) != first


def test_a_repeat_fraction_repeats_earlier_requests_exactly_at_the_same_arrivals():
    fresh = plan(WorkloadSpec(num_requests=200, seed=5, scale=0.1), count_bytes)
    mixed = plan(WorkloadSpec(num_requests=200, seed=5, scale=0.1, repeat_fraction=0.3),
                 count_bytes)
    assert [r.send_at for r in mixed] == [r.send_at for r in fresh]
    assert mixed == plan(WorkloadSpec(num_requests=200, seed=5, scale=0.1,
                                      repeat_fraction=0.3), count_bytes)
    seen: dict[str, tuple[int, int]] = {}
    repeats = 0
    for request in mixed:
        if request.prompt in seen:  # an exact repeat: the same prompt and the same length
            repeats += 1
            assert seen[request.prompt] == (request.prompt_tokens, request.max_tokens)
        seen[request.prompt] = (request.prompt_tokens, request.max_tokens)
    assert 40 <= repeats <= 80          # ~30% of 200
    with pytest.raises(ValueError, match="repeat_fraction"):
        WorkloadSpec(repeat_fraction=1.0)


def test_shared_heads_start_every_prompt_one_group_each_at_the_same_arrivals():
    """Tenants' system prompts: each prompt begins with one of ``prefix_groups`` heads of
    ~``shared_prefix_tokens``, no two heads share a KV block, and the arrivals are those
    of the workload without heads."""
    fresh = plan(WorkloadSpec(num_requests=120, seed=5, scale=0.1), count_bytes)
    spec = WorkloadSpec(num_requests=120, seed=5, scale=0.1, shared_prefix_tokens=256,
                        prefix_groups=4)
    grouped = plan(spec, count_bytes)
    assert grouped == plan(spec, count_bytes)
    assert [r.send_at for r in grouped] == [r.send_at for r in fresh]
    heads = shared_prefixes(spec, count_bytes)
    assert len(heads) == 4 and all(250 <= count_bytes(h) <= 260 for h in heads)
    assert len({h[:16] for h in heads}) == 4          # apart within the first block
    users = [sum(r.prompt.startswith(h) for r in grouped) for h in heads]
    assert sum(users) == 120 and min(users) >= 15     # every request has one head
    # one group is the single shared head the option gave before there were groups
    assert shared_prefixes(WorkloadSpec(shared_prefix_tokens=256, seed=5), count_bytes) == \
        heads[:1]
    assert shared_prefixes(WorkloadSpec(seed=5), count_bytes) == [""]
    with pytest.raises(ValueError, match="prefix_groups"):
        WorkloadSpec(prefix_groups=0)


def test_a_salt_keeps_lengths_times_and_groups_and_shares_nothing_with_another_run():
    """Two runs of one seed with different salts: the same arrivals, lengths (but the salt's
    few tokens) and groups, and no prompt starts like any of the other run's; within a
    run the shared heads are still shared."""
    spec = WorkloadSpec(num_requests=60, seed=5, scale=0.1, shared_prefix_tokens=128,
                        prefix_groups=3, turns=2)
    first, second = (plan(replace(spec, prompt_salt=salt), count_bytes) for salt in ("a", "b"))
    assert [(r.send_at, r.max_tokens, r.prefix_group, r.follows) for r in first] == \
        [(r.send_at, r.max_tokens, r.prefix_group, r.follows) for r in second]
    assert all(abs(a.prompt_tokens - b.prompt_tokens) <= 1
               for a, b in zip(first, second, strict=True))
    # a later turn's prompt is its message, sent after its history: the first turns' heads
    assert not {r.prompt[:16] for r in first if r.follows is None} \
        & {r.prompt[:16] for r in second if r.follows is None}
    heads = shared_prefixes(spec, count_bytes)
    assert all(r.prompt.startswith("[a] " + heads[r.prefix_group])
               for r in first if r.follows is None)


def test_conversations_chain_their_turns_and_come_at_the_rate_in_all():
    spec = WorkloadSpec(num_requests=30, rate=3.0, seed=2, scale=0.1, turns=3, think_s=1.5)
    planned = plan(spec, count_bytes)
    assert planned == plan(spec, count_bytes) and len(planned) == 30
    assert [r.index for r in planned] == list(range(30))
    first = [r for r in planned if r.follows is None]
    # ten conversations, their openings at a third of the rate: all turns come at ~rate
    assert first == plan(WorkloadSpec(num_requests=10, rate=1.0, seed=2, scale=0.1),
                         count_bytes)
    by_index = {r.index: r for r in planned}
    for request in planned:
        if request.follows is None:
            assert request.turn == 1
            continue
        earlier = by_index[request.follows]
        assert request.turn == earlier.turn + 1 and request.index > earlier.index
        assert request.prompt.startswith("\n") and request.think_s >= 0
        # the history is an estimate: the earlier prompt, its whole answer, the message
        assert request.prompt_tokens == (earlier.prompt_tokens + earlier.max_tokens
                                         + count_bytes(request.prompt))
    assert sorted(r.turn for r in planned) == [1] * 10 + [2] * 10 + [3] * 10
    assert 0.5 < sum(r.think_s for r in planned if r.turn > 1) / 20 < 3.0
    # a conversation whose history would not fit the context ends early
    tight = plan(WorkloadSpec(num_requests=30, seed=2, scale=0.1, turns=3,
                              max_model_len=120), count_bytes)
    assert all(r.prompt_tokens + r.max_tokens + 16 <= 120 for r in tight if r.turn > 1)
    assert len(tight) < 30
    with pytest.raises(ValueError, match="turns"):
        WorkloadSpec(turns=0)


def test_prompts_are_text_of_the_recorded_length():
    for request in plan(WorkloadSpec(num_requests=30, seed=1, scale=0.2), count_bytes):
        assert count_bytes(request.prompt) == request.prompt_tokens
        assert request.prompt.isprintable()


def test_reference_mix_averages_like_chat_traffic():
    requests = plan(WorkloadSpec(num_requests=1500, seed=0), lambda text: len(text) // 4)
    prompts = [r.prompt_tokens for r in requests]
    outputs = [r.max_tokens for r in requests]
    assert 380 < statistics.mean(prompts) < 620
    assert 240 < statistics.mean(outputs) < 360
    assert max(prompts) > 4000 and max(prompts) <= 8192  # a long tail, capped at 8K


def test_interference_mix_has_a_trickle_of_long_prompts():
    requests = plan(WorkloadSpec(name="interference", num_requests=400, seed=0,
                                 long_fraction=0.1), lambda text: len(text) // 4)
    long = [r for r in requests if r.kind == "long"]
    assert 20 <= len(long) <= 60
    assert all(4096 <= r.prompt_tokens <= 8192 for r in long)
    assert all(r.prompt_tokens < 1200 for r in requests if r.kind == "short")


def test_arrivals_follow_the_rate_and_the_peak():
    import random

    steady = arrival_times(WorkloadSpec(rate=5, num_requests=2000), random.Random(0))
    assert steady == sorted(steady)
    assert steady[-1] == pytest.approx(400, rel=0.1)
    peaked = arrival_times(WorkloadSpec(rate=5, num_requests=2000, peak_factor=3,
                                        peak_window=(100, 200)), random.Random(0))
    inside = sum(100 <= t < 200 for t in peaked)
    before = sum(0 <= t < 100 for t in peaked)
    assert inside > 2.5 * before


def record(index, ttft, gaps, kind="short", error=None):
    r = RequestRecord(index, kind, 100, sent_at=1.0, error=error)
    if error is None:
        r.first_token_at = 1.0 + ttft
        r.token_times = [r.first_token_at]
        for gap in gaps:
            r.token_times.append(r.token_times[-1] + gap)
        r.output_tokens = len(r.token_times)
    return r


def test_summary_counts_goodput_and_errors():
    records = [
        record(0, 0.2, [0.05, 0.05]),              # meets both SLOs
        record(1, 0.9, [0.05]),                    # TTFT too slow
        record(2, 0.1, [0.3, 0.3], kind="long"),   # TPOT too slow
        record(3, 0, [], error="http_503"),
    ]
    summary = summarise(records, duration_s=2.0, slo=SLO(ttft_s=0.5, tpot_s=0.1))
    assert summary["requests"] == 4 and summary["completed"] == 3
    assert summary["goodput_requests_per_s"] == 0.5
    assert summary["errors"] == {"http_503": 1}
    assert summary["output_tokens_per_s"] == (3 + 2 + 3) / 2
    assert summary["ttft_s"]["p50"] == pytest.approx(0.2)
    short = summarise(records, 2.0, SLO.from_config(SLOConfig()), kind="short")
    assert short["requests"] == 3 and short["completed"] == 2


def test_goodput_bounds_come_from_the_config_and_flags_override_them():
    slo = SLOConfig(ttft_p95_s=0.3, tpot_s=0.04)
    assert SLO.from_config(slo) == SLO(ttft_s=0.3, tpot_s=0.04)
    assert SLO.from_config(slo, tpot_s=0.2) == SLO(ttft_s=0.3, tpot_s=0.2)
    assert SLO.from_config(SLOConfig()) == SLO(ttft_s=0.5, tpot_s=0.1)  # the defaults


def test_ratio():
    assert ratio(1.0, 2.0) == 0.5
    assert ratio(None, 2.0) is None and ratio(1.0, 0) is None


def test_variants_parse_and_override_dotted_keys():
    from tools.bench.variants import apply_overrides, parse_variant

    variant = parse_variant("lane:router.admission.long_prompt_tokens=2048,"
                            "prefill.max_num_batched_tokens=512,router.x=null")
    assert variant.name == "lane"
    assert variant.overrides == {"router.admission.long_prompt_tokens": 2048,
                                 "prefill.max_num_batched_tokens": 512, "router.x": None}
    base = {"router": {"port": 1}, "prefill": None}
    changed = apply_overrides(base, variant.overrides)
    assert changed["router"]["admission"] == {"long_prompt_tokens": 2048}
    assert changed["prefill"] == {"max_num_batched_tokens": 512}
    assert base == {"router": {"port": 1}, "prefill": None}  # the base is not modified
    assert parse_variant("base") == type(variant)("base", {})
    assert parse_variant("tcp:kv_transfer.ucx_tls=tcp,self,router.port=9").overrides == {
        "kv_transfer.ucx_tls": "tcp,self", "router.port": 9}
    with pytest.raises(ValueError):
        parse_variant("bad:router.port")
    with pytest.raises(ValueError):
        apply_overrides({"router": 5}, {"router.port": 1})


def test_compare_variants_are_pdserve_setups_with_settings_overridden(tmp_path):
    from tools.bench.servers import compare_variants

    config_path = REPO / "ray_configs/bench.yaml"
    path, config = compare_variants(config_path, ["chunk0:router.stream_chunk_interval_ms=0"],
                                    tmp_path)["chunk0"]
    assert config.router.stream_chunk_interval_ms == 0
    assert path.parent == tmp_path and path.is_file()

    with pytest.raises(SystemExit, match="has a setup's name"):
        compare_variants(config_path, ["colocated:router.stream_chunk_interval_ms=0"], tmp_path)


def test_the_variants_table_gives_engine_cpu_per_token_and_quality_beside_latency():
    from tools.bench.tables import variants_table

    def summary(ttft: float, engine_cpu_s: float, agreement: float) -> dict:
        latency = {"ttft_s": {"p50": ttft, "p95": ttft}, "itl_s": {"p50": 0.01, "p95": 0.02}}
        return {"all": {**latency, "goodput_requests_per_s": 0.5, "output_tokens_per_s": 100.0},
                "short": latency, "long": latency, "duration_s": 10.0,
                "cpu_s_by_role": {"prefill engine": engine_cpu_s / 2,
                                  "decode engine": engine_cpu_s / 2, "router": 99.0},
                "quality": {"perplexity_candidate": 7.25, "top1_agreement": agreement,
                            "kl_mean": 0.0, "kl_p95": 0.0}}

    table = variants_table({"full": summary(0.2, 4.0, 1.0), "w8a8": summary(0.1, 2.0, 0.9)})
    assert "100 ms (0.50x)" in table
    # 1,000 output tokens: 4 engine CPU-seconds -> 4,000 per million; the router's not counted
    cpu_row = next(line for line in table.splitlines() if "engine CPU-s/1M" in line)
    assert cpu_row.split()[-2:] == ["4,000", "2,000"]
    agreement = next(line for line in table.splitlines() if "top-1 agreement" in line)
    assert agreement.split()[-2:] == ["100.00%", "90.00%"]
