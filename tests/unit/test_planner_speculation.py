"""Speculative decoding in the planner (tools/planner/speculation.py and the decode
engines of tools/planner/des.py): the expected tokens a verifying step gains, vLLM's
accepted share turned back into a per-draft acceptance, every token counted once, and
the trade it models: steps saved where a step's time is the weights' read, compute lost
where it is the tokens'."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cluster.config import parse_config
from tests.unit.test_planner import small_inputs
from tools.planner.des import ClusterSpec, EngineLimits, SimRequest, Simulation
from tools.planner.hardware import CATALOG
from tools.planner.output import config_document, lever_table
from tools.planner.search import (
    bracket,
    decode_step,
    lever_variants,
    predict,
    search,
    speculation_name,
)
from tools.planner.speculation import Speculation, from_accepted_share, from_counts

REPO = Path(__file__).resolve().parents[2]
H100 = CATALOG["h100"]


def test_a_verifying_step_gains_the_expected_tokens_of_leviathan_et_al():
    half = Speculation(4, 0.5)
    assert half.tokens_per_step == pytest.approx(1.9375)        # 1 + .5 + .25 + .125 + .0625
    assert half.accepted_share == pytest.approx(0.9375 / 4)
    assert Speculation(4, 0.0).tokens_per_step == 1.0
    rng = random.Random(1)
    draws = [half.gained(rng) for _ in range(40_000)]
    assert set(draws) == {1, 2, 3, 4, 5}
    assert statistics.mean(draws) == pytest.approx(half.tokens_per_step, rel=0.02)
    assert {Speculation(4, 0.0).gained(rng) for _ in range(100)} == {1}


@pytest.mark.parametrize("share", [0.0, 0.14, 0.5, 0.9])
def test_the_accepted_share_vllm_reports_gives_back_its_acceptance(share):
    speculation = from_accepted_share(4, share)
    assert speculation.accepted_share == pytest.approx(share, abs=1e-9)
    assert speculation.draft_tokens == 4


def test_steps_without_drafts_gain_one_token_and_verify_none():
    """Prompt lookup drafts only where the context has a match: a quarter of the steps
    here, so a step verifies one draft and gains 1 + 0.25 x 0.9375 tokens on average."""
    some = Speculation(4, 0.5, drafting_share=0.25)
    assert some.drafts_per_step == 1.0
    assert some.tokens_per_step == pytest.approx(1 + 0.25 * 0.9375)
    assert some.accepted_share == Speculation(4, 0.5).accepted_share
    rng = random.Random(2)
    drafts = [some.drafts(rng) for _ in range(40_000)]
    assert set(drafts) == {0, 4} and statistics.mean(drafts) == pytest.approx(1.0, rel=0.03)


def test_the_engines_counters_give_the_acceptance_and_the_drafting_share():
    """400 drafted, 100 accepted, 600 generated: 500 steps (each made one token of its
    own), 400 / (4 x 500) of them drafting, a quarter of the drafts accepted."""
    speculation = from_counts(4, drafted=400, accepted=100, generated=600)
    assert speculation.drafting_share == pytest.approx(0.2)
    assert speculation.accepted_share == pytest.approx(0.25, abs=1e-9)
    assert speculation.tokens_per_step == pytest.approx(600 / 500)
    for drafted, accepted, generated in ((0, 0, 10), (10, 11, 20), (10, 5, 5), (100, 0, 10)):
        with pytest.raises(ValueError):
            from_counts(4, drafted, accepted, generated)


@pytest.mark.parametrize(("tokens", "alpha"), [(0, 0.5), (4, 1.0), (4, -0.1)])
def test_speculation_out_of_range_is_refused(tokens, alpha):
    with pytest.raises(ValueError):
        Speculation(tokens, alpha)
    with pytest.raises(ValueError):
        from_accepted_share(4, 1.0)


def decode_only(step, speculation: Speculation | None) -> ClusterSpec:
    """Every request decode-local on one engine, whose step takes ``step(new tokens)``."""
    return ClusterSpec(0, 1, lambda n, p, c: 0.0, lambda n, p, c: step(n), lambda t: 0.0,
                       decode_limits=EngineLimits(4096, 64), threshold_tokens=10**6,
                       report_interval_s=0, speculation=speculation)


def answers(count: int = 200) -> list[SimRequest]:
    return [SimRequest(i * 2.0, 50, 100) for i in range(count)]   # one at a time


def decode_seconds(spec: ClusterSpec) -> list[float]:
    result = Simulation(spec, answers()).run()
    assert all(o.e2e_s is not None for o in result.outcomes)
    # every token after a request's first, counted once (accepted drafts with a gap of 0)
    assert sum(count for _, _, count in result.token_gaps) == sum(
        r.output_tokens - 1 for r in answers())
    return [o.e2e_s - o.ttft_s for o in result.outcomes]


@pytest.mark.parametrize("drafting", [1.0, 0.3])
def test_speculation_saves_steps_where_a_step_costs_the_same_whatever_its_tokens(drafting):
    """A step bound by reading the weights (its time the same for 1 or 5 tokens a
    sequence): each request's 99 tokens after its first take 1 / (the tokens a step
    gains) of the steps."""
    half = Speculation(4, 0.5, drafting)
    plain = decode_seconds(decode_only(lambda new: 0.01, None))
    drafted = decode_seconds(decode_only(lambda new: 0.01, half))
    assert statistics.mean(plain) == pytest.approx(0.99)
    assert statistics.mean(drafted) / statistics.mean(plain) == pytest.approx(
        1 / half.tokens_per_step, rel=0.05)


@pytest.mark.parametrize("drafting", [1.0, 0.3])
def test_speculation_costs_time_where_a_step_costs_its_tokens(drafting):
    """A step bound by compute (its time its tokens'): verifying 1 + 4 x drafting tokens
    a sequence to gain 1 + 0.56 x drafting of them (14% of drafts accepted) takes that
    ratio's times as long an answer."""
    low = from_accepted_share(4, 0.14, drafting)
    plain = decode_seconds(decode_only(lambda new: 0.002 * new, None))
    drafted = decode_seconds(decode_only(lambda new: 0.002 * new, low))
    assert statistics.mean(drafted) / statistics.mean(plain) == pytest.approx(
        (1 + low.drafts_per_step) / low.tokens_per_step, rel=0.05)


def test_a_speculating_decode_pool_is_planned_and_written_to_its_config():
    inputs = small_inputs(rate=30)
    fast = replace(inputs, speculation=Speculation(4, 0.8))
    step, gained = decode_step(fast, 16, 700.0)
    assert gained == pytest.approx(16 * fast.speculation.tokens_per_step)
    assert step > decode_step(inputs, 16, 700.0)[0]        # 5 tokens a sequence verified
    assert bracket(fast)[0] == bracket(inputs)[0]           # prefill untouched
    on_h100 = replace(inputs, prefill_cost=replace(inputs.prefill_cost, accelerator=H100),
                      decode_cost=replace(inputs.decode_cost, accelerator=H100))  # has fp8
    variants = lever_variants(on_h100, 0.3, 0.15, [Speculation(4, 0.8)])
    assert variants[speculation_name(Speculation(4, 0.8))] == replace(
        on_h100, speculation=Speculation(4, 0.8))
    assert speculation_name(Speculation(4, 0.8)) == "speculation, 4 drafts, 59% accepted"
    plan = search(fast)
    assert plan.prediction.meets(fast.slo)
    base = yaml.safe_load((REPO / "ray_configs/prod-70b.yaml").read_text())
    config = parse_config(config_document(plan, base))
    assert config.decode.speculative.num_speculative_tokens == 4
    assert config.decode.speculative.method == "ngram"
    assert parse_config(config_document(search(inputs), base)).decode.speculative is None
    # a lever that leaves the SLOs out of reach is a row that says so
    table = lever_table({"as given": plan, "too slow": "no cluster met the SLOs"})
    assert "| too slow | no cluster met the SLOs | | | | |" in table.splitlines()


def test_a_slice_with_speculation_predicts_fewer_decode_steps_at_the_same_size():
    """The same cluster, with drafts accepted 80% of the time: each answer streams in
    fewer steps, several tokens a step, so most gaps between its tokens are none (the
    tokens of one step arrive together) and the longest are shorter. (Not the engines'
    busy share: at this load a decode engine always has a sequence to step, with or
    without drafts.)"""
    inputs = small_inputs(rate=30)
    plain = predict(inputs, *bracket(inputs))
    drafted = predict(replace(inputs, speculation=Speculation(4, 0.8)), *bracket(inputs))
    assert drafted.itl_s["p50"] == 0 < plain.itl_s["p50"]
    assert drafted.itl_s["p95"] < plain.itl_s["p95"]
