"""Is greedy decoding batch-invariant on this engine? A response cache replays one answer
for every identical deterministic request, so it matters whether the engine would have
given the same tokens had the request shared its steps with others.

    .venv/bin/python tools/experiments/batch_invariance.py --config ray_configs/levers.yaml

Starts vLLM's own server with the decode pool's engine settings (the engine pdserve runs),
sends each of ``--probes`` greedy prompts alone, then each again inside a batch of
``--batch`` concurrent requests (``--rounds`` times), and prints how many answers in a
batch differ from the same prompt's answer alone and where the first differing character is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from cluster.config import load_config
from cluster.tiny_model import ensure_model
from cluster.tiny_training import held_out_prompts
from tools import processes
from tools.bench.defaults import COMPARE_REFERENCE_PORT, REPO
from tools.bench.servers import warm_up


def first_difference(a: str, b: str) -> int:
    """The index of the first character where ``a`` and ``b`` differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


async def complete(client, model: str, prompt: str, max_tokens: int) -> str:
    response = await client.post("/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


async def measure(base_url: str, model: str, args) -> dict:
    import httpx

    texts = held_out_prompts(args.batch, 240)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        alone = [await complete(client, model, texts[i], args.max_tokens)
                 for i in range(args.probes)]
        differing, first_differences = 0, []
        for _ in range(args.rounds):
            batched = await asyncio.gather(*(complete(client, model, t, args.max_tokens)
                                             for t in texts))
            for single, together in zip(alone, batched[:args.probes], strict=True):
                if single != together:
                    differing += 1
                    first_differences.append(first_difference(single, together))
    return {"probes": args.probes, "batch": args.batch, "rounds": args.rounds,
            "max_tokens": args.max_tokens, "answers_compared": args.probes * args.rounds,
            "answers_differing": differing, "first_difference_at_chars": first_differences,
            "sample": {"prompt": texts[0][-120:], "answer": alone[0]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("ray_configs/levers.yaml"))
    parser.add_argument("--probes", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench-results/batch-invariance"))
    args = parser.parse_args()
    config = load_config(args.config)
    ensure_model(config.model.path, config.model.generate)
    server = processes.start_vllm_server(config, COMPARE_REFERENCE_PORT, args.out / "logs",
                                         REPO, name="vllm-batch-invariance")
    with processes.running(server) as running:
        warm_up(running.base_url, config.model.name)
        result = asyncio.run(measure(running.base_url, config.model.name, args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch-invariance.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
