"""The decode pool: vLLM engines that pull prompt KV over NIXL and stream tokens."""
