"""The next turn of a conversation through pdserve: what it costs on each path, and what
vLLM's bidirectional KV transfer (``bidirectional_kv_xfer``) could save it.

    T=router.disaggregation_threshold_tokens=256
    .venv/bin/python tools/experiments/multiturn_prefill.py --config ray_configs/levers.yaml \
        --variant all-prefill \
        --variant "whole-prompt:$T,router.routing.decode.cache_aware_path=false" \
        --variant "uncached:$T"

In turn 2 of a conversation, the prompt is turn 1's prompt, turn 1's answer and the new
message. The prefill engine holds turn 1's prompt in its prefix cache, but not the answer,
which the decode engine generated; the decode engine holds both. Each variant (a config
with a few settings overridden, as in ``pdserve bench variants``; the first is the
baseline of the ratios) serves the same conversations, and for each the script sends:

- *turn 2* as it comes: its TTFT, the prompt tokens each pool computed, and whether it
  went through the prefill pool. On the disaggregated path the prefill engine computes
  the answer's tokens again; with ``router.routing.decode.cache_aware_path`` (the default)
  and a threshold above the new message, turn 2 stays on the decode engine that holds the
  rest (docs/design.md, "The next turn stays on its decode engine");
- *turn 2 warm*: the same history with another new message, once the answer's blocks
  are in the prefill engine's prefix cache, which is what a bidirectional pull would have
  put there: the most that pull could save on the disaggregated path.

It prints the medians and ratios, and writes every turn's figures to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
import yaml

from cluster.checkpoints import ensure_checkpoints
from cluster.config import parse_config
from cluster.engine.cpu_support import kv_bytes_per_token
from cluster.tiny_training import held_out_prompts
from tools import processes
from tools.bench.defaults import REPO
from tools.bench.servers import warm_up, write_config
from tools.bench.variants import apply_overrides, parse_variant


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


def idle_stats(client: httpx.Client) -> dict:
    """Both pools' counters, once both pools are idle."""
    deadline = time.monotonic() + 60
    while True:
        stats = client.get("/admin/stats").json()
        if all(pool["is_idle"] for pool in stats.values()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def spent(before: dict, after: dict) -> dict:
    """What one request cost each pool."""
    return {"prefill_requests": after["prefill"]["requests_finished"]
            - before["prefill"]["requests_finished"],
            "prefill_tokens": after["prefill"]["prompt_tokens_computed"]
            - before["prefill"]["prompt_tokens_computed"],
            "decode_tokens": after["decode"]["prompt_tokens_computed"]
            - before["decode"]["prompt_tokens_computed"]}


def conversation(client: httpx.Client, model: str, opening: str, answer_tokens: int) -> dict:
    _, answer = first_token_s(client, model, opening, answer_tokens)
    history = opening + answer
    before = idle_stats(client)
    cold, _ = first_token_s(client, model, history + "\n# and then, first:", 8)
    middle = idle_stats(client)
    warm, _ = first_token_s(client, model, history + "\n# and then, second:", 8)
    after = idle_stats(client)
    turn2 = spent(before, middle)
    return {"ttft_s": cold, "warm_ttft_s": warm,
            **{key: value for key, value in turn2.items()},
            "warm_prefill_tokens": spent(middle, after)["prefill_tokens"]}


def run_variant(name: str, document: dict, args: argparse.Namespace) -> dict:
    """The conversations on one variant's cluster: every turn's figures and the medians."""
    config_path = write_config(document, args.out.parent / f"variant-{name}.yaml")
    config = parse_config(document, source=f"variant {name}")
    ensure_checkpoints(config)
    model = config.model.name
    server = processes.start_pdserve(config_path, config, args.out.parent / f"logs-{name}",
                                     REPO, name=f"pdserve-multiturn-{name}")
    with processes.running(server) as running, httpx.Client(
            base_url=running.base_url, timeout=600) as client:
        warm_up(running.base_url, model)
        turns = [conversation(client, model, opening, args.answer_tokens)
                 for opening in held_out_prompts(args.conversations, args.opening_chars)]
    median = {key: statistics.median(turn[key] for turn in turns) for key in turns[0]}
    source = json.loads((config.model.path / "config.json").read_text())
    median["answer_kv_bytes"] = args.answer_tokens * kv_bytes_per_token(source, FLOAT32)
    return {"turns": turns, "median": median}


FLOAT32 = 4


def table(results: dict[str, dict]) -> str:
    """Medians per variant, TTFT also as a ratio to the first variant's."""
    base = next(iter(results.values()))["median"]["ttft_s"]
    lines = ["| turn 2, median | " + " | ".join(results) + " |",
             "|---|" + "---|" * len(results)]
    rows = [("TTFT, ms", lambda m: f"{m['ttft_s'] * 1000:.0f}"),
            ("TTFT vs first", lambda m: f"{m['ttft_s'] / base:.2f}x"),
            ("through the prefill pool", lambda m: f"{m['prefill_requests']:.0f}"),
            ("prompt tokens computed on prefill", lambda m: f"{m['prefill_tokens']:.0f}"),
            ("prompt tokens computed on decode", lambda m: f"{m['decode_tokens']:.0f}"),
            ("warm TTFT (answer's KV on prefill), ms",
             lambda m: f"{m['warm_ttft_s'] * 1000:.0f}")]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r["median"]) for r in results.values())
                     + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "ray_configs/levers.yaml")
    parser.add_argument("--variant", action="append", default=[],
                        help="name[:key.path=value,...]; the first is the baseline "
                        "(default: the config as it is)")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--opening-chars", type=int, default=2000)
    parser.add_argument("--answer-tokens", type=int, default=300)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results/multiturn.json")
    args = parser.parse_args()
    base = yaml.safe_load(args.config.read_text())
    results = {}
    for variant in map(parse_variant, args.variant or ["config"]):
        results[variant.name] = run_variant(
            variant.name, apply_overrides(base, variant.overrides), args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
