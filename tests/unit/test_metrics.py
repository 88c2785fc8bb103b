"""Metric catalogue, request timing and the dashboard built on them."""

import json
import re
from pathlib import Path

import pytest

from cluster import metrics as m
from cluster.config import load_config
from cluster.dashboard import build_dashboard, dashboard_json
from cluster.recorder import Counts
from router.timing import STAGES, RequestTimer
from tests.fake_recorder import FakeRecorder

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "ray_configs/grafana/pdserve-dashboard.json"
# the committed dashboard's SLO lines are this config's `slo`
DASHBOARD_CONFIG = "ray_configs/local.yaml"


def test_names_follow_prometheus_conventions():
    names = [spec.name for spec in m.CATALOGUE]
    assert len(names) == len(set(names))
    for spec in m.CATALOGUE:
        assert re.fullmatch(r"pdserve_[a-z0-9_]+", spec.name)
        if spec.kind == "counter":
            assert spec.name.endswith("_total")
        if spec.kind == "histogram":
            assert spec.name.endswith("_seconds") and list(spec.buckets) == sorted(spec.buckets)


@pytest.mark.parametrize(("status", "outcome"), [
    (400, "client_error"), (401, "client_error"), (404, "client_error"),
    (429, "rejected"), (503, "rejected"), (500, "failed"), (502, "failed"),
])
def test_outcomes(status, outcome):
    assert m.outcome_for_status(status) == outcome


def test_committed_dashboard_is_the_generated_one():
    slo = load_config(REPO / DASHBOARD_CONFIG).slo
    assert DASHBOARD.read_text() == dashboard_json(slo), (
        f"run: pdserve dashboard --config {DASHBOARD_CONFIG} > {DASHBOARD}")


def test_every_dashboard_query_uses_catalogued_metrics():
    known = {spec.exported_name for spec in m.CATALOGUE}
    used = set()
    for panel in build_dashboard(load_config(REPO / DASHBOARD_CONFIG).slo)["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"ray_pdserve_[a-z0-9_]+", target["expr"]):
                used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert used <= known, used - known
    # everything the issue asks to see is on the dashboard
    for spec in (m.TTFT, m.ITL, m.REPLICAS, m.KV_USAGE, m.REQUESTS, m.KV_TRANSFER_SECONDS):
        assert spec.exported_name in used
    assert json.loads(DASHBOARD.read_text())["uid"] == "pdserve-overview"


def test_timer_ttft_itl_e2e():
    timer = RequestTimer(arrival=10.0)
    timer.dispatch(10.01)
    timer.chunk(10.5, 1)           # first token
    timer.chunk(10.6, 2)           # two tokens after 0.1 s: two gaps of 0.05
    timer.chunk(10.65, 0)          # an empty chunk changes nothing
    timer.chunk(10.9, 1)
    assert timer.ttft == pytest.approx(0.5)
    assert timer.queue_time == pytest.approx(0.01)
    assert timer.e2e == pytest.approx(0.9)
    assert timer.inter_token_gaps == pytest.approx([0.05, 0.05, 0.3])
    assert timer.tokens == 4


def test_the_stages_to_the_first_event_add_up_and_name_where_the_time_went():
    timer = RequestTimer(arrival=10.0)
    timer.render(10.002)
    timer.dispatch(10.010)
    timer.prefill(10.400)
    timer.chunk(10.450, 1)
    timer.answer(10.451)
    stages = timer.stages()
    assert list(stages) == list(STAGES)
    assert stages == pytest.approx({"render": 0.002, "admission": 0.008, "prefill": 0.39,
                                    "first_token": 0.05, "first_event": 0.001})
    assert sum(stages.values()) == pytest.approx(timer.first_event - timer.arrival)


def test_a_decode_local_request_has_no_prefill_stage_and_marks_keep_their_first_time():
    timer = RequestTimer(arrival=0.0)
    timer.render(0.0)          # a mark at time 0 is a mark
    timer.dispatch(0.1)
    timer.render(0.5)          # a batch's second prompt: the first prompt's marks stand
    timer.dispatch(0.6)
    timer.chunk(0.3, 1)
    assert timer.stages() == pytest.approx({"render": 0.0, "admission": 0.1,
                                            "first_token": 0.2})
    assert timer.queue_time == pytest.approx(0.1)


def test_timer_first_chunk_with_several_tokens():
    timer = RequestTimer(arrival=0.0)
    timer.chunk(1.0, 3)
    assert timer.ttft == 1.0 and timer.inter_token_gaps == [0.0, 0.0] and timer.tokens == 3
    assert timer.chunks == 1


def test_timer_without_tokens_has_no_latencies():
    timer = RequestTimer(arrival=0.0)
    assert timer.ttft is None and timer.e2e is None and timer.queue_time is None


def test_gathered_counts_reach_the_counters_once_each_flush():
    counts, recorder = Counts(), FakeRecorder()
    decode = {"pool": "decode", "version": "v1", "replica": "d0"}
    for tokens in (3, 0, 2):  # one engine step each
        counts.add(m.ENGINE_GENERATION_TOKENS, decode, tokens)
    counts.add(m.ENGINE_PROMPT_TOKENS, {**decode, "source": "transferred"}, 64)
    counts.flush(recorder)
    assert sorted(recorder.counted, key=lambda call: call[0]) == [
        ("pdserve_engine_generation_tokens_total", decode, 5),
        ("pdserve_engine_prompt_tokens_total", {**decode, "source": "transferred"}, 64),
    ]
    counts.flush(recorder)  # nothing new: nothing added twice
    assert len(recorder.counted) == 2


def test_gathered_observations_reach_the_histograms_in_order_once():
    counts, recorder = Counts(), FakeRecorder()
    tags = {"pool": "prefill", "version": "v1", "replica": "p0", "phase": "to_engine"}
    for seconds in (0.0012, 0.0009):  # two requests' hops, on their way to a first token
        counts.observe(m.ENGINE_PHASE, tags, seconds)
    assert recorder.observed == []  # nothing recorded on the request's way
    counts.flush(recorder)
    assert recorder.observed == [("pdserve_engine_request_seconds", tags, 0.0012),
                                 ("pdserve_engine_request_seconds", tags, 0.0009)]
    counts.flush(recorder)
    assert len(recorder.observed) == 2
