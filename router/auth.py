"""Optional API-key authentication (pure).

Keys come from the config (``router.auth.api_keys``) and from an environment variable
(``router.auth.api_keys_env``, comma-separated), so production keys need not sit in a
file. Only SHA-256 digests are kept, compared in constant time; a key is never logged,
never exported in a metric and never echoed in an error.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def accepted_digests(config_keys: Iterable[str], env_value: str | None) -> frozenset[bytes]:
    """Digests of every accepted key; empty means authentication is off."""
    keys = [k.strip() for k in config_keys]
    if env_value:
        keys += [k.strip() for k in env_value.split(",")]
    return frozenset(key_digest(k) for k in keys if k)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def is_authorized(authorization: str | None, digests: frozenset[bytes]) -> bool:
    """True when authentication is off or the header carries an accepted key."""
    if not digests:
        return True
    token = bearer_token(authorization)
    if token is None:
        return False
    digest = key_digest(token)
    # compare against every key, so the time taken does not tell which one nearly matched
    return sum(hmac.compare_digest(digest, accepted) for accepted in digests) == 1
