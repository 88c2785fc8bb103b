"""Which quantization settings a CPU engine can run on which processor."""

import pytest

from cluster.engine.cpu_support import (
    Processor,
    activation_dtype_refusal,
    checkpoint_quantization,
    cpuinfo_flags,
    engine_refusals,
    head_size,
    kv_bytes_per_token,
    kv_cache_refusal,
    kv_element_bytes,
    quantization_refusal,
)

AVX2 = Processor("x86_64", frozenset({"sse4_2", "avx", "avx2", "fma"}))
AVX512 = Processor("x86_64", AVX2.flags | {"avx512f", "avx512bw", "avx512vl", "avx512dq"})
AVX512_PARTIAL = Processor("x86_64", AVX2.flags | {"avx512f"})  # torch wants all four
AMX = Processor("x86_64", AVX512.flags | {"amx_tile", "amx_int8", "amx_bf16"})
AMX_FP8 = Processor("x86_64", AMX.flags | {"amx_fp8"})
ARM = Processor("aarch64", frozenset({"fp", "asimd", "sve"}))


def test_cpuinfo_flags_are_read_from_x86_and_arm_listings():
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f\n\nflags : x"
    assert cpuinfo_flags(x86) == {"fpu", "avx2", "avx512f"}
    assert cpuinfo_flags("processor : 0\nFeatures\t: fp asimd\n") == {"fp", "asimd"}
    assert cpuinfo_flags("") == frozenset()


@pytest.mark.parametrize("cpu", [AVX512, AMX, AMX_FP8])
@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_runs_with_avx512_or_amx(cpu, dtype):
    assert kv_cache_refusal(dtype, 64, cpu) is None


@pytest.mark.parametrize("cpu", [AVX2, AVX512_PARTIAL, ARM])
def test_fp8_kv_cache_is_refused_without_them_and_says_what_to_do(cpu):
    reason = kv_cache_refusal("fp8", 64, cpu)
    assert "AVX-512 or AMX" in reason and "kv_cache_dtype=auto" in reason
    assert cpu.arch in reason  # names the machine it was checked on


def test_fp8_kv_cache_needs_a_head_size_divisible_by_32():
    assert "head size divisible by 32" in kv_cache_refusal("fp8", 48, AMX)
    assert kv_cache_refusal("auto", 48, AVX2) is None  # the full-precision cache runs anywhere


def test_fp8_weights_need_amx_fp8_int8_weights_do_not():
    for cpu in (AVX2, AVX512, AMX):
        assert "AMX-FP8" in quantization_refusal("fp8", cpu)
    assert quantization_refusal("fp8", AMX_FP8) is None
    for method in (None, "compressed-tensors", "awq"):
        assert quantization_refusal(method, AVX2) is None


def test_int8_weights_on_amx_need_16_bit_activations():
    # vLLM 0.32 runs them with its AMX kernel there, which fails on float32 activations
    for dtype in ("float32", "float"):
        reason = activation_dtype_refusal("compressed-tensors", dtype, AMX)
        assert "engine.dtype: bfloat16" in reason and "AMX" in reason
    for dtype in ("bfloat16", "float16", "auto"):
        assert activation_dtype_refusal("compressed-tensors", dtype, AMX) is None
    for cpu in (AVX2, AVX512):  # oneDNN's kernel takes float32
        assert activation_dtype_refusal("compressed-tensors", "float32", cpu) is None
    assert activation_dtype_refusal(None, "float32", AMX) is None


def test_engine_refusals_lists_every_reason():
    reasons = engine_refusals(kv_cache_dtype="fp8", head_size=64, quantization="fp8", cpu=AVX2)
    assert len(reasons) == 2
    assert engine_refusals(kv_cache_dtype="fp8", head_size=64,
                           quantization="compressed-tensors", cpu=AVX512) == []


def test_a_checkpoints_quantization_is_read_from_its_config():
    int8 = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"type": "int", "num_bits": 8}}}}
    float8 = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"type": "float", "num_bits": 8}}}}
    assert checkpoint_quantization({"quantization_config": int8}) == "compressed-tensors"
    assert checkpoint_quantization({"quantization_config": float8}) == "fp8"
    assert checkpoint_quantization({"quantization_config": {"quant_method": "awq"}}) == "awq"
    assert checkpoint_quantization({}) is None


def test_head_size_from_head_dim_or_hidden_size():
    assert head_size({"hidden_size": 128, "num_attention_heads": 4}) == 32
    assert head_size({"hidden_size": 128, "num_attention_heads": 4, "head_dim": 64}) == 64


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer():
    config = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 4}
    assert kv_bytes_per_token(config, 4) == 2 * 4 * 2 * 64 * 4
    assert kv_bytes_per_token({**config, "head_dim": 32}, 1) == 2 * 4 * 2 * 32


def test_a_kv_element_is_the_cache_dtype_or_the_engines_or_the_checkpoints():
    assert kv_element_bytes("float32", "fp8", {}) == 1
    assert kv_element_bytes("float32", "auto", {"torch_dtype": "bfloat16"}) == 4
    assert kv_element_bytes("auto", "auto", {"torch_dtype": "bfloat16"}) == 2
    assert kv_element_bytes("auto", "auto", {}) == 4
