"""The project's own quantized checkpoints (cluster/quantize.py) and the CPU check that
refuses settings a machine cannot run (cluster/engine/cpu_check.py), on real files."""

import json

import pytest

from cluster import cli
from cluster.checkpoints import ensure_checkpoints
from cluster.config import TinyModelSpec, parse_config
from cluster.engine import cpu_check
from cluster.engine.cpu_support import Processor

SPEC = TinyModelSpec(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128,
                     max_position_embeddings=256, seed=5)
AVX2 = Processor("x86_64", frozenset({"avx", "avx2"}))
AVX512 = Processor("x86_64", frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}))


def _versions(tmp_path, **engine) -> dict:
    """A full-precision version that pdserve generates and its W8A8 copy."""
    return {
        "served_models": {"m": {"full": 100}, "m-w8a8": {"w8a8": 100}},
        "versions": {
            "full": {"path": str(tmp_path / "full"), "generate": SPEC.model_dump()},
            "w8a8": {"path": str(tmp_path / "w8a8"),
                     "quantize": {"source": str(tmp_path / "full")}},
        },
        "engine": {"max_model_len": 256, **engine},
    }


def test_a_w8a8_copy_holds_int8_weights_within_half_a_step_of_the_originals(tmp_path):
    import torch
    from safetensors.torch import load_file

    config = parse_config(_versions(tmp_path))
    paths = ensure_checkpoints(config)  # the copy's source is made first
    full, quantized = (load_file(paths[name] / "model.safetensors") for name in ("full", "w8a8"))
    linear = [name for name in full if name.startswith("model.layers.") and "proj" in name]
    assert len(linear) == 2 * 7  # q, k, v, o, gate, up, down in each of two layers
    for name in linear:
        weight, scale = quantized[name], quantized[name.replace("weight", "weight_scale")]
        assert weight.dtype == torch.int8 and scale.shape == (weight.shape[0], 1)
        error = (weight.float() * scale - full[name]).abs()
        assert bool((error <= scale / 2 + 1e-7).all()), name  # rounded to the nearest step
    assert torch.equal(quantized["lm_head.weight"], full["lm_head.weight"])  # kept
    declared = json.loads((paths["w8a8"] / "config.json").read_text())["quantization_config"]
    assert declared["quant_method"] == "compressed-tensors"
    assert declared["format"] == "int-quantized" and declared["ignore"] == ["lm_head"]
    group = declared["config_groups"]["group_0"]
    assert (group["weights"]["strategy"], group["input_activations"]["dynamic"]) == ("channel",
                                                                                    True)


def test_the_copy_is_made_once_and_again_when_its_source_changes(tmp_path):
    config = parse_config(_versions(tmp_path))
    copy = ensure_checkpoints(config)["w8a8"] / "model.safetensors"
    made = copy.stat().st_mtime_ns
    ensure_checkpoints(config)
    assert copy.stat().st_mtime_ns == made
    retrained = _versions(tmp_path)
    retrained["versions"]["full"]["generate"]["seed"] = 6  # the source is made anew
    ensure_checkpoints(parse_config(retrained))
    assert copy.stat().st_mtime_ns != made


def test_a_missing_source_is_named(tmp_path):
    config = parse_config({"model": {"name": "m", "path": str(tmp_path / "q"),
                                     "quantize": {"source": str(tmp_path / "nowhere")}}})
    with pytest.raises(FileNotFoundError, match="nowhere"):
        ensure_checkpoints(config)


def test_each_engine_is_checked_against_the_cpu_it_runs_on(tmp_path):
    config = parse_config(_versions(tmp_path, kv_cache_dtype="fp8"))
    ensure_checkpoints(config)
    refusals = [reason for version in ("full", "w8a8") for role in ("prefill", "decode")
                for reason in cpu_check.engine_refusals(config, role, version, AVX2)]
    assert len(refusals) == 4 and all("AVX-512 or AMX" in reason for reason in refusals)
    assert refusals[0].startswith("prefill pool of version full: engine.kv_cache_dtype=fp8")
    assert cpu_check.engine_refusals(config, "decode", "w8a8", AVX512) == []
    on_gpus = parse_config({**_versions(tmp_path, kv_cache_dtype="fp8"),
                            "decode": {"num_gpus": 1}})
    assert cpu_check.engine_refusals(on_gpus, "decode", "full", AVX2) == []


def test_pdserve_up_refuses_a_local_cluster_this_cpu_cannot_run(tmp_path, monkeypatch, capsys):
    config_file = tmp_path / "pdserve.yaml"
    config_file.write_text(json.dumps({**_versions(tmp_path, kv_cache_dtype="fp8"),
                                       "router": {"port": 18931}}))
    monkeypatch.setattr(cpu_check, "local_processor", lambda: AVX2)
    assert cli.main(["up", "--config", str(config_file)]) == 2  # before Ray starts
    stderr = capsys.readouterr().err
    assert stderr.count("needs an x86 CPU with AVX-512 or AMX") == 4, stderr
    assert "x86_64: AVX2" in stderr


def test_this_machine_is_read():
    cpu = cpu_check.local_processor()
    assert cpu.arch and (cpu.flags or not cpu.x86)
