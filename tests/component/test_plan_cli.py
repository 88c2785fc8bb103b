"""``pdserve plan`` end to end at a small rate: it answers, writes its figures and a config
that pdserve loads, and refuses what it cannot plan with a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.config import load_config
from cluster.engine.cpu_support import kv_bytes_per_token
from tools.planner.fitted import FittedCost

TEST_CONFIG = Path(__file__).resolve().parents[1] / "integration" / "pdserve-test.yaml"

SMALL = ["--rate", "20", "--slice-replicas", "4", "--sim-seconds", "20"]


def test_a_plan_is_printed_and_written_as_figures_and_a_loadable_config(tmp_path, capsys):
    assert main(["plan", *SMALL, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "prefill pool" in printed and "TTFT p50 / p95 / p99" in printed
    answer = json.loads((tmp_path / "plan.json").read_text())
    assert answer["ttft_s"]["p95"] <= answer["slo"]["ttft_p95_s"]
    assert answer["itl_s"]["p95"] <= answer["slo"]["itl_p95_s"]
    assert answer["gpus"] == answer["prefill"]["gpus"] + answer["decode"]["gpus"]
    config = load_config(tmp_path / "pdserve.yaml")
    assert config.prefill.replicas == answer["prefill"]["replicas"]
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert config.decode.tensor_parallel_size == answer["decode"]["tp"] == 4
    # the day under the written config's autoscalers (its targets are the plan's)
    assert "GPU-hours a day under the autoscalers" in printed
    assert list(answer["day"]) == ["as written", "the base's floors", "the policy alone",
                                   "a day 10% busier", "its peak an hour early"]
    day = answer["day"]["as written"]
    assert day["gpu_hours_total"] == pytest.approx(sum(day["gpu_hours"].values()))
    for pool in ("prefill", "decode"):
        fewest, most = day["replicas_fewest_most"][pool]
        version = next(iter(config.versions))
        assert config.scaling_bounds(version, pool).min_replicas <= fewest <= most
        assert most >= answer[pool]["replicas"]          # the standby floor holds the peak
        # floors fitted to the day: in the base's time zone, led by a start-up already
        standby = getattr(config.autoscaling, pool).standby
        assert standby.timezone == "Europe/Berlin" and standby.ramp_minutes == 0
        highest = max(w.min_replicas for w in standby.windows)
        assert highest >= answer[pool]["replicas"]
        # room for the policy above the floors, for a day busier than their margin
        assert getattr(config.autoscaling, pool).max_replicas >= 1.25 * highest
        assert all(w.min_replicas > getattr(config.autoscaling, pool).min_replicas
                   for w in standby.windows)
    assert config.autoscaling.prefill.tokens_per_s_per_replica != 12600   # prod-70b's own
    assert len(day["timeline"]) == 24 * 6                # ten minutes apart
    assert all(answer["day"][name]["hours_over_slo"] == {"ttft": 0, "itl": 0}
               for name in ("as written", "a day 10% busier", "its peak an hour early"))
    assert (tmp_path / "day.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fp8_plans_need_fewer_gpus_and_set_the_kv_cache_dtype(tmp_path):
    assert main(["plan", "--rate", "400", "--slice-replicas", "4", "--sim-seconds", "20",
                 "--no-day", "--out", str(tmp_path / "bf16")]) == 0
    assert main(["plan", "--rate", "400", "--slice-replicas", "4", "--sim-seconds", "20",
                 "--no-day", "--fp8", "--out", str(tmp_path / "fp8")]) == 0
    bf16, fp8 = (json.loads((tmp_path / name / "plan.json").read_text())
                 for name in ("bf16", "fp8"))
    assert fp8["gpus"] < bf16["gpus"]
    assert "day" not in bf16
    written = {name: load_config(tmp_path / name / "pdserve.yaml") for name in ("bf16", "fp8")}
    assert written["fp8"].engine.kv_cache_dtype == "fp8"
    # without the day, the autoscaling targets are still the plan's, not prod-70b's own
    scaling = {name: config.autoscaling for name, config in written.items()}
    assert scaling["bf16"].prefill.tokens_per_s_per_replica != 12600
    assert scaling["bf16"].decode.output_tokens_per_s_per_replica != 14700
    assert scaling["fp8"].prefill.tokens_per_s_per_replica > \
        scaling["bf16"].prefill.tokens_per_s_per_replica       # fp8 computes faster


def test_several_thresholds_and_tps_are_each_planned_and_the_cheapest_kept(tmp_path, capsys):
    assert main(["plan", "--rate", "400", "--slice-replicas", "4", "--sim-seconds", "20",
                 "--threshold", "0,256", "--prefill-tp", "1,4", "--standby", "base",
                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| threshold 0, TP1 + TP4 | the weights leave room for under" in printed
    answer = json.loads((tmp_path / "plan.json").read_text())
    options = {name: plan for name, plan in answer["configurations"].items()
               if "none" not in plan}
    assert set(options) == {"threshold 0, TP4 + TP4", "threshold 256, TP4 + TP4"}
    assert answer["dollars_per_hour_at_peak"] == min(
        plan["dollars_per_hour_at_peak"] for plan in options.values())
    chosen = load_config(tmp_path / "pdserve.yaml")
    assert chosen.router.disaggregation_threshold_tokens in (0, 256)
    assert f"**threshold {chosen.router.disaggregation_threshold_tokens}, TP4 + TP4 " \
           "(the plan)**" in printed
    # --standby base: prod-70b's evening windows, holding the planned size
    assert list(answer["day"])[:2] == ["as written", "without its standby windows"]
    for pool in ("prefill", "decode"):
        standby = getattr(chosen.autoscaling, pool).standby
        assert [(w.start, w.end) for w in standby.windows] == [("17:00", "23:00")]
        assert standby.windows[0].min_replicas == answer[pool]["replicas"]


@pytest.mark.parametrize(("option", "message"), [
    (["--accelerator", "tpu9"], "unknown accelerator 'tpu9'"),
    (["--accelerator", "a100", "--fp8"], "a100 has no fp8"),
    (["--model", "/no/such/model"], "no model '/no/such/model'"),
    (["--peak-at", "25:00"], "--peak-at: wants HH:MM (00:00..23:59), not '25:00'"),
    (["--startup-s", "-1"], "start-up and drain times are 0 or more"),
    (["--allreduce-efficiency", "2"], "efficiency in [0, 1] required"),
    (["--max-tokens", "-5"], "wants 1 or more, not -5"),
    (["--standby-margin", "-0.1"], "wants a share of 0 or more, not -0.1"),
    (["--standby-shift-minutes", "900"], "wants 0 to 720 minutes, not 900"),
    (["--sim-seconds", "10"], "wants more than the 10 s warm-up that is not read, not 10"),
    (["--spec-tokens", "4"], "--spec-tokens needs --spec-accepted"),
    (["--spec-accepted", "0.5"], "--spec-accepted needs --spec-tokens"),
    (["--spec-tokens", "4", "--spec-counts", "10,5"],
     "--spec-counts wants DRAFTED,ACCEPTED,GENERATED, alone"),
    (["--spec-tokens", "4", "--spec-counts", "100,0,10"], "is more than 4 a step"),
    (["--spec-tokens", "4", "--spec-accepted", "0.5", "--spec-drafting", "0"],
     "wants a share in (0, 1], not 0"),
    (["--spec-tokens", "4", "--spec-accepted", "1.5"], "wants a share in [0, 1), not 1.5"),
])
def test_what_cannot_be_planned_is_refused_with_a_message(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = main(["plan", *SMALL, *option])
        raise SystemExit(code)
    assert exit_info.value.code != 0
    said = capsys.readouterr().err + str(exit_info.value.code)
    assert message in said


def test_the_lever_table_plans_each_lever_alone(tmp_path, capsys):
    assert main(["plan", "--rate", "400", "--slice-replicas", "4", "--sim-seconds", "20",
                 "--lever-table", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    savers = ("fp8 weights and KV", "prefix cache 30% of prompt tokens",
              "response cache 15% of requests")
    drafting = ("speculation, 4 drafts, 14% accepted", "speculation, 4 drafts, 50% accepted")
    for lever in ("as given", *savers, *drafting):
        assert f"| {lever} |" in printed
    levers = json.loads((tmp_path / "plan.json").read_text())["levers"]
    base = levers["as given"]["gpus"]
    assert all(levers[lever]["gpus"] <= base for lever in savers)
    assert levers["fp8 weights and KV"]["gpus"] < base
    # speculation may cost GPUs (verifying drafts is compute): planned all the same
    assert all(levers[lever]["gpus"] > 0 for lever in drafting)


def test_calibrate_times_both_pools_engines_and_replay_uses_the_fit(tmp_path, capsys):
    """A short sweep on the test config's engines (each pool's settings and core), then
    a recorded run replayed through the simulator on the fitted costs."""
    calibration = tmp_path / "new" / "calibration.json"   # a folder it makes
    assert main(["plan", "calibrate", "--config", str(TEST_CONFIG), "--prompt-lengths",
                 "16,512", "--decode-batches", "1,4", "--out", str(calibration)]) == 0
    fitted = json.loads(calibration.read_text())
    for role in ("prefill", "decode"):
        pool = fitted[role]
        assert pool["samples"] >= 6 and pool["max_num_batched_tokens"] > 0
        assert pool["kv_capacity_tokens"] > 0 and min(pool["cost"].values()) >= 0
        cost = FittedCost(**pool["cost"])
        assert cost.step_time(512, 512 * 513 / 2, 0) > cost.step_time(16, 136, 0)
    # TTFTs of 150 ms: the serving layer's fitted share (the measured TTFT less the
    # simulated engines') stays above the slow link's 20 ms below however slow this
    # machine's engines were in the calibration (a share is never negative)
    records = [{"sent_at": i * 0.5, "prompt_tokens": 100 + 10 * i, "output_tokens": 8,
                "first_token_at": i * 0.5 + 0.15, "token_times": [i * 0.5 + 0.3]}
               for i in range(20)]
    trace = tmp_path / "run.json"
    trace.write_text(json.dumps({"records": records}))
    capsys.readouterr()
    assert main(["plan", "replay", "--config", str(TEST_CONFIG), "--calibration",
                 str(calibration), "--trace", str(trace), "--out", str(tmp_path)]) == 0
    assert "simulated |" in capsys.readouterr().out
    replayed = json.loads((tmp_path / "replay.json").read_text())
    assert replayed["runs"][0]["simulated"]["ttft_p50"] == pytest.approx(0.15, rel=0.1)
    assert (tmp_path / "replay.png").stat().st_size > 10_000
    # The same requests as one conversation (each turn the one before's prompt and answer
    # plus 2 tokens), with the engines' counters the run recorded: every turn after the
    # first finds the history before it (less the answer's last token: 97 + 10 i tokens)
    # in its decode engine's cache, and the table sets the counters beside the simulation
    talk = tmp_path / "talk.json"
    talk.write_text(json.dumps({"records": [
        {**record, "index": i, "follows": i - 1 if i else None, "turn": i + 1}
        for i, record in enumerate(records)],
        "engine_work": {"decode prompt tokens cached": 1234.0}}))
    assert main(["plan", "replay", "--config", str(TEST_CONFIG), "--calibration",
                 str(calibration), "--trace", str(talk), "--out", str(tmp_path / "talk")]) == 0
    printed = capsys.readouterr().out
    assert "| decode cached |" in printed and "| measured | 0 | 0 | 0 | 1,234 | 0 |" in printed
    block = load_config(TEST_CONFIG).engine.block_size
    run = json.loads((tmp_path / "talk" / "replay.json").read_text())["runs"][0]
    assert run["simulated"]["prompt_tokens"]["decode"]["cached"] == sum(
        (97 + 10 * i) // block * block for i in range(1, 20))
    assert run["engine_work"] == {"decode prompt tokens cached": 1234.0}
    # A measured transfer (20 ms a read, whatever its size: a slow link) is part of each
    # simulated TTFT, so the serving layer's fitted share of the same measured TTFT shrinks
    slow_link = tmp_path / "transfer.json"
    slow_link.write_text(json.dumps({"rows": [
        {"transport": "shm", "mib": mib, "block_kib": 16,
         "nixl_gbps": mib * 2**20 / (0.020 + mib * 2**20 / 1e10) / 1e9} for mib in (1, 64)]}))
    capsys.readouterr()
    assert main(["plan", "replay", "--config", str(TEST_CONFIG), "--calibration",
                 str(calibration), "--trace", str(trace), "--transfer-from", str(slow_link),
                 "--out", str(tmp_path / "measured")]) == 0
    served = load_config(TEST_CONFIG)
    per_token = kv_bytes_per_token(json.loads(
        (Path(served.model.path) / "config.json").read_text()), 4)    # float32
    assert f"{per_token:,} bytes a token" in capsys.readouterr().out
    with_link = json.loads((tmp_path / "measured" / "replay.json").read_text())
    assert with_link["serving_cost"]["ttft_s"] == pytest.approx(
        replayed["serving_cost"]["ttft_s"] - 0.020, abs=0.004)
    # A held-out run of another cluster (every one of these prompts under its threshold)
    # is simulated on that cluster's path, with the serving layer fitted on the first's
    local = tmp_path / "local.yaml"
    local.write_text(TEST_CONFIG.read_text().replace(
        "disaggregation_threshold_tokens: 48", "disaggregation_threshold_tokens: 1000"))
    assert main(["plan", "replay", "--config", str(TEST_CONFIG), "--calibration",
                 str(calibration), "--trace", str(trace), "--trace", str(trace),
                 "--held-out-config", str(local), "--held-out-trace", str(trace),
                 "--out", str(tmp_path / "local")]) == 0
    fit, predicted, held_out = json.loads(
        (tmp_path / "local" / "replay.json").read_text())["runs"]
    prompt_tokens = sum(record["prompt_tokens"] for record in records)
    for run in (fit, predicted):      # --config's cluster, fitted on or not
        assert run["simulated"]["prompt_tokens"]["prefill"]["computed"] == prompt_tokens
        assert run["config"] == str(TEST_CONFIG)
    assert (fit["fitted_on"], predicted["fitted_on"], held_out["fitted_on"]) == (
        True, False, False)
    assert held_out["simulated"]["prompt_tokens"]["prefill"]["computed"] == 0
    assert held_out["simulated"]["prompt_tokens"]["decode"]["computed"] == prompt_tokens
    assert held_out["config"] == str(local)
    assert main(["plan", "replay", "--config", str(TEST_CONFIG), "--calibration",
                 str(calibration), "--trace", str(trace), "--held-out-trace",
                 str(trace)]) == 2
    assert "--held-out-trace and --held-out-config go together" in capsys.readouterr().err
    # more runs to fit on than runs given is an error, not a fit on fewer
    assert main(["plan", "replay", "--config", str(TEST_CONFIG), "--calibration",
                 str(calibration), "--trace", str(trace), "--fit-runs", "2"]) == 2
    assert "--fit-runs 2 is more than the 1 --trace runs" in capsys.readouterr().err


def test_a_plan_with_speculation_writes_it_into_the_config(tmp_path):
    """Counters as /admin/stats gives them: 400 drafted, 100 accepted, 600 generated."""
    assert main(["plan", *SMALL, "--no-day", "--spec-tokens", "4", "--spec-counts",
                 "400,100,600", "--out", str(tmp_path)]) == 0
    config = load_config(tmp_path / "pdserve.yaml")
    assert config.decode.speculative.num_speculative_tokens == 4
