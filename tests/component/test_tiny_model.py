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


def _trained_spec(steps: int = 40):
    from cluster.config import TinyModelSpec, TinyTrainingSpec

    return TinyModelSpec(hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64,
                         num_layers=1, max_position_embeddings=256, init_std=0.02,
                         train=TinyTrainingSpec(steps=steps, batch_size=4, seq_len=64))


def test_a_trained_model_learns_held_out_text_and_is_the_same_for_a_seed(tmp_path):
    """Training on the standard library lowers the loss on files it never saw, and two
    builds from one spec are byte-identical (the cost levers' figures are reproducible)."""
    import json

    from cluster.tiny_model import MARKER_FILE, TRAINING_FILE, ensure_model

    spec = _trained_spec()
    first, second = ensure_model(tmp_path / "a", spec), ensure_model(tmp_path / "b", spec)
    report = json.loads((first / TRAINING_FILE).read_text())
    assert report["steps"] == 40 and report["corpus_files"] > 100
    assert report["held_out_loss_after"] < report["held_out_loss_before"] - 1.0
    assert ((first / "model.safetensors").read_bytes()
            == (second / "model.safetensors").read_bytes())
    assert json.loads((first / MARKER_FILE).read_text())["train"]["steps"] == 40

    ensure_model(first, _trained_spec(steps=41))  # another training: regenerated
    assert json.loads((first / TRAINING_FILE).read_text())["steps"] == 41


def test_held_out_files_are_chosen_by_path_and_kept_out_of_training(tmp_path):
    from cluster.tiny_training import is_held_out, stdlib_corpus

    for index in range(40):
        (tmp_path / f"module_{index}.py").write_text(f"VALUE_{index} = {index}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_skipped.py").write_text("SKIPPED = 1\n")
    corpus = stdlib_corpus(tmp_path)
    held = [i for i in range(40) if is_held_out(f"module_{i}.py")]
    assert 0 < len(held) < 40 and corpus.files == 40
    for index in range(40):
        line = f"VALUE_{index} = {index}\n".encode()
        assert (line in corpus.held_out) == (index in held)
        assert (line in corpus.train) == (index not in held)
    assert b"SKIPPED" not in corpus.train + corpus.held_out

    import pytest

    with pytest.raises(FileNotFoundError, match="no Python sources"):
        stdlib_corpus(tmp_path / "tests" / "nowhere")
