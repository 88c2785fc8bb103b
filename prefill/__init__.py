"""The prefill pool: vLLM engines that compute prompts and hold their KV for decode."""
