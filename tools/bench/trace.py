"""Trace replay (pure: parsing and seeded planning, no I/O): public request traces as
benchmark workloads.

A trace gives each request's arrival and its prompt and output lengths, never its text:
Azure's LLM inference traces (2023, CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``) and
Mooncake's (FAST'25, JSON lines: ``timestamp`` in ms, ``input_length``, ``output_length``
and ``hash_ids``, the prompt's 512-token blocks by content). ``read_trace`` parses either;
``window``, ``scale_time`` and ``scale_to_rate`` cut and pace a slice of it;
``fit_to_window`` makes it fit a model's context; ``plan_trace`` turns it into the
``PlannedRequest``\\ s tools/bench/runner.py sends, each prompt as token ids of exactly the
recorded length. Equal ``hash_ids`` become equal blocks of tokens, so the prefixes the
trace shares are shared on the wire, and nothing else is.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from tools.bench.workload import LONG_PROMPT_TOKENS, PlannedRequest

TraceFormat = Literal["azure", "mooncake", "auto"]
FitPolicy = Literal["clip", "skip"]

BLOCK_TOKENS = 512  # Mooncake's hash_ids each name a block of this many prompt tokens
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
# Azure's timestamps are to 100 ns: kept as integer ticks so no float rounds them.
TICKS_PER_S = 10**7
# A request without hash_ids starts with this many tokens that spell its index: no two
# such requests share even their first tokens, so no KV block is shared by accident.
HEADER_TOKENS = 4


@dataclass(frozen=True)
class TraceRequest:
    """One recorded request: when it came and how long its prompt and answer were."""

    arrival_s: float  # seconds after the trace's (or the slice's) first request
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # the prompt's blocks by content (Mooncake only)


@dataclass(frozen=True)
class FitReport:
    """What ``fit_to_window`` did: of ``total`` requests, how many it clipped and skipped,
    and the prompt tokens before and after."""

    total: int
    clipped: int
    skipped: int
    prompt_tokens_before: int
    prompt_tokens_after: int

    @property
    def kept(self) -> int:
        return self.total - self.skipped


# ---- parsing ---------------------------------------------------------------------------

def read_trace(lines: Iterable[str], fmt: TraceFormat = "auto") -> list[TraceRequest]:
    """Parse a trace's lines (``fmt`` "auto": sniffed from the first non-empty line),
    sorted by arrival (ties keep the file's order), arrivals relative to the first.

    Raises ValueError naming the line of a row that cannot be read."""
    rows = [(number, line.strip()) for number, line in enumerate(lines, start=1)
            if line.strip()]
    if not rows:
        return []
    if fmt == "auto":
        fmt = sniff_format(rows[0][1])
    if fmt == "azure":
        ticks = _azure_rows(rows)
    elif fmt == "mooncake":
        ticks = [_mooncake_row(number, line) for number, line in rows]
    else:
        raise ValueError(f"unknown trace format {fmt!r} (azure, mooncake or auto)")
    return _rebased(ticks)


def sniff_format(first_line: str) -> Literal["azure", "mooncake"]:
    """The format a trace's first non-empty line announces: a JSON object (Mooncake) or
    Azure's CSV header."""
    if first_line.lstrip().startswith("{"):
        return "mooncake"
    if first_line.split(",")[0].strip().upper() == "TIMESTAMP":
        return "azure"
    raise ValueError(f"cannot tell the trace's format from its first line {first_line!r}: "
                     "neither a JSON object (mooncake) nor a TIMESTAMP,... header (azure)")


# A parsed row: (arrival in ticks, prompt tokens, output tokens, hash ids).
_Row = tuple[int, int, int, tuple[int, ...]]


def _azure_rows(rows: list[tuple[int, str]]) -> list[_Row]:
    (header_number, header), *data = rows
    names = tuple(name.strip() for name in header.split(","))
    if names != AZURE_HEADER:
        raise ValueError(f"line {header_number}: expected the header "
                         f"{','.join(AZURE_HEADER)}, not {header!r}")
    return [_azure_row(number, line) for number, line in data]


def _azure_row(number: int, line: str) -> _Row:
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != 3:
        raise ValueError(f"line {number}: expected 3 fields "
                         f"({','.join(AZURE_HEADER)}), not {line!r}")
    try:
        ticks = _timestamp_ticks(fields[0])
        prompt, output = int(fields[1]), int(fields[2])
    except ValueError as error:
        raise ValueError(f"line {number}: {error} in {line!r}") from None
    return ticks, *_checked_lengths(number, prompt, output), ()


def _timestamp_ticks(text: str) -> int:
    """``2023-11-16 18:15:46.6805900`` as 100-ns ticks since 1970 (the zone does not
    matter: only differences are used)."""
    whole, _, fraction = text.partition(".")
    if len(fraction) > 7 or (fraction and not fraction.isdigit()):
        raise ValueError(f"bad fraction of a second {fraction!r}")
    seconds = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S") - datetime(1970, 1, 1)
    return (seconds.days * 86400 + seconds.seconds) * TICKS_PER_S + int(
        fraction.ljust(7, "0") or 0)


def _mooncake_row(number: int, line: str) -> _Row:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"line {number}: not JSON ({error.msg}): {line[:80]!r}") from None
    if not isinstance(row, dict) or any(key not in row for key in MOONCAKE_KEYS):
        raise ValueError(f"line {number}: expected an object with "
                         f"{', '.join(MOONCAKE_KEYS)}: {line[:80]!r}")
    timestamp, hash_ids = row["timestamp"], row.get("hash_ids", [])
    if not _is_number(timestamp) or timestamp < 0:
        raise ValueError(f"line {number}: timestamp must be ms >= 0, not {timestamp!r}")
    if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
        raise ValueError(f"line {number}: hash_ids must be a list of ints")
    prompt, output = row["input_length"], row["output_length"]
    if not (_is_int(prompt) and _is_int(output)):
        raise ValueError(f"line {number}: input_length and output_length must be ints")
    ticks = round(timestamp * TICKS_PER_S / 1000)
    return ticks, *_checked_lengths(number, prompt, output), tuple(hash_ids)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _checked_lengths(number: int, prompt: int, output: int) -> tuple[int, int]:
    if prompt < 1 or output < 0:
        raise ValueError(f"line {number}: a prompt of {prompt} tokens and an output of "
                         f"{output}: the prompt needs at least 1, the output at least 0")
    return prompt, output


