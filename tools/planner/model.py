"""A model's size and cost per token, from its Hugging Face ``config.json`` (pure).

What the planner needs of a dense decoder-only transformer (Llama-style: grouped-query
attention, a gated MLP): parameters, the FLOPs a token costs in its matmuls and in
attention, and the bytes of its weights and of its KV cache per token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.engine.cpu_support import head_size, kv_bytes_per_token

# Bytes per element of the dtypes weights and KV caches are kept in.
DTYPE_BYTES = {"float32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    kv_elements_per_token: int      # keys and values, every layer

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """The shape of a ``config.json`` (``num_hidden_layers``, ``hidden_size``, ...)."""
        return cls(layers=config["num_hidden_layers"], hidden=config["hidden_size"],
                   heads=config["num_attention_heads"],
                   kv_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
                   head_dim=head_size(dict(config)), intermediate=config["intermediate_size"],
                   vocab=config["vocab_size"],
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                   kv_elements_per_token=kv_bytes_per_token(dict(config), 1))

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return attention + mlp + 2 * self.hidden   # two norms

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params + embeddings + self.hidden

    @property
    def matmul_params(self) -> int:
        """Parameters a token multiplies by: all but the embedding lookup (the output
        projection is a matmul, tied or not)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    def matmul_flops(self, tokens: int) -> float:
        """FLOPs of ``tokens`` tokens through every weight matrix (2 per multiply-add)."""
        return 2.0 * self.matmul_params * tokens

    def attention_flops(self, token_pairs: float) -> float:
        """FLOPs of attention over ``token_pairs`` (query, key) pairs: QK^T and AV, every
        layer and head."""
        return 4.0 * self.layers * self.heads * self.head_dim * token_pairs

    def weight_bytes(self, dtype: str) -> float:
        return self.params * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str) -> int:
        return self.kv_elements_per_token * DTYPE_BYTES[dtype]


def prefill_pairs(tokens: int, context: int = 0) -> float:
    """(query, key) pairs of causal attention when ``tokens`` new tokens follow ``context``
    tokens already in the cache."""
    return tokens * context + tokens * (tokens + 1) / 2


# Llama-3.1-70B's config.json (the reference scenario's model), so that `pdserve plan`
# answers without a download.
LLAMA_3_1_70B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072,
}
