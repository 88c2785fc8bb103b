"""The one short-digest helper: what every version, config and queue-key digest is."""

import hashlib

from cluster.digest import short_digest


def test_short_digest_is_the_sha256_hex_prefix_of_the_utf8_bytes():
    expected = hashlib.sha256("clé".encode()).hexdigest()[:16]
    assert short_digest("clé") == short_digest("clé".encode()) == expected
    assert len(short_digest(b"")) == 16 and short_digest(b"a") != short_digest(b"b")
