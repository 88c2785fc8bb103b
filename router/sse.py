"""Server-sent events on the wire: what the router writes, how a client splits it (pure).

The SSE spec ends a line at CRLF, LF or CR and nowhere else. Many clients split more
eagerly: Python's ``str.splitlines`` (and so httpx's ``iter_lines``) also breaks at
U+0085, U+2028 and U+2029, which JSON leaves unescaped inside strings. A model emitting one
of them (a byte-level vocabulary does, now and then) would cut such a client's event in
two. The router therefore escapes them (``line_safe``), and our own clients split the way
the spec says (``sse_lines``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

# Line breaks to str.splitlines that JSON does not escape. The control characters it also
# splits at (U+000B, U+000C, U+001C..U+001E) are below U+0020, which JSON always escapes.
_UNESCAPED_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def line_safe(event: str) -> str:
    """``event`` (``data: <json>`` lines) with U+0085, U+2028 and U+2029 written as JSON
    escapes: the same JSON, one line to every client.

    They can only occur inside JSON strings (JSON's whitespace is space, tab, CR and LF),
    where the escape means the same character.
    """
    if event.isascii():  # nearly every event: one flag check
        return event
    for char, escape in _UNESCAPED_BREAKS.items():
        if char in event:
            event = event.replace(char, escape)
    return event


class SSELineSplitter:
    """Bytes in, lines out, split only where the SSE spec ends a line."""

    def __init__(self) -> None:
        self._partial = b""
        self._after_cr = False  # the last chunk ended in CR: a LF opening the next one ends
        #                         no second line (CRLF split across chunks)

    def feed(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes, without their line ends."""
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        # bytes.splitlines splits at exactly CRLF, LF and CR; CR and LF never occur inside
        # a multi-byte UTF-8 character, so each complete line decodes on its own.
        lines = (self._partial + chunk).splitlines(keepends=True)
        self._partial = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        return [line.rstrip(b"\r\n").decode() for line in lines]

    def rest(self) -> str | None:
        """What the stream left without a line end (a cut stream), if anything."""
        partial, self._partial = self._partial, b""
        return partial.decode(errors="replace") if partial else None


def sse_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of an SSE body read as ``chunks``; an unterminated last line too, so that
    a reader sees a stream cut mid-line."""
    splitter = SSELineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    rest = splitter.rest()
    if rest is not None:
        yield rest


async def sse_lines_async(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """``sse_lines`` for a body read asynchronously."""
    splitter = SSELineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    rest = splitter.rest()
    if rest is not None:
        yield rest