def _rebased(rows: list[_Row]) -> list[TraceRequest]:
    rows = sorted(rows, key=lambda row: row[0])  # stable: ties keep the file's order
    first = rows[0][0]
    return [TraceRequest((ticks - first) / TICKS_PER_S, prompt, output, hash_ids)
            for ticks, prompt, output, hash_ids in rows]


# ---- slicing and pacing ----------------------------------------------------------------

def window(requests: Sequence[TraceRequest], start_s: float = 0.0,
           duration_s: float | None = None) -> list[TraceRequest]:
    """The requests arriving in ``[start_s, start_s + duration_s)`` (None: to the end),
    re-based so that the slice's first request arrives at 0 (a replay does not wait
    through the quiet before it)."""
    if start_s < 0 or (duration_s is not None and duration_s <= 0):
        raise ValueError(f"a window starts at >= 0 s and lasts > 0 s, not start {start_s}, "
                         f"duration {duration_s}")
    end = math.inf if duration_s is None else start_s + duration_s
    inside = [r for r in requests if start_s <= r.arrival_s < end]
    if not inside:
        return []
    first = min(r.arrival_s for r in inside)
    return [replace(r, arrival_s=r.arrival_s - first) for r in inside]


def mean_rate(requests: Sequence[TraceRequest]) -> float | None:
    """Requests per second over the slice: (n - 1) / (last arrival - first); None for
    fewer than two requests or ones that all arrive at once."""
    if len(requests) < 2:
        return None
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    return (len(requests) - 1) / span if span > 0 else None


def scale_time(requests: Sequence[TraceRequest], speedup: float) -> list[TraceRequest]:
    """The same requests played ``speedup`` times as fast (every arrival / speedup)."""
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, not {speedup}")
    return [replace(r, arrival_s=r.arrival_s / speedup) for r in requests]


