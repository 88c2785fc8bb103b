"""Train the generated tiny model briefly on text every machine has (shell).

A few minutes on the running Python's standard-library sources (byte-level, like its
tokenizer), enough for prompt-lookup speculation to be accepted and for quantization to
cost measurable perplexity. Deterministic for a seed on one machine and torch version; one
file in ten, by a hash of its path, is held out. Why: docs/design.md, "A tiny model that
has learned something".
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cluster.config import TinyTrainingSpec

# Sources of tests and IDLE are skipped: large, repetitive, and not what people write.
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
HELD_OUT_ONE_IN = 10
TRAINING_THREADS = 2


@dataclass(frozen=True)
class Corpus:
    """The training and held-out text, and a digest that names the exact bytes."""

    train: bytes
    held_out: bytes
    files: int
    sha256: str


@dataclass(frozen=True)
class TrainingReport:
    """What a training run did, written beside the model as ``training.json``."""

    steps: int
    tokens_seen: int
    seconds: float
    first_loss: float
    final_loss: float
    held_out_loss_before: float
    held_out_loss_after: float
    corpus_files: int
    corpus_sha256: str

    @property
    def held_out_perplexity(self) -> float:
        return math.exp(self.held_out_loss_after)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "held_out_perplexity": round(self.held_out_perplexity, 3)}


def stdlib_corpus(root: Path | None = None) -> Corpus:
    """The standard library's ``.py`` files under ``root`` (default: this Python's), split
    into training and held-out text by a hash of each file's relative path."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    train, held_out, digest = [], [], hashlib.sha256()
    paths = sorted(p for p in root.rglob("*.py")
                   if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts))
    if not paths:  # some distributions ship the standard library compiled only
        raise FileNotFoundError(
            f"no Python sources under {root} to train the tiny model on; install this "
            "Python's standard-library sources or leave model.generate.train unset")
    for path in paths:
        relative = path.relative_to(root).as_posix()
        text = path.read_bytes()
        digest.update(relative.encode() + b"\0" + text)
        (held_out if is_held_out(relative) else train).append(text)
    return Corpus(b"".join(train), b"".join(held_out), len(paths), digest.hexdigest())


def held_out_prompts(count: int, length: int) -> list[str]:
    """``count`` prompts of ``length`` characters, spread over the held-out text: source
    the trained model never saw (the cost levers' measurements continue it)."""
    text = stdlib_corpus().held_out.decode("utf-8", "replace")
    step = len(text) // count
    return [text[i * step: i * step + length] for i in range(count)]


def is_held_out(relative_path: str) -> bool:
    """One file in ``HELD_OUT_ONE_IN``, chosen by its path: the same on every machine."""
    return hashlib.sha256(relative_path.encode()).digest()[0] % HELD_OUT_ONE_IN == 0


def train_model(model, spec: TinyTrainingSpec, seed: int, corpus: Corpus,
                log: Callable[[str], None] = print) -> TrainingReport:
    """Train ``model`` (a transformers causal LM over byte tokens) in place."""
    import torch

    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(TRAINING_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(model, spec, seed, corpus, log)
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_deterministic)


def _train(model, spec: TinyTrainingSpec, seed: int, corpus: Corpus,
           log: Callable[[str], None]) -> TrainingReport:
    import torch

    tokens = _as_tokens(corpus.train)
    held_out = _as_tokens(corpus.held_out)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate,
                                  weight_decay=0.01)
    held_out_before = held_out_loss(model, held_out, spec.seq_len)
    started = time.monotonic()
    losses: list[float] = []
    model.train()
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = spec.learning_rate * learning_rate_scale(step, spec.steps)
        batch = _batch(tokens, spec.batch_size, spec.seq_len, generator)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == spec.steps - 1:
            log(f"training the tiny model: step {step + 1}/{spec.steps}, loss "
                f"{losses[-1]:.3f} ({time.monotonic() - started:.0f} s)")
    model.eval()
    return TrainingReport(
        steps=spec.steps, tokens_seen=spec.steps * spec.batch_size * spec.seq_len,
        seconds=round(time.monotonic() - started, 1), first_loss=round(losses[0], 4),
        final_loss=round(sum(losses[-10:]) / len(losses[-10:]), 4),
        held_out_loss_before=round(held_out_before, 4),
        held_out_loss_after=round(held_out_loss(model, held_out, spec.seq_len), 4),
        corpus_files=corpus.files, corpus_sha256=corpus.sha256)


def learning_rate_scale(step: int, steps: int) -> float:
    """Linear warm-up over a tenth of the steps, then cosine down to a tenth of the peak."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def held_out_loss(model, tokens, seq_len: int, max_sequences: int = 32) -> float:
    """Mean next-byte cross-entropy (nats) over the first ``max_sequences`` windows of
    ``tokens``: the same windows before and after training."""
    import torch

    windows = min(max_sequences, len(tokens) // seq_len)
    if windows == 0:
        raise ValueError("held-out text is shorter than one training sequence")
    batch = tokens[: windows * seq_len].view(windows, seq_len)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=batch, labels=batch).loss.item()
    model.train(was_training)
    return loss


def _as_tokens(text: bytes):
    """Byte-level tokens: the tiny tokenizer's id of a byte is the byte."""
    import torch

    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def _batch(tokens, batch_size: int, seq_len: int, generator):
    import torch

    starts = torch.randint(0, len(tokens) - seq_len, (batch_size,), generator=generator)
    return torch.stack([tokens[start: start + seq_len] for start in starts.tolist()])
