"""CPU core lists in vLLM's syntax, ``"0"``, ``"0,2"``, ``"4-7"`` (pure).

The pools' engines are bound to cores with ``VLLM_CPU_OMP_THREADS_BIND`` and a local
cluster's serving processes with ``ray.serving_cores``; both are written this way.
"""

from __future__ import annotations


def parse_cores(text: str) -> frozenset[int]:
    """The cores a list names; ``ValueError`` for anything else (``"1-"``, ``"a"``,
    ``"3-1"``)."""
    cores: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{text!r} is not a core list like '0', '0,2' or '4-7'")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"{text!r}: the range {part.strip()!r} runs backwards")
        cores.update(range(first, last + 1))
    return frozenset(cores)
