"""What vLLM's bidirectional KV transfer (``bidirectional_kv_xfer``) could save a
conversation's next turn on pdserve, measured through the service before building it.

    .venv/bin/python scripts/multiturn_prefill.py --config ray_configs/levers.yaml

In turn 2 of a conversation, the prompt is turn 1's prompt, turn 1's answer and the new
message. The prefill engine holds turn 1's prompt in its prefix cache, but not the answer,
which the decode engine generated. Today it computes the answer's tokens again. With
bidirectional transfer it would pull their KV from the decode engine instead. The most
that can save is the time the prefill engine spends on those tokens. This script measures
that time as the difference between two turn-2 requests for each conversation:

- *cold*: turn 2 as it comes, with the answer's tokens computed on the prefill engine;
- *warm*: the same history with another new message, sent once the answer's blocks are in
  the prefill engine's prefix cache, which is what a pull would have put there.

It prints both TTFTs, the prompt tokens the prefill engine computed for each, and the KV
bytes a pull of the answer would move. Every request goes through the prefill pool
(threshold 0, as in levers.yaml). The decode engine holds the whole history in both
requests, through decode prefix affinity.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx

from cluster import processes
from cluster.bench.cli import REPO, _warm_up
from cluster.checkpoints import ensure_checkpoints
from cluster.config import load_config
from cluster.engine.cpu_support import kv_bytes_per_token
from cluster.tiny_training import held_out_prompts


def first_token_s(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> tuple:
    """Streamed greedy completion: (seconds to the first token, the answer's text)."""
    started, ttft, text = time.monotonic(), None, []
    with client.stream("POST", "/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ttft = ttft if ttft is not None else time.monotonic() - started
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return ttft, "".join(text)


def prefill_computed(client: httpx.Client) -> int:
    """Prompt tokens the prefill pool has computed so far, once both pools are idle."""
    deadline = time.monotonic() + 60
    while True:
        stats = client.get("/admin/stats").json()
        if all(pool["is_idle"] for pool in stats.values()) or time.monotonic() > deadline:
            return stats["prefill"]["prompt_tokens_computed"]
        time.sleep(0.2)


def conversation(client: httpx.Client, model: str, opening: str, answer_tokens: int) -> dict:
    _, answer = first_token_s(client, model, opening, answer_tokens)
    history = opening + answer
    before = prefill_computed(client)
    cold, _ = first_token_s(client, model, history + "\n# and then, first:", 8)
    middle = prefill_computed(client)
    warm, _ = first_token_s(client, model, history + "\n# and then, second:", 8)
    after = prefill_computed(client)
    return {"cold_ttft_s": cold, "warm_ttft_s": warm,
            "cold_prefill_tokens": middle - before, "warm_prefill_tokens": after - middle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "ray_configs/levers.yaml")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--opening-chars", type=int, default=2000)
    parser.add_argument("--answer-tokens", type=int, default=300)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results/multiturn.json")
    args = parser.parse_args()
    config = load_config(args.config)
    ensure_checkpoints(config)
    model = config.model.name
    source = json.loads((config.model.path / "config.json").read_text())
    float32 = 4
    server = processes.start_pdserve(args.config, config, args.out.parent / "logs", REPO,
                                     name="pdserve-multiturn")
    with processes.running(server) as running, httpx.Client(
            base_url=running.base_url, timeout=600) as client:
        _warm_up(running.base_url, model)
        turns = [conversation(client, model, opening, args.answer_tokens)
                 for opening in held_out_prompts(args.conversations, args.opening_chars)]
    summary = {key: statistics.median(turn[key] for turn in turns) for key in turns[0]}
    summary["answer_kv_bytes"] = args.answer_tokens * kv_bytes_per_token(source, float32)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"turns": turns, "median": summary}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
