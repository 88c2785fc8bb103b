"""Trace replay (tools/bench/trace.py): public traces parsed, sliced, paced, fitted to a
model's context and planned as token-id prompts that share exactly the trace's prefixes.

The excerpts under ``data/traces/`` are the first 40 requests of each public trace (their
README gives the sources and licenses)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tools.bench import trace
from tools.bench.runner import _send
from tools.bench.stats import RequestRecord
from tools.bench.trace import TraceRequest
from tools.bench.workload import LONG_PROMPT_TOKENS, PlannedRequest

TRACES = Path(__file__).parent / "data" / "traces"
CONV = TRACES / "azure_llm_2023_conv.csv"
CODE = TRACES / "azure_llm_2023_code.csv"
MOONCAKE = TRACES / "mooncake_fast25_conversation.jsonl"
# A small vocabulary makes accidental collisions likely: the tests would see them.
VOCAB = list(range(3, 103))
BIG_VOCAB = list(range(3, 32000))


def read(path: Path, fmt: trace.TraceFormat = "auto") -> list[TraceRequest]:
    with path.open() as lines:
        return trace.read_trace(lines, fmt)


def common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


# ---- parsing ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", [CONV, CODE, MOONCAKE], ids=lambda p: p.stem)
def test_the_excerpts_parse_sorted_and_rebased_in_either_format(path):
    fmt = "mooncake" if path.suffix == ".jsonl" else "azure"
    requests = read(path)
    assert requests == read(path, fmt)  # auto sniffs the same format
    assert len(requests) == 40
    arrivals = [r.arrival_s for r in requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 0 for r in requests)
    assert all(bool(r.hash_ids) == (fmt == "mooncake") for r in requests)


def test_the_excerpts_values_are_the_files():
    conv, moon = read(CONV), read(MOONCAKE)
    # 18:15:46.6805900 then 18:15:50.9951690: 100-ns ticks, no float drift
    assert conv[:2] == [TraceRequest(0.0, 374, 44), TraceRequest(4.314579, 396, 109)]
    last = json.loads(MOONCAKE.read_text().splitlines()[-1])
    assert moon[-1] == TraceRequest(last["timestamp"] / 1000, last["input_length"],
                                    last["output_length"], tuple(last["hash_ids"]))


def test_inline_rows_are_sorted_by_arrival_ties_in_file_order_and_rebased():
    azure = ["TIMESTAMP,ContextTokens,GeneratedTokens",
             "2023-11-16 18:00:02.5,30,3",
             "",
             "2023-11-16 18:00:01.0000001,10,1",
             "2023-11-16 18:00:01.0000001,20,2",
             "2023-11-16 18:00:01,5,0"]
    assert trace.read_trace(azure, "auto") == [
        TraceRequest(0.0, 5, 0), TraceRequest(1e-7, 10, 1), TraceRequest(1e-7, 20, 2),
        TraceRequest(1.5, 30, 3)]
    mooncake = ['{"timestamp": 3500, "input_length": 700, "output_length": 5, '
                '"hash_ids": [4, 5]}',
                '{"timestamp": 1500, "input_length": 100, "output_length": 2, '
                '"hash_ids": [4]}']
    assert trace.read_trace(mooncake, "auto") == [TraceRequest(0.0, 100, 2, (4,)),
                                                  TraceRequest(2.0, 700, 5, (4, 5))]
    assert trace.read_trace([], "auto") == [] == trace.read_trace(["", " "], "azure")


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


@pytest.mark.parametrize(("lines", "fmt", "message"), [
    (["ts,in,out", "2023-11-16 18:00:01,5,1"], "azure", "header"),
    ([HEADER, "2023-11-16 18:00:01,5"], "azure", "line 2: expected 3 fields"),
    ([HEADER, "2023-11-16 18:00:01,five,1"], "azure", "line 2"),
    ([HEADER, "yesterday,5,1"], "azure", "line 2"),
    ([HEADER, "2023-11-16 18:00:01.12345678,5,1"], "azure", "fraction"),
    ([HEADER, "2023-11-16 18:00:01,0,1"], "azure", "at least 1"),
    ([HEADER, "2023-11-16 18:00:01,5,-1"], "azure", "at least 0"),
    (['{"timestamp": 0, "input_length": 5, "output_length": 1}', "{oops"], "mooncake",
     "line 2: not JSON"),
    (['{"timestamp": 0, "input_length": 5}'], "mooncake", "output_length"),
    (['{"timestamp": -1, "input_length": 5, "output_length": 1}'], "mooncake", "timestamp"),
    (['{"timestamp": 0, "input_length": "5", "output_length": 1}'], "mooncake", "ints"),
    (['{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "ab"}'],
     "mooncake", "hash_ids"),
    (['[1, 2, 3]'], "mooncake", "expected an object"),
    (["time,prompt,output"], "auto", "cannot tell"),
    ([HEADER], "csv", "unknown trace format"),
])
def test_a_bad_row_raises_a_value_error_naming_it(lines, fmt, message):
    with pytest.raises(ValueError, match=message):
        trace.read_trace(lines, fmt)


# ---- slicing and pacing ----------------------------------------------------------------

def arrivals(*times: float) -> list[TraceRequest]:
    return [TraceRequest(t, 10, 2) for t in times]


def test_a_window_keeps_its_half_open_interval_rebased_to_its_first_request():
    requests = arrivals(0, 1, 2.5, 3, 4, 5)
    assert [r.arrival_s for r in trace.window(requests, 2, 2)] == [0.0, 0.5]
    assert [r.arrival_s for r in trace.window(requests, 4)] == [0.0, 1.0]
    assert trace.window(requests) == requests
    assert trace.window(requests, 6, 1) == []
    for start, duration in ((-1, 1), (0, 0)):
        with pytest.raises(ValueError, match="window"):
            trace.window(requests, start, duration)


def test_speedup_divides_arrivals_and_multiplies_the_mean_rate():
    requests = arrivals(0, 1, 3, 8)
    assert trace.mean_rate(requests) == pytest.approx(3 / 8)
    faster = trace.scale_time(requests, 4)
    assert [r.arrival_s for r in faster] == [0, 0.25, 0.75, 2]
    assert trace.mean_rate(faster) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="speedup"):
        trace.scale_time(requests, 0)


def test_scaling_to_a_rate_gives_that_mean_rate_and_keeps_the_arrivals_shape():
    requests = read(CONV)
    for rate in (0.5, 2.0, 37.0):
        scaled = trace.scale_to_rate(requests, rate)
        assert trace.mean_rate(scaled) == pytest.approx(rate)
        ratio = scaled[-1].arrival_s / requests[-1].arrival_s
        assert all(s.arrival_s == pytest.approx(r.arrival_s * ratio)
                   for s, r in zip(scaled, requests, strict=True))
    one = arrivals(3)
    assert trace.scale_to_rate(one, 5) == one and trace.mean_rate(one) is None
    with pytest.raises(ValueError, match="at once"):
        trace.scale_to_rate(arrivals(0, 0, 0), 2)
    with pytest.raises(ValueError, match="rate"):
        trace.scale_to_rate(requests, -1)


# ---- fitting the context -----------------------------------------------------------------

@pytest.mark.parametrize("path", [CONV, CODE, MOONCAKE], ids=lambda p: p.stem)
@pytest.mark.parametrize("max_model_len", [1024, 4096])
def test_skip_and_clip_balance_and_what_is_kept_fits(path, max_model_len):
    requests = read(path)
    too_long = sum(r.prompt_tokens + max(1, r.output_tokens) > max_model_len
                   for r in requests)
    kept, skip = trace.fit_to_window(requests, max_model_len, "skip")
    assert skip.total == len(requests) == len(kept) + skip.skipped
    assert skip.skipped == too_long and skip.clipped == 0 and skip.kept == len(kept)
    clipped, clip = trace.fit_to_window(requests, max_model_len, "clip")
    assert (clip.total, clip.clipped, clip.skipped) == (len(requests), too_long, 0)
    assert len(clipped) == len(requests)
    for fitted in (kept, clipped):
        assert all(r.prompt_tokens + max(1, r.output_tokens) <= max_model_len
                   for r in fitted)
    assert clip.prompt_tokens_before == skip.prompt_tokens_before == sum(
        r.prompt_tokens for r in requests)
    assert clip.prompt_tokens_after == sum(r.prompt_tokens for r in clipped)
    assert skip.prompt_tokens_after == sum(r.prompt_tokens for r in kept)
    if too_long:
        assert clip.prompt_tokens_after < clip.prompt_tokens_before


def test_clip_shortens_the_prompt_first_and_the_output_only_when_it_alone_is_too_long():
    assert trace.clip(TraceRequest(1, 900, 100), 512) == TraceRequest(1, 412, 100)
    assert trace.clip(TraceRequest(1, 900, 600), 512) == TraceRequest(1, 1, 511)
    assert trace.clip(TraceRequest(1, 512, 0), 512) == TraceRequest(1, 511, 0)
    assert trace.clip(TraceRequest(1, 10, 5), 512) == TraceRequest(1, 10, 5)


def test_a_clipped_prompt_keeps_only_the_blocks_it_still_reaches():
    request = TraceRequest(0, 2000, 100, (7, 8, 9, 10))
    assert trace.clip(request, 1124).hash_ids == (7, 8)          # 1024 tokens: 2 blocks
    assert trace.clip(request, 1125).hash_ids == (7, 8, 9)       # 1025: into a third
    assert trace.clip(request, 130, block_tokens=16).hash_ids == (7, 8)


# ---- prompts as token ids ----------------------------------------------------------------

def test_usable_vocab_is_every_id_below_the_size_but_the_special_ones():
    assert trace.usable_vocab(6, [0, 2, 9]) == [1, 3, 4, 5]


def test_equal_hash_ids_give_equal_blocks_and_a_prefix_exactly_that_long():
    first = TraceRequest(0, 2000, 10, (1, 2, 3, 4))
    second = TraceRequest(1, 1800, 10, (1, 2, 3, 9))
    a = trace.prompt_token_ids(first, 0, VOCAB, seed=5)
    b = trace.prompt_token_ids(second, 1, VOCAB, seed=5)
    assert (len(a), len(b)) == (2000, 1800)
    assert common_prefix(a, b) == 3 * trace.BLOCK_TOKENS
    # a block is the same wherever its id recurs, at whatever position
    third = trace.prompt_token_ids(TraceRequest(2, 600, 1, (9, 1)), 2, VOCAB, seed=5)
    assert third[:264] == b[1536:]                 # block 9: the last 264 of b's
    assert third[512:] == a[:88]                   # then block 1, cut at 600 tokens


def test_a_prompt_longer_than_its_blocks_ends_with_tokens_of_its_own():
    request = TraceRequest(0, 1100, 1, (1, 2))
    a = trace.prompt_token_ids(request, 0, VOCAB, seed=5)
    b = trace.prompt_token_ids(request, 1, VOCAB, seed=5)
    assert len(a) == len(b) == 1100
    assert a[:1024] == b[:1024] and a[1024:] != b[1024:]


def test_the_mooncake_excerpt_shares_exactly_its_shared_blocks():
    requests = read(MOONCAKE)
    prompts = [list(p.prompt_token_ids) for p in trace.plan_trace(requests, BIG_VOCAB, 1)]
    for i, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
        for other, other_prompt in zip(requests[:i], prompts[:i], strict=True):
            blocks = common_prefix(list(request.hash_ids), list(other.hash_ids))
            expected = min(blocks * trace.BLOCK_TOKENS, len(prompt), len(other_prompt))
            assert common_prefix(prompt, other_prompt) == expected


def test_requests_without_hash_ids_share_not_even_their_first_tokens():
    requests = read(CONV) + read(CODE)
    planned = trace.plan_trace(requests, VOCAB, seed=3)
    firsts = {p.prompt_token_ids[:trace.HEADER_TOKENS] for p in planned}
    assert len(firsts) == len(planned)
    # another seed's headers differ too: a run does not find the last one's blocks
    again = trace.plan_trace(requests, VOCAB, seed=4)
    assert firsts.isdisjoint(p.prompt_token_ids[:trace.HEADER_TOKENS] for p in again)


@pytest.mark.parametrize("path", [CONV, MOONCAKE], ids=lambda p: p.stem)
def test_plans_are_exact_long_in_the_vocab_seeded_and_send_at_arrival(path):
    requests, _ = trace.fit_to_window(read(path), 8192, "clip")
    planned = trace.plan_trace(requests, VOCAB, seed=7)
    assert planned == trace.plan_trace(requests, VOCAB, seed=7)
    assert planned != trace.plan_trace(requests, VOCAB, seed=8)
    vocab = set(VOCAB)
    for index, (request, p) in enumerate(zip(requests, planned, strict=True)):
        assert (p.index, p.send_at, p.prompt, p.prefix_group) == (
            index, request.arrival_s, "", -1)
        assert len(p.prompt_token_ids) == p.prompt_tokens == request.prompt_tokens
        assert set(p.prompt_token_ids) <= vocab
        assert p.max_tokens == max(1, request.output_tokens)
        assert p.kind == ("long" if p.prompt_tokens >= LONG_PROMPT_TOKENS else "short")


def test_planning_refuses_a_vocabulary_too_small_to_tell_requests_apart():
    with pytest.raises(ValueError, match="vocabulary"):
        trace.plan_trace(arrivals(0), [5], seed=0)
    with pytest.raises(ValueError, match="distinct headers"):
        trace.prompt_token_ids(TraceRequest(0, 8, 1), 16, [1, 2], seed=0)


# ---- on the wire -------------------------------------------------------------------------

def test_the_runner_sends_token_ids_in_place_of_the_text_when_a_plan_has_them():
    bodies: list[dict] = []

    def server(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, text='data: {"choices": [{"text": "x"}]}\n\n'
                                        'data: [DONE]\n\n')

    async def send(planned: PlannedRequest) -> None:
        async with httpx.AsyncClient(base_url="http://test",
                                     transport=httpx.MockTransport(server)) as client:
            await _send(client, "m", planned, RequestRecord(0, "short", 3, sent_at=0.0),
                        0.0, planned.prompt)

    asyncio.run(send(PlannedRequest(0, 0.0, "", 3, 2, "short", prompt_token_ids=(5, 6, 7))))
    asyncio.run(send(PlannedRequest(1, 0.0, "hello", 1, 2, "short")))
    assert [body["prompt"] for body in bodies] == [[5, 6, 7], "hello"]
