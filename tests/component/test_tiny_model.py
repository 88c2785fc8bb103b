"""The local tokenizer: byte-level (one token per UTF-8 byte) with a chat template."""

from cluster.tiny_model import EOS, THINK_TOKENS, _byte_level_tokenizer


def test_one_token_per_byte_and_lossless():
    tokenizer = _byte_level_tokenizer()
    for text in ["hello", "héllo wörld ✓", "tabs\tand\nnewlines", "  spaces  "]:
        ids = tokenizer.encode(text)
        assert ids == list(text.encode())
        assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 261


def test_reasoning_delimiters_are_single_tokens_that_stay_in_the_text():
    tokenizer = _byte_level_tokenizer()
    text = "<think>hm</think>ok"
    ids = tokenizer.encode(text)
    assert ids == [259, *b"hm", 260, *b"ok"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # parsers see them
    assert tokenizer.convert_tokens_to_ids(THINK_TOKENS) == [259, 260]


def test_the_reasoning_tokens_leave_the_seeded_weights_as_they_were(tmp_path):
    """Adding the two tokens must not change the model every earlier test ran on."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from cluster.config import TinyModelSpec
    from cluster.tiny_model import build_tiny_model

    spec = TinyModelSpec(hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64,
                         max_position_embeddings=256, seed=3)
    build_tiny_model(tmp_path / "m", spec)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    torch.manual_seed(spec.seed)
    before = LlamaForCausalLM(LlamaConfig(
        vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        bos_token_id=256, eos_token_id=257, pad_token_id=258, tie_word_embeddings=False,
        initializer_range=spec.init_std))
    now, then = model.state_dict(), before.state_dict()
    assert now["model.embed_tokens.weight"].shape[0] == 261
    for name, weight in then.items():
        if name == "lm_head.weight":  # non-printable rows are zeroed; the printable kept
            assert torch.equal(now[name][32:127], weight[32:127])
            assert not now[name][259:].any()  # never chosen by greedy decoding
        else:
            assert torch.equal(now[name][:weight.shape[0]], weight), name


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

    marker = json.loads((path / MARKER_FILE).read_text())
    (path / MARKER_FILE).write_text(json.dumps({**marker, "generator_format": 1}))
    ensure_model(path, longer)  # made by an older generator: regenerated
    assert json.loads((path / MARKER_FILE).read_text()) == marker

    (path / MARKER_FILE).unlink()  # now it looks like someone else's model
    import pytest

    with pytest.raises(FileExistsError):
        ensure_model(path, small)
