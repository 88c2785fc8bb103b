"""The local tokenizer: byte-level (one token per UTF-8 byte) with a chat template."""

from cluster.tiny_model import EOS, _byte_level_tokenizer


def test_one_token_per_byte_and_lossless():
    tokenizer = _byte_level_tokenizer()
    for text in ["hello", "héllo wörld ✓", "tabs\tand\nnewlines", "  spaces  "]:
        ids = tokenizer.encode(text)
        assert ids == list(text.encode())
        assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 259


def test_chat_template_ends_turns_with_eos():
    tokenizer = _byte_level_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == f"<|user|>\nhi{EOS}\n<|assistant|>\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(tokenizer.eos_token_id) == 1


def test_changed_spec_regenerates_and_foreign_models_are_kept(tmp_path):
    import json

    from cluster.config import TinyModelSpec
    from cluster.tiny_model import MARKER_FILE, ensure_model

    path = tmp_path / "model"
    small = TinyModelSpec(hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64,
                          max_position_embeddings=256)
    ensure_model(path, small)
    config = json.loads((path / "config.json").read_text())
    assert config["max_position_embeddings"] == 256
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    ensure_model(path, small)  # same spec: kept as is
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    longer = small.model_copy(update={"max_position_embeddings": 512})
    ensure_model(path, longer)
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == 512
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # nothing left behind

    (path / MARKER_FILE).unlink()  # now it looks like someone else's model
    import pytest

    with pytest.raises(FileExistsError):
        ensure_model(path, small)
