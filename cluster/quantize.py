"""A quantized copy of a local checkpoint, made by the project (shell: torch,
transformers, compressed-tensors).

W8A8 int8 in compressed-tensors' own scheme and format (its ``W8A8`` preset,
``int-quantized``), which vLLM loads as ``quantization=compressed-tensors``: per-channel
symmetric weight scales from each channel's largest weight, dynamic per-token activations,
``lm_head`` in full precision. Written atomically, with a marker naming its source and
scheme, so a changed source makes a new copy. Why: docs/design.md, "Quantization: checked
where the engine runs, measured through the service".
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from cluster.config import QuantizeSpec
from cluster.tiny_model import replace_directory

MARKER_FILE = "pdserve-quantized.json"
# The source's files that say what it is: a change in any of them means new weights.
_SOURCE_IDENTITY_FILES = ("config.json", "model.safetensors")


def ensure_quantized(path: Path, spec: QuantizeSpec) -> Path:
    """Return ``path``, writing the quantized copy of ``spec.source`` there first if it is
    missing or was made from another source or scheme."""
    if _marker_at(path) == _marker(spec):
        return path
    if path.exists() and _marker_at(path) is None:
        raise FileExistsError(f"{path} holds a model pdserve did not quantize; remove "
                              "`quantize` or choose another path")
    quantize_w8a8(spec.source, path, _marker(spec))
    return path


def quantize_w8a8(source: Path, path: Path, marker: dict) -> None:
    """Write ``source``'s W8A8 int8 copy to ``path`` (atomically)."""
    import torch
    from compressed_tensors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    scheme = preset_name_to_scheme("W8A8", ["Linear"])
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(model, config)  # adds each layer's scale and zero point
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "quantization_scheme", None) is not None:
                _set_weight_qparams(module)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)  # int8 weights in place of the float ones
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        compressor.update_config(staging)  # config.json's quantization_config
        AutoTokenizer.from_pretrained(source).save_pretrained(staging)
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2))
        replace_directory(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _set_weight_qparams(module) -> None:
    """Per-output-channel scale (and zero point, 0 for a symmetric scheme) of a linear
    layer's weights, from each channel's extremes."""
    from compressed_tensors.quantization.utils import calculate_qparams

    weight = module.weight
    scale, zero_point = calculate_qparams(weight.amin(dim=1, keepdim=True),
                                          weight.amax(dim=1, keepdim=True),
                                          module.quantization_scheme.weights)
    module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
    module.weight_zero_point.copy_(zero_point.reshape(module.weight_zero_point.shape))


def _marker(spec: QuantizeSpec) -> dict:
    import hashlib

    digest = hashlib.sha256()
    for name in _SOURCE_IDENTITY_FILES:
        digest.update((spec.source / name).read_bytes())
    return {"source": str(spec.source), "source_sha256": digest.hexdigest(),
            "scheme": spec.scheme}


def _marker_at(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
