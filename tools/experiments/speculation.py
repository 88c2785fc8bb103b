"""What n-gram speculative decoding (``decode.speculative``) buys a decode engine, on the
trained tiny model, at a low and a high batch: acceptance, ITL, tokens/s and CPU-seconds
per 1M tokens, and whether greedy answers stay the same.

    .venv/bin/python tools/experiments/speculation.py --config ray_configs/levers.yaml

vLLM's own server with the decode pool's engine settings, bound to the decode pool's
core, is started twice, without and with the speculation of ``--speculative`` (JSON, the
config's ``decode.speculative``); each time it continues held-out standard-library files
(the model never saw them; code repeats its own names, which prompt lookup drafts from),
first one request at a time, then ``--batch`` at once. The pdserve path itself (prefill →
NIXL → a speculating decode engine) is checked token for token by
tests/integration/test_equivalence.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from cluster.config import SpeculativeConfig, load_config
from cluster.tiny_training import held_out_prompts
from tools import processes
from tools.bench.cpu import descendants, sample_processes
from tools.bench.defaults import COMPARE_REFERENCE_PORT, REPO
from tools.bench.servers import warm_up


async def stream(client, model: str, prompt: str, max_tokens: int) -> dict:
    """One greedy streamed completion: its text, and the time of each chunk."""
    started, times, text = time.monotonic(), [], []
    async with client.stream("POST", "/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.monotonic() - started)
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return {"text": "".join(text), "ttft": times[0], "e2e": times[-1]}


async def run_level(base_url: str, model: str, texts: list[str], concurrency: int,
                    max_tokens: int) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        started = time.monotonic()
        answers: list[dict] = []
        for first in range(0, len(texts), concurrency):
            answers += await asyncio.gather(*(stream(client, model, t, max_tokens)
                                              for t in texts[first: first + concurrency]))
        wall = time.monotonic() - started
    per_token = sorted((a["e2e"] - a["ttft"]) / (max_tokens - 1) for a in answers)
    return {"texts": [a["text"] for a in answers], "wall_s": wall,
            "tokens_per_s": len(answers) * max_tokens / wall,
            "time_per_output_token_ms_median": 1000 * per_token[len(per_token) // 2]}


def spec_counts(base_url: str) -> dict[str, float]:
    import httpx

    counts = {}
    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        for name in ("num_draft_tokens", "num_accepted_tokens"):
            if line.startswith(f"vllm:spec_decode_{name}_total"):
                counts[name] = float(line.rsplit(" ", 1)[1])
    return counts


def cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and its descendants (the server and its engine)."""
    sampled = sample_processes()
    return sum(sampled[p].cpu_s for p in descendants(pid, sampled) | {pid} if p in sampled)


def measure(config, speculative: SpeculativeConfig | None, args) -> dict:
    pool = config.decode.model_copy(update={"speculative": speculative})
    served = config.model_copy(update={"decode": pool})
    name = "spec" if speculative else "plain"
    server = processes.start_vllm_server(
        served, COMPARE_REFERENCE_PORT, args.out / "logs", REPO, name=f"vllm-{name}",
        cpu_bind=config.decode.env.get("VLLM_CPU_OMP_THREADS_BIND"))
    results = {}
    with processes.running(server) as running:
        warm_up(running.base_url, config.model.name)
        for level, (count, concurrency) in {"one at a time": (args.requests, 1),
                                            f"{args.batch} at once": (args.batch,
                                                                      args.batch)}.items():
            before_counts, before_cpu = spec_counts(running.base_url), cpu_seconds(
                server.process.pid)
            result = asyncio.run(run_level(running.base_url, config.model.name,
                                           held_out_prompts(count, args.prompt_chars),
                                           concurrency, args.max_tokens))
            after_counts = spec_counts(running.base_url)
            tokens = count * args.max_tokens
            result["cpu_s_per_1m_tokens"] = (
                (cpu_seconds(server.process.pid) - before_cpu) / tokens * 1e6)
            drafted = after_counts.get("num_draft_tokens", 0) - before_counts.get(
                "num_draft_tokens", 0)
            accepted = after_counts.get("num_accepted_tokens", 0) - before_counts.get(
                "num_accepted_tokens", 0)
            result["acceptance"] = accepted / drafted if drafted else None
            result["accepted_per_output_token"] = accepted / tokens
            results[level] = result
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("ray_configs/levers.yaml"))
    parser.add_argument("--speculative", default='{"method": "ngram"}',
                        help="decode.speculative as JSON")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-chars", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/speculation"))
    args = parser.parse_args()
    config = load_config(args.config)
    speculative = SpeculativeConfig(**json.loads(args.speculative))
    plain, spec = measure(config, None, args), measure(config, speculative, args)
    report = {"speculative": speculative.model_dump(), "machine_cpus": os.cpu_count(),
              "levels": {}}
    for level in plain:
        a, b = plain[level], spec[level]
        same = sum(x == y for x, y in zip(a["texts"], b["texts"], strict=True))
        report["levels"][level] = {
            "greedy_answers_identical": f"{same}/{len(a['texts'])}",
            "acceptance": b["acceptance"],
            "tokens_per_s": [round(a["tokens_per_s"], 1), round(b["tokens_per_s"], 1)],
            "tokens_per_s_ratio": round(b["tokens_per_s"] / a["tokens_per_s"], 2),
            "time_per_output_token_ms_median": [
                round(a["time_per_output_token_ms_median"], 2),
                round(b["time_per_output_token_ms_median"], 2)],
            "cpu_s_per_1m_tokens": [round(a["cpu_s_per_1m_tokens"]),
                                    round(b["cpu_s_per_1m_tokens"])],
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculation.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
