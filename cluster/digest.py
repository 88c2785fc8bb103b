"""Short content digests (pure): the first 16 hex characters of a SHA-256.

Used where something must change when content changes (a config file, the engine's
sources, a router's module) and where a secret must be told apart without being kept
(an API key as an admission queue key). 64 bits: collisions are out of reach for these
uses, and the string stays short enough for deployment versions, labels and logs.
"""

from __future__ import annotations

import hashlib

DIGEST_CHARS = 16


def short_digest(data: bytes | str) -> str:
    """The first ``DIGEST_CHARS`` hex characters of the SHA-256 of ``data`` (str: UTF-8)."""
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS]
