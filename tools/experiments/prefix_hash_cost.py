"""What the router's prefix hashing costs one request, with and without hashing each
prompt once (router/replica_choice/prefixes.py, ``ChainMemo``).

    .venv/bin/python tools/experiments/prefix_hash_cost.py

One disaggregated request's hashing, as the router does it: the prefill router ranks the
replicas and records where the prompt went (64 blocks), the decode pool's belief finds
the holder for the path choice, ranks the decode replicas, records the route (512
blocks), and records prompt and answer when the request finishes. Timed with every pass
hashing the prompt anew (the baseline) and with the memo, best of three, on prompts of
500 and 8,192 tokens with a 300-token answer; prints both and their ratio.
"""

from __future__ import annotations

import random
import timeit

from router import replica_choice as rc

BLOCK = 16  # the decode pool's max_blocks default is 512 of these: 8K tokens


class EveryPass(rc.ChainMemo):
    """The baseline: every reader hashes the prompt itself."""

    def chain(self, token_ids, block_size, max_blocks):
        return rc.prefix_block_hashes(token_ids, block_size, max_blocks)


def one_request(memo: type[rc.ChainMemo], prompt: tuple, answer: tuple) -> None:
    prefill = memo(16)
    belief = rc.DecodeCacheBelief(BLOCK, 512, 100_000)
    belief._chains = memo()
    prefill.chain(prompt, BLOCK, 64)        # the prefill router's ranking ...
    prefill.chain(prompt, BLOCK, 64)        # ... and its record
    belief.holder(prompt)                   # the path choice
    belief.match(prompt)                    # the decode router's ranking ...
    belief.routed("r", prompt, "a")         # ... and its record
    belief.finished("r", (*prompt, *answer), prompt if memo is rc.ChainMemo else ())


def main() -> None:
    rng = random.Random(0)
    answer = tuple(rng.randrange(32_000) for _ in range(300))
    for tokens, repeats in ((500, 2000), (8192, 100)):
        prompt = tuple(rng.randrange(32_000) for _ in range(tokens))
        timed = {memo: min(timeit.repeat(lambda m=memo, p=prompt: one_request(m, p, answer),
                                         number=repeats, repeat=3)) / repeats * 1000
                 for memo in (EveryPass, rc.ChainMemo)}
        base, memo = timed[EveryPass], timed[rc.ChainMemo]
        print(f"{tokens:>5}-token prompt, 300-token answer: every pass {base:.3f} ms, "
              f"hashed once {memo:.3f} ms ({memo / base:.2f}x)")


if __name__ == "__main__":
    main()
