"""API-key authentication (pure)."""

from hypothesis import given
from hypothesis import strategies as st

from router.admission import client_key
from router.auth import accepted_digests, bearer_token, is_authorized
from router.errors import unauthorized


def test_off_without_keys():
    assert is_authorized(None, accepted_digests([], None))
    assert is_authorized("Bearer anything", accepted_digests([], ""))


def test_keys_from_config_and_env():
    digests = accepted_digests(["sk-config"], "sk-env-1, sk-env-2,")
    assert len(digests) == 3
    for key in ("sk-config", "sk-env-1", "sk-env-2"):
        assert is_authorized(f"Bearer {key}", digests)
        assert is_authorized(f"bearer {key}", digests)  # the scheme is case-insensitive
    assert not is_authorized(None, digests)
    assert not is_authorized("Bearer sk-wrong", digests)
    assert not is_authorized("Basic sk-config", digests)
    assert not is_authorized("Bearer ", digests)
    assert not is_authorized("sk-config", digests)


@given(st.text(min_size=1).filter(lambda k: k.strip() == k and "," not in k and k))
def test_any_key_is_accepted_and_a_changed_one_is_not(key):
    digests = accepted_digests([key], None)
    assert is_authorized(f"Bearer {key}", digests) == (bearer_token(f"Bearer {key}") == key)
    assert not is_authorized(f"Bearer {key}x", digests)


def test_admission_queues_a_request_under_the_key_it_was_authorised_with():
    # Admission used to take everything after "Bearer " verbatim, so an extra space gave
    # the same accepted key a second queue (and a second share of the admission budget).
    digests = accepted_digests(["k"], None)
    for header in ("Bearer k", "Bearer  k", "bearer k ", "BEARER \tk"):
        assert bearer_token(header) == "k" and is_authorized(header, digests)
        assert client_key(header, "alice") == client_key("Bearer k", None)
    for header in ("Bearer ", "Bearer   ", "Basic k", "k"):
        assert bearer_token(header) is None
        assert client_key(header, "alice") == "user:alice"


def test_the_error_never_echoes_the_key():
    error = unauthorized(has_key=True)
    assert error.status == 401 and error.code == "invalid_api_key"
    assert error.headers == {"WWW-Authenticate": "Bearer"}
    assert "sk-" not in str(error.body())


def test_a_named_key_variable_must_hold_a_key():
    import pytest

    from router.auth import AuthMisconfigured, keys_from

    assert keys_from(["sk-c"], "KEYS", {"KEYS": "sk-e"}) == accepted_digests(["sk-c"], "sk-e")
    assert keys_from([], None, {}) == frozenset()  # none named: off, as configured
    for environ, state in (({}, "is not set"), ({"KEYS": ""}, "is empty"),
                           ({"KEYS": " , "}, "is empty")):
        with pytest.raises(AuthMisconfigured, match=f"KEYS named by the config {state}"):
            keys_from(["sk-c"], "KEYS", environ)


def test_admin_keys_open_admin_and_the_api_client_keys_only_the_api():
    from cluster.config import AuthConfig
    from router.auth import admin_access, configured_keys

    auth = AuthConfig(api_keys=["sk-client"], admin_keys=["sk-admin"])
    clients, admin = configured_keys(auth, {})
    assert is_authorized("Bearer sk-admin", clients)  # an admin may call the API too
    assert admin_access("Bearer sk-admin", admin, clients) is None
    assert admin_access("Bearer sk-client", admin, clients) == 403
    assert admin_access("Bearer sk-wrong", admin, clients) == 401
    assert admin_access(None, admin, clients) == 401


def test_with_client_keys_and_no_admin_key_admin_is_closed():
    from cluster.config import AuthConfig
    from router.auth import admin_access, configured_keys

    clients, admin = configured_keys(AuthConfig(api_keys=["sk-client"]), {})
    assert admin_access("Bearer sk-client", admin, clients) == 403


def test_without_any_key_everything_is_open_and_admin_keys_alone_close_the_api_too():
    """Authentication is on when any key is configured: admin keys alone must not leave
    /v1/* open to anyone (they did)."""
    from cluster.config import AuthConfig
    from router.auth import admin_access, configured_keys

    open_clients, open_admin = configured_keys(AuthConfig(), {})
    assert admin_access(None, open_admin, open_clients) is None
    assert is_authorized(None, open_clients)
    clients, admin = configured_keys(AuthConfig(admin_keys=["sk-admin"]), {})
    assert not is_authorized(None, clients)                 # the API is closed
    assert not is_authorized("Bearer sk-other", clients)
    assert is_authorized("Bearer sk-admin", clients)        # but for the admin's key
    assert admin_access(None, admin, clients) == 401
    assert admin_access("Bearer sk-admin", admin, clients) is None
