"""Which quantization settings a CPU engine can run on a given processor (pure).

vLLM's CPU build picks its kernels from the processor's instructions and fails deep inside
the engine's start where none fits; these are its rules (vLLM 0.32), checked first so that
pdserve refuses with a message naming the setting, the missing instructions and what to do
instead. ``cluster/engine/cpu_check.py`` applies them where the engine runs. The rules and
where in vLLM they come from: docs/design.md, "Quantization: checked where the engine runs,
measured through the service".
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_KV_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
FLOAT32_NAMES = frozenset({"float32", "float"})
# torch.cpu._is_avx512_supported(), which vLLM asks, wants all four.
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
_AMX = frozenset({"amx_tile"})
_AMX_FP8 = frozenset({"amx_tile", "amx_fp8"})
_X86 = frozenset({"x86_64", "amd64", "i686", "i386"})


@dataclass(frozen=True)
class Processor:
    """What a machine's processor offers: its architecture (``uname -m``) and its
    instruction-set flags as Linux names them in /proc/cpuinfo."""

    arch: str
    flags: frozenset[str]

    @property
    def x86(self) -> bool:
        return self.arch.lower() in _X86

    def has(self, flags: frozenset[str]) -> bool:
        return flags <= self.flags

    def describe(self) -> str:
        """The instructions that matter here, for messages ("x86_64: AVX2, no AVX-512")."""
        found = [name for name, flags in (("AVX2", frozenset({"avx2"})), ("AVX-512", _AVX512),
                                          ("AMX", _AMX), ("AMX-FP8", _AMX_FP8))
                 if self.has(flags)]
        return f"{self.arch}: {', '.join(found) if found else 'none of AVX2, AVX-512, AMX'}"


def cpuinfo_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor listed in /proc/cpuinfo's text (x86 names them
    ``flags``, ARM ``Features``); empty where neither line is there."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def kv_cache_refusal(kv_cache_dtype: str, head_size: int, cpu: Processor) -> str | None:
    """Why a CPU engine cannot keep its KV cache in ``kv_cache_dtype``, or None if it can."""
    if kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
        return None
    if head_size % 32:
        return (f"engine.kv_cache_dtype={kv_cache_dtype} needs a head size divisible by 32 "
                f"on CPU engines; this model's is {head_size}. Use kv_cache_dtype=auto")
    if cpu.x86 and (cpu.has(_AVX512) or cpu.has(_AMX)):
        return None
    return (f"engine.kv_cache_dtype={kv_cache_dtype} needs an x86 CPU with AVX-512 or AMX "
            f"on CPU engines; this one has {cpu.describe()}. Use kv_cache_dtype=auto here, "
            "or run the pools on machines that have them")


def quantization_refusal(method: str | None, cpu: Processor) -> str | None:
    """Why a CPU engine cannot run weights quantized by ``method`` (vLLM's name, from the
    config or the checkpoint), or None if it can (or vLLM decides: no rule is known)."""
    if method != "fp8" or (cpu.x86 and cpu.has(_AMX_FP8)):
        return None
    return (f"fp8 weights need AMX with AMX-FP8 on CPU engines; this CPU has "
            f"{cpu.describe()}. Use an int8 W8A8 checkpoint (compressed-tensors) instead")


def activation_dtype_refusal(method: str | None, dtype: str, cpu: Processor) -> str | None:
    """Why a CPU engine cannot compute weights quantized by ``method`` in ``dtype``
    (``engine.dtype``), or None if it can (or vLLM decides: no rule is known)."""
    if method != "compressed-tensors" or dtype not in FLOAT32_NAMES or not (
            cpu.x86 and cpu.has(_AMX)):
        return None
    return (f"int8 W8A8 weights with engine.dtype={dtype} cannot run on a CPU with AMX: "
            f"vLLM computes them there with its AMX kernel, which takes bfloat16 or "
            f"float16 activations only ({cpu.describe()}). Set engine.dtype: bfloat16")


def engine_refusals(*, kv_cache_dtype: str, head_size: int, quantization: str | None,
                    cpu: Processor, dtype: str = "auto") -> list[str]:
    """Every reason a CPU engine with these settings cannot start on ``cpu``."""
    reasons = (kv_cache_refusal(kv_cache_dtype, head_size, cpu),
               quantization_refusal(quantization, cpu),
               activation_dtype_refusal(quantization, dtype, cpu))
    return [reason for reason in reasons if reason is not None]


def checkpoint_quantization(hf_config: dict) -> str | None:
    """The quantization a checkpoint's ``config.json`` declares, in vLLM's names, with
    compressed-tensors checkpoints of 8-bit float weights called ``fp8`` (they need the
    same kernel)."""
    quantization = hf_config.get("quantization_config") or {}
    method = quantization.get("quant_method")
    if method != "compressed-tensors":
        return method
    groups = (quantization.get("config_groups") or {}).values()
    float8 = any((group.get("weights") or {}).get("type") == "float"
                 and (group.get("weights") or {}).get("num_bits") == 8 for group in groups)
    return "fp8" if float8 else method


def head_size(hf_config: dict) -> int:
    """Attention head size of a Hugging Face ``config.json``."""
    return hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]


FLOAT_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def kv_element_bytes(dtype: str, kv_cache_dtype: str, hf_config: dict) -> int:
    """Bytes per KV element of an engine with these ``engine.dtype`` and
    ``engine.kv_cache_dtype`` settings serving this ``config.json`` (``auto``: the
    checkpoint's own dtype)."""
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if dtype == "auto":
        dtype = hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32"
    return FLOAT_BYTES[dtype]


def kv_bytes_per_token(hf_config: dict, element_bytes: int) -> int:
    """Bytes of KV cache one token takes in a model of this ``config.json`` (keys and
    values, every layer), at ``element_bytes`` per element (1 for fp8, 4 for float32)."""
    return (2 * hf_config["num_hidden_layers"] * hf_config["num_key_value_heads"]
            * head_size(hf_config) * element_bytes)
