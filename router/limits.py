"""Limits on what a request may be, checked before any tokenizer or engine sees it (pure).

vLLM's request models check each field's meaning; these check what would make the router or
an engine pay for a hostile body: its size (refused from ``Content-Length`` before it is
read, else while it streams in), strings no tokenizer can encode (a lone UTF-16 surrogate
is valid JSON but not valid text), stop strings that are empty (the engine would refuse
them only after admission, as a server error) or long enough to be matched at every
decode step, an oversized ``user`` field (kept as a queue and sticky-version key), and
more answers (``n``) than the server allows one request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from router.errors import APIError, bad_request


def payload_too_large(limit_bytes: int) -> APIError:
    return APIError(413, f"The request body exceeds {limit_bytes} bytes.",
                    "invalid_request_error", None, "request_too_large")


def declared_length(content_length: str | bytes | None) -> int | None:
    """The body length a ``Content-Length`` value declares; None when it is missing or
    malformed (the reader then counts as it reads)."""
    if content_length is None:
        return None
    try:
        return int(content_length)
    except ValueError:
        return None


def check_declared_size(content_length: str | None, limit_bytes: int) -> None:
    """413 when the body's declared length is over ``limit_bytes`` (a missing or
    malformed ``Content-Length`` is left to the reader, which counts as it reads)."""
    declared = declared_length(content_length)
    if declared is not None and declared > limit_bytes:
        raise payload_too_large(limit_bytes)


def check_received_size(received_bytes: int, limit_bytes: int) -> None:
    """413 once a body read so far is over ``limit_bytes``."""
    if received_bytes > limit_bytes:
        raise payload_too_large(limit_bytes)


def check_body(data: Any, *, max_stop_chars: int, max_user_chars: int,
               max_n: int | None = None) -> None:
    """400, naming the field, for text no tokenizer can encode anywhere in ``data``, for
    empty or overlong stop strings, for an overlong ``user`` and for more than ``max_n``
    answers."""
    for path, text in _strings(data, ""):
        if _has_lone_surrogate(text):
            raise bad_request(f"'{path}' contains a lone UTF-16 surrogate, which is not "
                              "valid text", path, "invalid_value")
    if not isinstance(data, dict):
        return
    stop = data.get("stop")
    for text in [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []:
        if isinstance(text, str) and not text:
            raise bad_request("'stop' strings must not be empty", "stop", "invalid_value")
        if isinstance(text, str) and len(text) > max_stop_chars:
            raise bad_request(f"'stop' strings may be at most {max_stop_chars} characters",
                              "stop", "invalid_value")
    user = data.get("user")
    if isinstance(user, str) and len(user) > max_user_chars:
        raise bad_request(f"'user' may be at most {max_user_chars} characters", "user",
                          "invalid_value")
    n = data.get("n")
    if max_n is not None and isinstance(n, int) and not isinstance(n, bool) and n > max_n:
        raise bad_request(f"'n' may be at most {max_n} on this server", "n", "invalid_value")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in a parsed JSON value, keys included, with where it is."""
    # An explicit stack: the parser already bounded the depth, the walk must not recurse.
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where or "body", item
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{where}.{key}" if where else str(key)
                yield child_path, str(key)
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", child) for index, child in enumerate(item))


def _has_lone_surrogate(text: str) -> bool:
    # json.loads pairs "\ud83d\ude00" into one character; what is left is unpaired.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class PerKeyConcurrency:
    """At most ``limit`` calls of one client key at once (pure bookkeeping): what bounds
    the calls no admission budget covers, such as ``/tokenize``, which costs the router
    replica's CPU and would otherwise let one key's flood slow every key's requests."""

    def __init__(self, limit: int):
        self._limit = limit
        self._running: dict[str, int] = {}

    def enter(self, key: str) -> bool:
        """Count a call of ``key`` in; False (nothing counted) once ``key`` is at its limit."""
        running = self._running.get(key, 0)
        if running >= self._limit:
            return False
        self._running[key] = running + 1
        return True

    def leave(self, key: str) -> None:
        """A call ``enter`` let in has ended."""
        running = self._running[key] - 1
        if running:
            self._running[key] = running
        else:
            del self._running[key]  # a key with nothing running costs no memory
