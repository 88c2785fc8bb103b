"""Optional API-key authentication (pure).

Keys come from the config (``router.auth.api_keys``) and from an environment variable
(``router.auth.api_keys_env``, comma-separated), so production keys need not sit in a
file. Only SHA-256 digests are kept, compared in constant time; a key is never logged,
never exported in a metric and never echoed in an error.

Authentication fails closed: a key variable the config names must hold keys, or the router
does not start (a worker that lost its environment would otherwise serve everyone). Admin
endpoints, which show the cluster's internals, take admin keys (``router.auth.admin_keys``,
``admin_keys_env``), never a client's; an admin key is also a client key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from cluster.config import AuthConfig


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def configured_keys(auth: AuthConfig, environ: Mapping[str, str],
                    ) -> tuple[frozenset[bytes], frozenset[bytes]]:
    """Digests of the client keys (admin keys included; empty: authentication off) and of
    the admin keys; ``AuthMisconfigured`` when a named key variable holds none.

    Any key configured turns authentication on (``AuthConfig``): admin keys alone leave
    the API to admins rather than open to everyone."""
    clients = keys_from((key.get_secret_value() for key in auth.api_keys),
                        auth.api_keys_env, environ)
    admin = keys_from((key.get_secret_value() for key in auth.admin_keys),
                      auth.admin_keys_env, environ)
    return clients | admin, admin


class AuthMisconfigured(ValueError):
    """The config names a key variable that holds no key."""


def keys_from(config_keys: Iterable[str], env_name: str | None,
              environ: Mapping[str, str]) -> frozenset[bytes]:
    """Digests of the keys in the config and in the variable ``env_name`` names, which
    must then hold at least one key."""
    env_value = None
    if env_name is not None:
        env_value = environ.get(env_name, "")
        if not any(key.strip() for key in env_value.split(",")):
            state = "is empty" if env_name in environ else "is not set"
            raise AuthMisconfigured(
                f"the API-key variable {env_name} named by the config {state}: set it, or "
                "remove it from the config to run without those keys")
    return accepted_digests(config_keys, env_value)


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


def admin_access(authorization: str | None, admin: frozenset[bytes],
                 clients: frozenset[bytes]) -> int | None:
    """None when the request may use the admin endpoints, else the status to refuse it
    with: 401 without an accepted key, 403 for a client's key. With no key configured at
    all (a development cluster) they are open, like the rest of the API."""
    if not admin and not clients:
        return None
    if admin and is_authorized(authorization, admin):
        return None
    return 403 if clients and is_authorized(authorization, clients) else 401
