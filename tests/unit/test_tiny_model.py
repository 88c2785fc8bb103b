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
