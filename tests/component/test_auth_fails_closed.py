"""`pdserve up` refuses to start when a key variable the config names holds no key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def up(tmp_path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    config = {"model": {"name": "m", "path": str(tmp_path / "no-model")},
              "router": {"port": 8999, "auth": {"api_keys": ["sk-file"],
                                                "api_keys_env": "PDSERVE_TEST_KEYS"}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "PDSERVE_TEST_KEYS"} | environ
    return subprocess.run([sys.executable, "-m", "cluster.cli", "up", "--config", str(path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("environ, state", [({}, "is not set"),
                                            ({"PDSERVE_TEST_KEYS": " "}, "is empty")])
def test_a_named_key_variable_without_keys_stops_startup(tmp_path, environ, state):
    result = up(tmp_path, environ)
    assert result.returncode == 2
    assert f"PDSERVE_TEST_KEYS named by the config {state}" in result.stderr


def test_with_the_keys_present_startup_goes_on_to_the_next_check(tmp_path):
    # The model directory does not exist: the next check refuses, after the keys passed.
    result = up(tmp_path, {"PDSERVE_TEST_KEYS": "sk-env"})
    assert result.returncode == 2
    assert "model directory" in result.stderr and "PDSERVE_TEST_KEYS" not in result.stderr
