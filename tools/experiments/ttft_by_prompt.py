"""Median TTFT of recorded `pdserve bench run` traces by prompt length (docs/planning.md,
validation 5: the disaggregated hop's cost, from one threshold's runs against another's):

    .venv/bin/python tools/experiments/ttft_by_prompt.py --bands 256,1024 RUN.json [RUN.json ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--bands", default="256,1024",
                        help="prompt-token bounds between the bands")
    args = parser.parse_args()
    bounds = [0, *(int(bound) for bound in args.bands.split(",")), None]
    print("| run | " + " | ".join(f"{low}-{high or ''} tokens" for low, high in
                                  itertools.pairwise(bounds)) + " |")
    print("|---|" + "---|" * (len(bounds) - 1))
    for path in args.runs:
        records = [r for r in json.loads(path.read_text())["records"]
                   if r.get("first_token_at") is not None]
        cells = []
        for low, high in itertools.pairwise(bounds):
            ttfts = [r["first_token_at"] - r["sent_at"] for r in records
                     if low <= r["prompt_tokens"] and (high is None or r["prompt_tokens"] < high)]
            cells.append(f"{statistics.median(ttfts) * 1000:.0f} ms (n={len(ttfts)})"
                         if ttfts else "none")
        print(f"| {path.parent.name}/{path.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
