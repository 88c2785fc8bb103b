"""``pdserve plan`` end to end at a small rate: it answers, writes its figures and a config
that pdserve loads, and refuses what it cannot plan with a message."""

from __future__ import annotations

import json

import pytest

from cluster.cli import main
from cluster.config import load_config

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
    assert config.decode.tensor_parallel_size == answer["decode"]["tp"] == 4


def test_fp8_plans_need_fewer_gpus_and_set_the_kv_cache_dtype(tmp_path):
    assert main(["plan", "--rate", "400", "--slice-replicas", "4", "--sim-seconds", "20",
                 "--out", str(tmp_path / "bf16")]) == 0
    assert main(["plan", "--rate", "400", "--slice-replicas", "4", "--sim-seconds", "20",
                 "--fp8", "--out", str(tmp_path / "fp8")]) == 0
    bf16, fp8 = (json.loads((tmp_path / name / "plan.json").read_text())
                 for name in ("bf16", "fp8"))
    assert fp8["gpus"] < bf16["gpus"]
    assert load_config(tmp_path / "fp8" / "pdserve.yaml").engine.kv_cache_dtype == "fp8"


@pytest.mark.parametrize(("option", "message"), [
    (["--accelerator", "tpu9"], "unknown accelerator 'tpu9'"),
    (["--accelerator", "a100", "--fp8"], "a100 has no fp8"),
    (["--model", "/no/such/model"], "no model '/no/such/model'"),
])
def test_what_cannot_be_planned_is_refused_with_a_message(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = main(["plan", *SMALL, *option])
        raise SystemExit(code)
    assert exit_info.value.code != 0
    said = capsys.readouterr().err + str(exit_info.value.code)
    assert message in said
