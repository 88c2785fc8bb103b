"""What the engines did during a benchmark run, from pdserve's engine counters (pure).

Each engine replica counts the prompt tokens whose KV it computed, found in its prefix
cache or pulled over NIXL (``pdserve_engine_prompt_tokens_total``), the tokens it
generated and, on the decode pool, the KV bytes it pulled. A benchmark scrapes them
before and after its run, summed over replicas; the difference is the run's work alone.
That is what the cost levers change: a prefix cache or the decode pool's prefix affinity
turns computed and pulled tokens into cached ones, a response cache removes requests.
"""

from __future__ import annotations

from collections import defaultdict

from cluster import metrics as m

# name -> value summed over replicas, e.g. "decode prompt tokens cached", "kv bytes pulled"
EngineWork = dict[str, float]

PROMPT_SOURCES = ("computed", "cached", "transferred")


def engine_work(families) -> EngineWork:
    """The engine counters out of ``prometheus_client``'s parsed families."""
    work: EngineWork = defaultdict(float)
    for family in families:
        for sample in family.samples:
            name = _work_of(sample)
            if name is not None:
                work[name] += sample.value
    return dict(work)


def _work_of(sample) -> str | None:
    """The work counter a sample adds to, or None for any other sample."""
    pool = sample.labels.get("pool")
    if sample.name == m.ENGINE_PROMPT_TOKENS.exported_name and pool:
        return f"{pool} prompt tokens {sample.labels.get('source')}"
    if sample.name == m.ENGINE_GENERATION_TOKENS.exported_name and pool:
        return f"{pool} generated tokens"
    if sample.name == m.KV_TRANSFER_BYTES.exported_name:
        return "kv bytes pulled"
    return None


def since(before: EngineWork, after: EngineWork) -> EngineWork:
    """The work done between two scrapes (counters only grow; a name new in ``after``
    started from zero)."""
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def decode_prompt_tokens(work: EngineWork) -> float:
    """Prompt tokens the decode engines took in, wherever their KV came from: every
    answered request's whole prompt, whichever path it took."""
    return sum(work.get(f"decode prompt tokens {source}", 0.0) for source in PROMPT_SOURCES)
