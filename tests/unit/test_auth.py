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
