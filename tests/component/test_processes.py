"""``processes.running``: a child server is waited for, used, and stopped even on an error."""

import signal
import socket
import sys

import pytest

from tools import processes

# Answers 200 on every GET until SIGINT (a KeyboardInterrupt ends it cleanly).
SERVER = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok)
if len(sys.argv) > 2:  # answers at once, prints its ready line only once the file appears
    import os, threading, time
    def announce():
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.05)
        print("ready now", flush=True)
    threading.Thread(target=announce, daemon=True).start()
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
"""


def free_port() -> int:
    """A port the kernel just handed out, so that tests run side by side never share one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(tmp_path, *extra: str):
    port = free_port()
    return processes.start("ok", [sys.executable, "-c", SERVER, str(port), *extra],
                           f"http://127.0.0.1:{port}", tmp_path, tmp_path)


def test_running_yields_a_ready_server_and_stops_it(tmp_path):
    with processes.running(start(tmp_path)) as server:
        assert server.process.poll() is None
    assert server.process.returncode == 0              # SIGINT, then a clean exit


def test_a_server_stops_on_sigint_when_its_starter_ignores_it(tmp_path):
    """As under a background shell (``make test &``), which ignores SIGINT for its jobs:
    the child gets it back, so ``stop`` ends it cleanly instead of killing it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server = start(tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)
    with processes.running(server):
        pass
    assert server.process.returncode == 0


def test_running_stops_the_server_when_its_user_fails(tmp_path):
    server = start(tmp_path)
    with pytest.raises(RuntimeError), processes.running(server):
        raise RuntimeError("the benchmark failed")
    assert server.process.poll() is not None


def test_a_server_with_a_ready_line_is_ready_only_once_it_printed_it(tmp_path):
    go = tmp_path / "go"
    server = start(tmp_path, str(go))
    server.ready_line = "ready now"
    with pytest.raises(processes.ServerFailed, match="not ready"):
        processes.wait_ready(server, timeout_s=3)  # healthy, but no ready line yet
    go.touch()
    with processes.running(server):
        assert "ready now" in server.log.read_text()
    assert server.process.returncode == 0
