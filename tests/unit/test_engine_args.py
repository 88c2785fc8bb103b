"""Engine arguments, environment and deployment options derived from the config."""

import pytest

from cluster.config import parse_config
from cluster.engine.args import (
    baseline_env,
    baseline_flags,
    cli_flags,
    engine_env,
    engine_kwargs,
    pool_deployment_options,
)
from cluster.engine.stats import EngineStats

BASE = {
    "model": {"name": "m", "path": "/models/m"},
    "engine": {"dtype": "float32", "block_size": 32, "cpu_kvcache_space_gib": 1,
               "extra": {"max_logprobs": 5}},
    "prefill": {"max_num_batched_tokens": 512, "engine_overrides": {"max_num_seqs": 8},
                "env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}},
}


def test_engine_kwargs_merge_shared_then_pool():
    config = parse_config(BASE)
    prefill = engine_kwargs(config, "prefill", {"kv_role": "kv_producer"})
    decode = engine_kwargs(config, "decode", None)
    assert prefill["max_num_batched_tokens"] == 512 and "max_num_batched_tokens" not in decode
    assert prefill["enable_chunked_prefill"] is True
    assert (prefill["max_num_seqs"], decode["max_num_seqs"]) == (8, 256)  # the pool's override
    assert prefill["block_size"] == decode["block_size"] == 32
    assert prefill["max_logprobs"] == 5
    assert prefill["kv_transfer_config"] == {"kv_role": "kv_producer"}
    assert "kv_transfer_config" not in decode
    assert prefill["disable_log_stats"] is False


def test_kv_cache_dtype_and_quantization_reach_both_pools_engines():
    config = parse_config({**BASE, "engine": {**BASE["engine"], "kv_cache_dtype": "fp8",
                                              "quantization": "compressed-tensors"}})
    for role in ("prefill", "decode"):
        kwargs = engine_kwargs(config, role, None)
        assert (kwargs["kv_cache_dtype"], kwargs["quantization"]) == ("fp8",
                                                                      "compressed-tensors")
    default = engine_kwargs(parse_config(BASE), "decode", None)
    assert default["kv_cache_dtype"] == "auto" and "quantization" not in default
    assert "--kv-cache-dtype" in baseline_flags(config)


def test_engine_env_has_unique_side_channel_and_pool_env():
    config = parse_config(BASE)
    env = engine_env(config, "prefill", "10.0.0.5", 15601)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "15601"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(config, "decode", "h", 1)


def test_same_host_kv_goes_through_shared_memory_unless_switched_off():
    on = parse_config(BASE)
    off = parse_config({**BASE, "kv_transfer": {"shared_memory": False}})
    for role in ("prefill", "decode"):  # the prefill engine shares, the decode one maps
        assert engine_env(on, role, "h", 1)["PDSERVE_KV_SHARED_MEMORY"] == "1"
        assert "PDSERVE_KV_SHARED_MEMORY" not in engine_env(off, role, "h", 1)


def test_an_eager_engine_and_its_baseline_compile_nothing_not_even_sampler_ops():
    eager = parse_config({**BASE, "engine": {**BASE["engine"], "enforce_eager": True}})
    for env in (engine_env(eager, "prefill", "h", 1), engine_env(eager, "decode", "h", 1),
                baseline_env(eager)):
        assert env["TORCH_COMPILE_DISABLE"] == "1"
    assert "TORCH_COMPILE_DISABLE" not in engine_env(parse_config(BASE), "decode", "h", 1)
    # a pool's own env still has the last word
    pool_says = {**BASE["engine"], "enforce_eager": True}
    overridden = parse_config({**BASE, "engine": pool_says,
                               "decode": {"env": {"TORCH_COMPILE_DISABLE": "0"}}})
    assert engine_env(overridden, "decode", "h", 1)["TORCH_COMPILE_DISABLE"] == "0"


def flag_values(flags: list[str]) -> dict[str, list[str]]:
    """``--name v1 v2 --switch`` as {"--name": ["v1", "v2"], "--switch": []}."""
    parsed: dict[str, list[str]] = {}
    for part in flags:
        if part.startswith("--"):
            current = parsed.setdefault(part, [])
        else:
            current.append(part)
    return parsed


def test_the_baseline_server_gets_the_decode_pools_engine_settings():
    config = parse_config({
        "model": {"name": "m", "path": "/models/m"},
        "engine": {"dtype": "float32", "block_size": 32, "cpu_kvcache_space_gib": 3,
                   "enable_prefix_caching": False, "extra": {"max_logprobs": 5}},
        "prefill": {"max_num_batched_tokens": 512, "env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}},
        "decode": {"engine_overrides": {"max_num_seqs": 32}, "max_num_batched_tokens": 256,
                   "env": {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_WAIT_POLICY": "PASSIVE"}},
    })
    kwargs = engine_kwargs(config, "decode", None)
    flags = flag_values(baseline_flags(config))
    assert flags.pop("--served-model-name") == ["m"]   # the served name, not the version's
    assert flags["--max-logprobs"] == ["5"]                                         # extra
    assert "--no-enable-prefix-caching" in flags and "--enforce-eager" not in flags
    assert flags["--max-num-seqs"] == ["32"]                                # decode override
    assert flags["--max-num-batched-tokens"] == ["256"] and "--enable-chunked-prefill" in flags
    # (256: the decode pool's step cap, not the prefill pool's 512)
    for name, value in kwargs.items():  # every engine argument, with its value
        if name in ("served_model_name", "disable_log_stats"):
            continue  # disable_log_stats=False is vLLM's default: a switch with no --no- form
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            assert (flag if value else "--no-" + flag[2:]) in flags
        else:
            assert flags[flag] == [str(value)]
    env = baseline_env(config)
    pool_env = engine_env(config, "decode", "127.0.0.1", 15600)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == pool_env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env          # the caller places the baseline
    assert baseline_env(config, cpu_bind="0,1")["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert not {"VLLM_NIXL_SIDE_CHANNEL_HOST", "UCX_TLS"} & env.keys()  # no KV transfer


def test_cli_flags_spell_engine_arguments_as_vllm_does():
    assert cli_flags({"kv_transfer_config": {"kv_role": "kv_both"}, "enforce_eager": True,
                      "disable_log_stats": False, "enable_prefix_caching": False}) == [
        "--kv-transfer-config", '{"kv_role": "kv_both"}', "--enforce-eager",
        "--no-enable-prefix-caching"]
    assert cli_flags({"served_model_name": ["a", "b"]}) == ["--served-model-name", "a", "b"]
    with pytest.raises(ValueError):
        cli_flags({"quantization": None})


def test_deployment_options_single_device_and_tensor_parallel():
    config = parse_config({**BASE, "decode": {"num_gpus": 1, "resources": {"decode_node": 1}}})
    single = pool_deployment_options(config.decode)
    assert single["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1,
                                           "resources": {"decode_node": 1}}
    tp4 = parse_config({**BASE, "prefill": {"num_gpus": 1, "tensor_parallel_size": 4,
                                            "resources": {"prefill_node": 0.25}}})
    options = pool_deployment_options(tp4.prefill)
    bundles = options["placement_group_bundles"]
    assert len(bundles) == 5 and bundles[1] == {"GPU": 1, "prefill_node": 0.25}
    assert options["placement_group_strategy"] == "STRICT_PACK"


def test_engine_stats_idle_only_when_nothing_held():
    stats = EngineStats(role="decode", engine_id="e")
    assert stats.is_idle
    stats.observe_scheduler(kv_cache_usage=0.01, num_running=0, num_waiting=0)
    assert not stats.is_idle
    stats.observe_scheduler(kv_cache_usage=0.0, num_running=0, num_waiting=0)
    stats.observe_iteration(computed=3, cached=2, transferred=96, generation_tokens=4,
                            finished=1)
    stats.observe_transfers(num_transfers=1, num_bytes=4096, failures=0)
    snapshot = stats.snapshot()
    assert snapshot["is_idle"] and snapshot["prompt_tokens_transferred"] == 96
    assert snapshot["kv_bytes_transferred"] == 4096 and snapshot["requests_finished"] == 1
