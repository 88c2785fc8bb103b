"""``processes.running``: a child server is waited for, used, and stopped even on an error."""

import sys

import pytest

from cluster import processes

# Answers 200 on every GET until SIGINT (a KeyboardInterrupt ends it cleanly).
SERVER = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
try:
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
except KeyboardInterrupt:
    pass
"""


def free_port() -> int:
    port = 18731
    while not processes.port_is_free("127.0.0.1", port):
        port += 1
    return port


def start(tmp_path):
    port = free_port()
    return processes.start("ok", [sys.executable, "-c", SERVER, str(port)],
                           f"http://127.0.0.1:{port}", tmp_path, tmp_path)


def test_running_yields_a_ready_server_and_stops_it(tmp_path):
    with processes.running(start(tmp_path)) as server:
        assert server.process.poll() is None
    assert server.process.returncode == 0              # SIGINT, then a clean exit


def test_running_stops_the_server_when_its_user_fails(tmp_path):
    server = start(tmp_path)
    with pytest.raises(RuntimeError), processes.running(server):
        raise RuntimeError("the benchmark failed")
    assert server.process.poll() is not None
