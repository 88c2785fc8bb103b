"""The poison catalogue: requests that are refused, each with its status and error, and
that once killed, stalled or answered 500 from an engine (or could have). The main
suite sends each to one replica per pool (test_serving.py: every engine the same after
each); the fault suite sends all of them to two replicas per pool and watches every
engine for a minute and more (test_faults.py)."""

from __future__ import annotations

# pdserve's own refusals: (code, param) of its error; vLLM's: None (its shape, its status,
# compared with vLLM's own server in test_openai_parity).
VLLM = None


def bad_requests(model: str) -> list[tuple]:
    """(path, raw body, status, pdserve's (code, param) or VLLM) for each bad request of
    ``model``; the statuses hold for any config whose context, admission budget and body
    limit are below these requests' (max_model_len under 9,000, a budget under 24,000)."""
    return [
        # (path, raw body, status, pdserve's (code, param) or VLLM)
        ("/v1/completions", b'{"model": "tiny-llama", "prompt": ', 400, VLLM),
        ("/v1/chat/completions", b"not json at all", 400, VLLM),
        ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, 400, VLLM),
        ("/v1/completions", {"model": model}, 400, VLLM),
        ("/v1/chat/completions", {"model": model}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "max_tokens": "ten"}, 400, VLLM),
        ("/v1/chat/completions", {"model": model, "messages": "hello"}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "max_tokens": 0}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "max_tokens": -1}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x" * 9000}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": [5, 1_000_000]}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "use_beam_search": True}, 400,
         ("unsupported_parameter", "use_beam_search")),
        # The KV connector's handshake is the engines' own: a client's never reaches one (it
        # answered 500 from the decode replica before: a string where the connector wants a dict).
        ("/v1/completions", {"model": model, "prompt": "x", "n": 2,
                             "vllm_xargs": {"kv_transfer_params": "x"}}, 400,
         ("unsupported_parameter", "vllm_xargs.kv_transfer_params")),
        ("/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": "x"}],
          "vllm_xargs": {"kv_transfer_params": {"do_remote_prefill": True}}},
         400, ("unsupported_parameter", "vllm_xargs.kv_transfer_params")),
        # A bounded n (router.limits.max_n), and a cost the whole admission budget could never
        # run beside anything else (20,000 tokens in pdserve-test.yaml): refused, never admitted.
        ("/v1/completions", {"model": model, "prompt": "x", "n": 4096, "max_tokens": 2000}, 400,
         ("invalid_value", "n")),
        ("/v1/completions", {"model": model, "prompt": "x", "n": 8, "max_tokens": 3000}, 400,
         ("invalid_value", "max_tokens")),
        ("/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
         404, (404, "model")),
        ("/v1/embeddings", {"model": model, "input": "x"}, 404, ("not_found", None)),
        # Hostile input: refused before a tokenizer or an engine sees it (router/limits.py).
        ("/v1/completions", {"model": model, "prompt": "a\ud800"}, 400,
         ("invalid_value", "prompt")),
        ("/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": "\udc00"}]}, 400,
         ("invalid_value", "messages[0].content")),
        ("/tokenize", {"model": model, "prompt": "\ud800"}, 400, ("invalid_value", "prompt")),
        ("/v1/completions", {"model": model, "prompt": "x", "stop": ""}, 400,
         ("invalid_value", "stop")),
        ("/v1/completions", {"model": model, "prompt": "x", "stop": ["ok", ""]}, 400,
         ("invalid_value", "stop")),
        ("/v1/completions", {"model": model, "prompt": "x", "stop": "s" * 300}, 400,
         ("invalid_value", "stop")),
        ("/v1/completions", {"model": model, "prompt": "x", "user": "u" * 300}, 400,
         ("invalid_value", "user")),
        ("/v1/completions", {"model": model, "prompt": "x", "seed": 2**64}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x" * (3 << 20)}, 413,
         ("request_too_large", None)),
        # What the engines' own input checks refuse, refused by the router before an engine
        # holds the request (router/vllm_frontend.py): once refused by an engine, such a
        # request left its stall clock running, and a healthy engine was killed a minute later.
        ("/v1/completions", {"model": model, "prompt": "x", "allowed_token_ids": [999_999]}, 400,
         VLLM),
        ("/v1/completions", {"model": model, "prompt": "long " * 60, "logit_bias": {"999999": 5}},
         400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "logprobs": 100_000}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "max_tokens": 10**9}, 400, VLLM),
        ("/v1/completions", {"model": model, "prompt": "x", "structured_outputs": {"regex": "("}},
         400, VLLM),
        ("/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema",
                              "json_schema": {"name": "s", "schema": {"type": "nope"}}}},
         400, VLLM),
    ]


def odd_but_valid(model: str) -> list[dict]:
    """Completion bodies at the edges of what is allowed, each answered 200: seeded
    sampling (the CPU engine's seeded path), with stop strings and output penalties, on a
    short prompt (decode-local) and a long one (disaggregated); a ``user`` that tries to
    land in another user's queue; n at a size the budget runs; structured output."""
    seeded = {"temperature": 1.0, "seed": 5, "stop": ["w1", "zz"], "presence_penalty": 1.5,
              "frequency_penalty": 1.0, "max_tokens": 16}
    return [
        {"model": model, "prompt": "seeded short", **seeded},
        {"model": model, "prompt": " ".join(f"s{i}" for i in range(300)), **seeded},
        {"model": model, "prompt": "x", "user": "someone\u0000long", "max_tokens": 4},
        {"model": model, "prompt": "x", "n": 8, "max_tokens": 8, "temperature": 1.0},
        {"model": model, "prompt": "x", "structured_outputs": {"regex": "[ab]{3}"},
         "max_tokens": 8},
    ]
