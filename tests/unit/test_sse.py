"""The SSE wire format: events stay one line to every client, and our clients split
lines where the spec does (router/sse.py)."""

from __future__ import annotations

import json

import pytest

from router.sse import SSELineSplitter, line_safe, sse_lines

# Every character str.splitlines breaks at, inside generated text.
AWKWARD_TEXT = "a\x0bb\x0cc\x1cd\x1de\x1ef\x85g\u2028h\u2029i\r\nj\nk\rl"


def test_an_event_with_any_line_break_character_stays_one_line_and_the_same_json():
    payload = {"choices": [{"text": AWKWARD_TEXT, "index": 0}]}
    event = f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
    assert len(event.rstrip("\n").splitlines()) > 1  # as vLLM writes it: cut by splitlines
    safe = line_safe(event)
    lines = safe.rstrip("\n").splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0][len("data: "):]) == payload
    assert safe.endswith("\n\n")


@pytest.mark.parametrize("event", ["data: [DONE]\n\n", 'data: {"text": "plain"}\n\n',
                                   'data: {"text": "caf\u00e9 \u4e2d"}\n\n'])
def test_events_without_such_characters_pass_unchanged(event):
    assert line_safe(event) == event


def _split(chunks: list[bytes]) -> list[str]:
    return list(sse_lines(chunks))


def test_lines_end_only_at_crlf_lf_or_cr():
    body = 'data: {"t": "x\u2028y\x85z"}\n\ndata: [DONE]\r\n\r\nlast\rend\n'
    assert _split([body.encode()]) == [
        'data: {"t": "x\u2028y\x85z"}', "", "data: [DONE]", "", "last", "end"]


def test_lines_and_characters_split_across_chunks_come_out_whole():
    body = 'data: {"t": "\u2028\u00e9"}\r\n\r\ndata: [DONE]\n\n'.encode()
    whole = _split([body])
    for size in (1, 2, 3, 5):
        assert _split([body[i:i + size] for i in range(0, len(body), size)]) == whole
    # CRLF torn between two chunks is one line end, not two
    assert _split([b"a\r", b"\nb\n"]) == ["a", "b"]
    assert _split([b"a\r", b"b\n"]) == ["a", "b"]


def test_a_stream_cut_mid_line_shows_its_last_piece():
    assert _split([b'data: {"t": 1}\n\ndata: {"t"']) == ['data: {"t": 1}', "", 'data: {"t"']
    splitter = SSELineSplitter()
    assert splitter.feed(b"data: x") == []
    assert splitter.rest() == "data: x" and splitter.rest() is None
