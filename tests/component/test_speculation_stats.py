"""The decode engine's speculation counts (decode.speculative), as vLLM reports them at
each step, reach /admin/stats and pdserve_spec_decode_tokens_total."""

from __future__ import annotations

from vllm.v1.spec_decode.metrics import SpecDecodingStats

from cluster.engine.stats import EngineStats
from cluster.engine.stats_logger import _observe_speculation
from cluster.recorder import Counts
from tests.fake_recorder import FakeRecorder


def test_drafted_and_accepted_tokens_are_counted_per_step_and_flushed_once():
    stats, counts, recorder = EngineStats("decode", "d0"), Counts(), FakeRecorder()
    tags = {"pool": "decode", "version": "v1", "replica": "d0"}
    for drafted, accepted in ((8, 3), (4, 0)):  # two engine steps
        step = SpecDecodingStats.new(num_spec_tokens=4)
        step.num_drafts, step.num_draft_tokens = drafted // 4, drafted
        step.num_accepted_tokens = accepted
        _observe_speculation(stats, counts, tags, step)
    _observe_speculation(stats, counts, tags, None)  # an engine that does not speculate
    assert (stats.spec_draft_tokens, stats.spec_accepted_tokens) == (12, 3)
    counts.flush(recorder)
    assert sorted(recorder.counted, key=lambda call: call[1]["kind"]) == [
        ("pdserve_spec_decode_tokens_total", {**tags, "kind": "accepted"}, 3),
        ("pdserve_spec_decode_tokens_total", {**tags, "kind": "drafted"}, 12),
    ]
