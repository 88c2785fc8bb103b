"""The model sections of the config: checkpoints, versions and how they are made (pure).

``model`` (one version in short) or ``versions`` (several, each with its own pools), and
what makes a missing checkpoint: a generated tiny model (optionally trained) or a
quantized copy of another. Pure: pydantic only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from cluster.config.engine import PoolConfig
from cluster.strict import StrictModel

# Version names become parts of deployment names and metric labels.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.]{0,31}$"


class TinyTrainingSpec(StrictModel):
    """A short training run for the generated model, so that it has learned something: the
    cost levers (speculative decoding's acceptance, quantization's quality delta) mean
    nothing on random weights (cluster/tiny_training.py)."""

    corpus: Literal["python-stdlib"] = Field(
        "python-stdlib", description="text every machine has: the running Python's standard "
        "library sources (one file in ten held out for evaluation)"
    )
    steps: int = Field(300, ge=1, description="optimizer steps (~1 s each for the bench "
                       "model on 2 cores)")
    batch_size: int = Field(16, ge=1)
    seq_len: int = Field(256, ge=8, description="tokens (bytes) per training sequence")
    learning_rate: float = Field(3e-3, gt=0, description="AdamW's peak, after a linear "
                                 "warm-up over a tenth of the steps, cosine to a tenth")


class TinyModelSpec(StrictModel):
    """How to generate the local development model when its directory does not exist yet."""

    seed: int = 0
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(256, gt=0)
    max_position_embeddings: int = Field(8192, gt=0)
    init_std: float = Field(0.2, gt=0, description="weight init std (initializer_range); "
                            "0.2 makes random weights' output varied, training wants ~0.02")
    train: TinyTrainingSpec | None = Field(
        None, description="train the generated model briefly on local text (None: random "
        "weights, generated in seconds)"
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self


def _from_start_directory(path: Path) -> Path:
    # Relative paths mean "from where pdserve was started"; every Ray worker must agree.
    return path.expanduser().absolute()


# A checkpoint directory on the machines that run the engines.
LocalPath = Annotated[Path, AfterValidator(_from_start_directory)]


class QuantizeSpec(StrictModel):
    """Make a version's checkpoint by quantizing another local checkpoint (cluster/quantize.py)."""

    source: LocalPath = Field(description="the full-precision checkpoint's directory (made first "
                         "if another version generates it)")
    scheme: Literal["W8A8"] = Field(
        "W8A8", description="int8 weights per output channel, int8 activations per token "
        "at run time (compressed-tensors' W8A8 preset; vLLM's CPU build runs it on any x86)")


class Checkpoint(StrictModel):
    """Where a model version's weights and tokenizer are."""

    path: LocalPath = Field(description="local Hugging Face model directory (weights + tokenizer)")
    generate: TinyModelSpec | None = Field(
        None, description="generate a tiny random model at `path` if it is missing (dev only)"
    )
    quantize: QuantizeSpec | None = Field(
        None, description="write a quantized copy of another checkpoint at `path` if it is "
        "missing or its source changed (dev and benchmarks)")
    tool_parser: str | None = Field(
        None, description="vLLM's tool-call parser for this model (e.g. hermes, llama3_json): "
        "requests with tools need one (tool_choice 'auto', 'required' or a named function; "
        "without a parser vLLM answers them 400)",
    )
    reasoning_parser: str | None = Field(
        None, description="vLLM's reasoning parser for this model (e.g. deepseek_r1, qwen3): "
        "chat answers carry the model's reasoning apart from its content, and structured "
        "outputs constrain only what follows the reasoning",
    )

    @model_validator(mode="after")
    def _one_maker(self) -> Checkpoint:
        if self.generate is not None and self.quantize is not None:
            raise ValueError("set `generate` or `quantize`, not both: a checkpoint is either "
                             "generated or made from another")
        return self


class ModelConfig(Checkpoint):
    """A single-version cluster in short: the served name and the one version behind it.

    ``model: {name, path, generate}`` is the same as ``versions: {<version>: {path,
    generate}}`` plus ``served_models: {<name>: {<version>: 100}}``. In a multi-version
    config it is derived: the first served name and its heaviest version (what the
    benchmark and the reference server use).
    """

    name: str = Field(min_length=1, description="served model name (the `model` field)")
    version: str = Field("v1", pattern=VERSION_PATTERN, description="the version's name")


class VersionConfig(Checkpoint):
    """One model version: its weights and, optionally, pools sized apart from the default."""

    prefill: PoolConfig | None = Field(None, description="this version's prefill pool")
    decode: PoolConfig | None = Field(None, description="this version's decode pool")
