"""The quality delta between two runs' next-token distributions (tools/bench/quality.py)."""

import math

import pytest

from tools.bench.quality import (
    Position,
    compare,
    kl_divergence,
    perplexity,
    positions_from_echo,
)


def _position(actual: int, probabilities: dict[int, float]) -> Position:
    return Position(actual, {token: math.log(p) for token, p in probabilities.items()})


def test_an_echoed_completions_positions_are_read_by_token_id():
    logprobs = {"tokens": ["token_id:72", "token_id:105", "token_id:33", "token_id:10"],
                "token_logprobs": [None, -0.5, -2.0, -0.1],
                "top_logprobs": [None, {"token_id:105": -0.5, "token_id:97": -1.2},
                                 {"token_id:10": -0.1, "token_id:33": -2.0},
                                 {"token_id:10": -0.1}]}     # generated: not the text's
    positions = positions_from_echo(logprobs, prompt_tokens=3)
    assert [p.actual for p in positions] == [105, 33]
    assert positions[1].logprobs == {10: -0.1, 33: -2.0} and positions[1].top == 10
    with pytest.raises(ValueError, match="by id"):
        positions_from_echo({"tokens": ["a", "b"], "top_logprobs": [None, {"b": -1.0}]}, 2)


def test_perplexity_is_the_exponent_of_the_mean_surprise():
    passage = [_position(1, {1: 0.5, 2: 0.5}), _position(2, {1: 0.75, 2: 0.25})]
    assert perplexity([passage]) == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.25)) / 2))


def test_identical_distributions_agree_fully_and_diverge_by_nothing():
    passage = [_position(1, {1: 0.6, 2: 0.3, 3: 0.05}), _position(3, {3: 0.9, 1: 0.05})]
    delta = compare([passage], [passage])
    assert delta.top1_agreement == 1 and delta.kl_mean == pytest.approx(0, abs=1e-12)
    assert delta.perplexity_baseline == delta.perplexity_candidate
    assert delta.positions == 2


def test_kl_matches_the_closed_form_when_the_lists_cover_everything():
    p, q = {1: 0.7, 2: 0.3}, {1: 0.4, 2: 0.6}
    expected = 0.7 * math.log(0.7 / 0.4) + 0.3 * math.log(0.3 / 0.6)
    assert kl_divergence(_position(1, p), _position(1, q)) == pytest.approx(expected)


def test_a_token_the_candidate_did_not_list_gets_its_smallest_listed_probability():
    baseline = _position(1, {1: 0.5, 2: 0.4})        # 0.1 elsewhere
    candidate = _position(1, {1: 0.8, 3: 0.1})       # token 2 unlisted: at most 0.1
    q2, q_rest = 0.1, 1 - 0.8 - 0.1
    expected = (0.5 * math.log(0.5 / 0.8) + 0.4 * math.log(0.4 / q2)
                + 0.1 * math.log(0.1 / q_rest))
    assert kl_divergence(baseline, candidate) == pytest.approx(expected)


def test_disagreement_is_counted_per_position():
    baseline = [[_position(1, {1: 0.6, 2: 0.4}), _position(2, {1: 0.6, 2: 0.4})]]
    candidate = [[_position(1, {1: 0.6, 2: 0.4}), _position(2, {1: 0.4, 2: 0.6})]]
    delta = compare(baseline, candidate)
    assert delta.top1_agreement == 0.5 and delta.kl_mean > 0 and delta.kl_p95 > 0


def test_passages_tokenized_differently_are_refused():
    with pytest.raises(ValueError, match="tokenized"):
        compare([[_position(1, {1: 1.0})]], [[_position(2, {2: 1.0})]])
