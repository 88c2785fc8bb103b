"""A tiny Llama-architecture model generated locally, for development and tests.

Random weights from a fixed seed, a byte-level tokenizer and a chat template: gibberish
that vLLM serves exactly like a real checkpoint. With ``model.generate.train`` it is then
trained briefly (``cluster/tiny_training.py``). The directory is written atomically (a
temporary sibling, then renamed), so two processes racing to create it never see a
half-written model. Why: docs/design.md, "The tiny local model".
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from cluster.config import TinyModelSpec

# Special tokens come after the 256 byte tokens.
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
BOS, EOS, PAD = SPECIAL_TOKENS
# Reasoning delimiters as DeepSeek-R1 and Qwen3 write them: ordinary added tokens (they stay
# in the decoded text), so vLLM's reasoning parsers (e.g. deepseek_r1) work on this model.
THINK_TOKENS = ["<think>", "</think>"]

# Bumped when the generated files change for one spec, so that cached models regenerate.
GENERATOR_FORMAT = 2

# Roles are written as plain text, so the template adds only byte tokens plus EOS per turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "<|end_of_text|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

MARKER_FILE = "pdserve-tiny.json"
TRAINING_FILE = "training.json"  # a trained model's TrainingReport (cluster/tiny_training.py)


def _byte_level_tokenizer():
    """A byte-level BPE tokenizer with no merges: exactly one token per UTF-8 byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    # The GPT-2 byte-to-unicode map, sorted by byte value, so token id == byte value.
    byte_chars = sorted(byte_alphabet, key=_gpt2_char_to_byte)
    vocab = {char: byte for byte, char in enumerate(byte_chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    backend.add_tokens(THINK_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _gpt2_char_to_byte(char: str) -> int:
    """Inverse of GPT-2's bytes_to_unicode for one character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    code = ord(char)
    if code in printable:
        return code
    unprintable = [b for b in range(256) if b not in printable]
    return unprintable[code - 256]


def build_tiny_model(path: Path, spec: TinyModelSpec) -> None:
    """Write a tiny Llama + tokenizer to ``path`` (atomically): random weights, or
    trained for ``spec.train``'s steps (minutes)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _byte_level_tokenizer()
    config = LlamaConfig(
        # The reasoning tokens' rows are added after the seeded initialisation, so the
        # other weights are those the model had before it had them.
        vocab_size=len(tokenizer) - len(THINK_TOKENS),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        # With the usual 0.02, attention is near uniform and greedy output collapses into
        # one repeated byte; 0.2 gives varied, prompt-dependent output, so a test comparing
        # tokens would notice a wrong KV cache.
        initializer_range=spec.init_std,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    report = None
    if spec.train is None:
        _prefer_printable_output(model, tokenizer.eos_token_id)
    else:  # a trained model writes what it saw; a zeroed row would outscore learned ones
        from cluster.tiny_training import stdlib_corpus, train_model

        report = train_model(model, spec.train, spec.seed, stdlib_corpus())

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if report is not None:
            (staging / TRAINING_FILE).write_text(json.dumps(report.to_json(), indent=2))
        (staging / MARKER_FILE).write_text(json.dumps(_marker(spec), indent=2))
        replace_directory(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_directory(new: Path, path: Path) -> None:
    """Move ``new`` to ``path``, replacing an outdated model there; rename is atomic."""
    outdated = None
    if path.exists():
        outdated = path.with_name(f".{path.name}-outdated-{os.getpid()}")
        os.rename(path, outdated)
    try:
        os.rename(new, path)
    except OSError:
        if not is_complete(path):  # lost a race only if the winner finished
            raise
    finally:
        if outdated is not None:
            shutil.rmtree(outdated, ignore_errors=True)


def _prefer_printable_output(model, eos_token_id: int) -> None:
    """Zero the output rows of non-printable bytes, so greedy output is readable ASCII.

    A zero row gives a logit of exactly 0, while the max over ~95 random printable rows is
    positive for any realistic hidden state: greedy decoding then never picks a stray
    UTF-8 continuation byte, and the demo prints text instead of U+FFFD. EOS stays
    reachable so finish_reason "stop" still occurs.
    """
    import torch

    printable = set(range(32, 127)) | {ord("\n")}
    with torch.no_grad():
        for token_id in range(model.lm_head.weight.shape[0]):
            if token_id not in printable and token_id != eos_token_id:
                model.lm_head.weight[token_id].zero_()


def is_complete(path: Path) -> bool:
    """True when ``path`` holds a finished model (the marker is written last)."""
    return (path / MARKER_FILE).is_file() and (path / "config.json").is_file()


def _marker(spec: TinyModelSpec) -> dict:
    """What the marker file of a model generated from ``spec`` by this code says."""
    # Unset options are left out, so a random model generated before ``train`` existed
    # is still recognised (and not regenerated).
    return {**spec.model_dump(exclude_none=True), "generator_format": GENERATOR_FORMAT}


def _generated_spec(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def ensure_model(path: Path, spec: TinyModelSpec | None) -> Path:
    """Return ``path``, generating the tiny model there first if it is configured and missing.

    A directory this module generated from a different spec is regenerated: a changed
    ``model.generate`` must not silently keep serving the old model.
    """
    if spec is None:
        if path.is_dir() and (path / "config.json").is_file():
            return path
        raise FileNotFoundError(
            f"model directory {path} does not exist (set model.generate to build a tiny "
            "local model, or point model.path at a Hugging Face model directory)"
        )
    if is_complete(path) and _generated_spec(path) == _marker(spec):
        return path
    if path.exists() and not is_complete(path) and (path / "config.json").is_file():
        raise FileExistsError(
            f"{path} holds a model pdserve did not generate; remove model.generate or "
            "choose another model.path"
        )
    build_tiny_model(path, spec)
    return path
