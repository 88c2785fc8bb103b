"""Every configured checkpoint that pdserve makes itself, made where missing (shell):
generated tiny models first, then the quantized copies made from them."""

from __future__ import annotations

from pathlib import Path

from cluster.config import Checkpoint, PDServeConfig
from cluster.quantize import ensure_quantized
from cluster.tiny_model import ensure_model


def ensure_checkpoints(config: PDServeConfig) -> dict[str, Path]:
    """Each version's checkpoint directory, by version; ``FileNotFoundError`` for one that
    is missing and that pdserve does not make."""
    # a quantized copy's source may be another version's generated model
    ordered = sorted(config.versions.items(), key=lambda item: item[1].quantize is not None)
    return {name: ensure_checkpoint(version) for name, version in ordered}


def ensure_checkpoint(checkpoint: Checkpoint) -> Path:
    """``checkpoint.path``, made first if pdserve makes it and it is missing or outdated."""
    if checkpoint.quantize is not None:
        source = checkpoint.quantize.source
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"the checkpoint to quantize, {source}, does not exist")
        return ensure_quantized(checkpoint.path, checkpoint.quantize)
    return ensure_model(checkpoint.path, checkpoint.generate)
