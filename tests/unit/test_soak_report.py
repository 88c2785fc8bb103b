"""How a soak's answers are judged (tools/soak/report.py)."""

from __future__ import annotations

from tools.soak.report import Answer, percentile, slope_per_minute, tally, verdict


def answer(**fields) -> Answer:
    return Answer(**{"kind": "short", "phase": "faulted", "status": 200, "text": "abc",
                     "finished": True, **fields})


def test_an_answer_equal_to_its_unfaulted_one_is_ok():
    assert verdict(answer(), "abc") == "ok"


def test_an_unfinished_prefix_is_truncated_and_a_different_text_altered():
    assert verdict(answer(text="ab", finished=False), "abc") == "truncated"
    assert verdict(answer(text="abx"), "abc") == "altered"
    assert verdict(answer(text="ab"), "abc") == "altered"  # finished, yet shorter


def test_no_response_is_lost_and_a_server_error_5xx():
    assert verdict(answer(status=None), "abc") == "lost"
    assert verdict(answer(status=503), "abc") == "5xx"
    assert verdict(answer(status=429), "abc") == "wrong_status"


def test_a_503_event_is_a_refused_migration_and_any_other_error_event_5xx():
    assert verdict(answer(text="a", finished=False, error_code=503), "abc") == \
        "migration_refused"
    assert verdict(answer(error_code=500), "abc") == "5xx"


def test_a_poison_is_judged_by_its_expected_status():
    poison = {"kind": "poison:n_4096", "expected_status": 400}
    assert verdict(answer(status=400, **poison), None) == "refused"
    assert verdict(answer(status=500, **poison), None) == "5xx"
    assert verdict(answer(status=200, **poison), None) == "wrong_status"
    assert verdict(answer(status=200, kind="poison:seeded"), None) == "ok"


def test_tally_counts_each_phase_against_its_request_reference():
    answers = [answer(phase="unfaulted"), answer(text="x"), answer(status=None)]
    counts = tally(answers, {"k": "abc"}, lambda _: "k")
    assert counts["unfaulted"] == {"ok": 1}
    assert counts["faulted"] == {"altered": 1, "lost": 1}


def test_percentile_by_nearest_rank():
    assert percentile([], 0.95) is None
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile(list(range(1, 101)), 0.95) == 95


def test_slope_per_minute_of_a_steady_rise():
    assert slope_per_minute([(0, 100), (60, 110), (120, 120)]) == 10
    assert slope_per_minute([(0, 1)]) is None