def scale_to_rate(requests: Sequence[TraceRequest], rate: float) -> list[TraceRequest]:
    """The slice time-scaled so that its ``mean_rate`` is ``rate`` (its arrivals' shape
    kept); a slice of one request is returned unchanged."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, not {rate}")
    if len(requests) < 2:
        return list(requests)
    recorded = mean_rate(requests)
    if recorded is None:
        raise ValueError("every request of the slice arrives at once: it has no rate to scale")
    return scale_time(requests, rate / recorded)


# ---- fitting a model's context -----------------------------------------------------------

def fit_to_window(requests: Sequence[TraceRequest], max_model_len: int,
                  policy: FitPolicy = "clip",
                  block_tokens: int = BLOCK_TOKENS) -> tuple[list[TraceRequest], FitReport]:
    """Make every request fit ``max_model_len`` (prompt + output tokens <= it, an output
    counted as at least the 1 token ``plan_trace`` asks for).

    "skip" drops the requests that do not fit. "clip" shortens them: the prompt first,
    down to what leaves room for the whole output (the answer's length is what decode
    time is made of, so it is kept); an output of ``max_model_len`` or more is cut to
    ``max_model_len - 1`` behind a 1-token prompt. A clipped prompt keeps only the
    hash_ids blocks it still reaches."""
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be at least 2, not {max_model_len}")
    if policy not in ("clip", "skip"):
        raise ValueError(f"policy must be clip or skip, not {policy!r}")
    fitted: list[TraceRequest] = []
    clipped = skipped = 0
    for request in requests:
        if _fits(request, max_model_len):
            fitted.append(request)
        elif policy == "skip":
            skipped += 1
        else:
            fitted.append(clip(request, max_model_len, block_tokens))
            clipped += 1
    report = FitReport(len(requests), clipped, skipped,
                       sum(r.prompt_tokens for r in requests),
                       sum(r.prompt_tokens for r in fitted))
    return fitted, report


def _fits(request: TraceRequest, max_model_len: int) -> bool:
    # a recorded 0-token output is still asked for 1 (plan_trace): it must fit too
    return request.prompt_tokens + max(1, request.output_tokens) <= max_model_len


def clip(request: TraceRequest, max_model_len: int,
         block_tokens: int = BLOCK_TOKENS) -> TraceRequest:
    """``request`` shortened to fit ``max_model_len`` (``fit_to_window``'s "clip" rule)."""
    if _fits(request, max_model_len):
        return request
    output = min(request.output_tokens, max_model_len - 1)
    prompt = min(request.prompt_tokens, max_model_len - max(1, output))
    blocks = request.hash_ids[:-(-prompt // block_tokens)]
    return replace(request, prompt_tokens=prompt, output_tokens=output, hash_ids=blocks)


# ---- prompts as token ids ----------------------------------------------------------------

def usable_vocab(vocab_size: int, special_ids: Iterable[int]) -> list[int]:
    """Every token id below ``vocab_size`` but the special ones (BOS, EOS, padding...),
    which a prompt of plain content must not contain."""
    special = set(special_ids)
    return [token for token in range(vocab_size) if token not in special]


def prompt_token_ids(request: TraceRequest, index: int, vocab: Sequence[int],
                     seed: int | str, block_tokens: int = BLOCK_TOKENS,
                     blocks: dict[int, list[int]] | None = None) -> list[int]:
    """The prompt of ``request`` (the ``index``-th of its workload), exactly
    ``prompt_tokens`` ids drawn from ``vocab``.

    With hash_ids: the blocks those ids name, each the same ``block_tokens`` ids wherever
    the id recurs (seeded by ``seed`` and the id), cut to the prompt's length; tokens the
    blocks do not reach are the request's own. Without: tokens of the request's own, the
    first ``HEADER_TOKENS`` spelling ``index``, so no two requests share a first block.
    ``blocks`` (hash id to block) saves drawing a shared block twice."""
    if len(vocab) < 2:
        raise ValueError("the vocabulary needs at least 2 usable token ids")
    if request.hash_ids:
        tokens = _shared_blocks(request, vocab, seed, block_tokens, blocks)
        tail = random.Random(f"{seed}/tail/{index}")
    else:
        tokens = _header(index, vocab, seed)
        tail = random.Random(f"{seed}/request/{index}")
    missing = request.prompt_tokens - len(tokens)
    if missing > 0:
        tokens += tail.choices(vocab, k=missing)
    return tokens[:request.prompt_tokens]


def _shared_blocks(request: TraceRequest, vocab: Sequence[int], seed: int | str,
                   block_tokens: int, blocks: dict[int, list[int]] | None) -> list[int]:
    """The request's hash_ids blocks, concatenated (as many as its prompt reaches)."""
    cache = {} if blocks is None else blocks
    needed = request.hash_ids[:-(-request.prompt_tokens // block_tokens)]
    tokens: list[int] = []
    for hash_id in needed:
        if hash_id not in cache:
            cache[hash_id] = random.Random(f"{seed}/block/{hash_id}").choices(
                vocab, k=block_tokens)
        tokens += cache[hash_id]
    return tokens


def _header(index: int, vocab: Sequence[int], seed: int | str) -> list[int]:
    """``index`` written in base ``len(vocab)``, each digit shifted by a seeded offset:
    distinct for distinct indices (below ``len(vocab) ** HEADER_TOKENS``), and another
    seed's headers differ too."""
    base = len(vocab)
    if index >= base**HEADER_TOKENS:
        raise ValueError(f"request {index}: too many requests for distinct headers of "
                         f"{HEADER_TOKENS} tokens from {base} token ids")
    offsets = random.Random(f"{seed}/header").choices(range(base), k=HEADER_TOKENS)
    digits = [(index // base**place) % base for place in range(HEADER_TOKENS)]
    return [vocab[(digit + offset) % base] for digit, offset in zip(digits, offsets,
                                                                     strict=True)]


def plan_trace(requests: Sequence[TraceRequest], vocab: Sequence[int], seed: int | str,
               block_tokens: int = BLOCK_TOKENS) -> list[PlannedRequest]:
    """The trace as a workload: each request sent at its arrival, its prompt as token ids
    of exactly its length (``prompt_token_ids``), asking for its output length (at least
    one token)."""
    blocks: dict[int, list[int]] = {}
    planned = []
    for index, request in enumerate(requests):
        ids = prompt_token_ids(request, index, vocab, seed, block_tokens, blocks)
        planned.append(PlannedRequest(
            index, request.arrival_s, "", len(ids), max(1, request.output_tokens),
            "long" if len(ids) >= LONG_PROMPT_TOKENS else "short",
            prompt_token_ids=tuple(ids)))
    return planned
