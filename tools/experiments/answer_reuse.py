"""How much of an answer the next turn of a conversation repeats token for token:

    .venv/bin/python tools/experiments/answer_reuse.py --base-url http://127.0.0.1:8300 \
        --model tiny-llama-256x4 --tokenizer .cache/models/tiny-llama-256x4-s0

A client sends a conversation's history back as text, and the server tokenizes it again.
The prompt's own tokens come back the same, but an answer's text need not tokenize to the
answer's tokens: where it first differs, the next turn's blocks stop matching the ones the
decode engine cached, and the rest of the history is computed (or pulled) again. This
sends the reference workload's prompts (greedy, ``--max-tokens`` each), tokenizes each
prompt with its answer's text as the next turn would, and prints the share of the answer
before the first difference: ``pdserve plan --answer-reuse`` and ``plan replay
--answer-reuse`` (docs/planning.md, validation 6).
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
from pathlib import Path

from transformers import AutoTokenizer

from tools.bench.workload import WorkloadSpec, plan


def first_difference(left: list[int], right: list[int]) -> int:
    """The first place where two token lists differ (the shorter one's length if none)."""
    return next((i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b),
                min(len(left), len(right)))


def answer(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True,
                       "return_token_ids": True}).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["choices"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8300")
    parser.add_argument("--model", default="tiny-llama-256x4")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=None, help="a JSON file of the reads")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    spec = WorkloadSpec(num_requests=args.prompts, seed=args.seed, prompt_salt="answer-reuse")
    shares = []
    for planned in plan(spec, count):
        choice = answer(args.base_url, args.model, planned.prompt, args.max_tokens)
        prompt_ids = tokenizer(planned.prompt).input_ids
        generated = choice["token_ids"]
        again = tokenizer(planned.prompt + choice["text"]).input_ids
        repeated = first_difference(again, prompt_ids + generated) - len(prompt_ids)
        shares.append(max(0, repeated) / len(generated))
    print(f"answer tokens repeated by the next turn, of {len(shares)} answers of "
          f"{args.max_tokens}: mean {statistics.mean(shares):.2f}, median "
          f"{statistics.median(shares):.2f}, min {min(shares):.2f}, max {max(shares):.2f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"shares": shares, "mean": statistics.mean(shares),
                                        "max_tokens": args.max_tokens}, indent=2))


if __name__ == "__main__":
    main()
