"""pdserve as a non-editable install: the wheel is built, installed into a folder apart from
the repo, and run from there (a newcomer's ``pip install .``).

Package discovery (pyproject.toml) must put every runtime and tools module in the wheel;
this test fails for a module left out, before any import is tried. Each module is then
imported from the installed copy, never from the checkout, and the ``pdserve`` command the
wheel installs answers ``--help``, ``config`` on a shipped config and ``bench``/``plan``
(the tools' entry points).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ("cluster", "router", "prefill", "decode", "kv_transfer", "tools")
NOT_INSTALLED = ROOT / "tools" / "experiments"  # one-off scripts, run from a checkout
SHIPPED_CONFIG = ROOT / "ray_configs" / "local.yaml"
# What a build never reads: environments, caches, results and earlier builds.
NOT_SOURCE = (".git", ".venv", ".cache", "build", "dist", "*.egg-info", "__pycache__",
              ".pytest_cache", ".ruff_cache", "bench-results", "plans", "docs")

# Run in the installed copy: import every module under the given names and report where
# each came from (a module found in the checkout instead would make the test meaningless).
IMPORT_ALL = """
import importlib, json, sys
found = {}
for name in json.loads(sys.argv[1]):
    found[name] = importlib.import_module(name).__file__
print(json.dumps(found))
"""


def repo_modules() -> set[str]:
    """Dotted names of the modules the wheel must carry."""
    names = set()
    for package in INSTALLED:
        for path in (ROOT / package).rglob("*.py"):
            if NOT_INSTALLED in path.parents or "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def installed_modules(site: Path) -> set[str]:
    names = set()
    for path in site.rglob("*.py"):
        parts = path.relative_to(site).with_suffix("").parts
        if parts[0] in INSTALLED:
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The wheel built from this checkout, installed (no dependencies: this interpreter
    has them) into a folder of its own."""
    dist, site = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("site")
    # Built from a copy: setuptools reuses a source tree's build/ folder, where a package
    # dropped from discovery would still lie from an earlier build.
    source = tmp_path_factory.mktemp("source") / "pdserve"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(source)], check=True, cwd=dist, timeout=300)
    wheels = list(dist.glob("pdserve-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheels[0])],
                   check=True, cwd=dist, timeout=300)
    return site


def run_installed(site: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``args`` run by this interpreter from a folder outside the repo, the installed copy
    first on the path."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(args, cwd=site.parent, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_carries_every_module(site):
    missing = repo_modules() - installed_modules(site)
    assert not missing, f"left out of the wheel (pyproject.toml's package discovery): {missing}"
    assert not any(name.startswith("tools.experiments") for name in installed_modules(site))


def test_every_module_imports_from_the_installed_copy(site):
    names = sorted(repo_modules())
    done = run_installed(site, sys.executable, "-c", IMPORT_ALL, json.dumps(names))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    outside = {name: path for name, path in found.items()
               if not Path(path).resolve().is_relative_to(site.resolve())}
    assert not outside, f"imported from outside the installed copy: {outside}"
    assert set(found) == set(names)


def test_the_installed_command_starts(site):
    command = site / "bin" / "pdserve"
    assert command.is_file(), "the wheel installs no pdserve command"
    runner = [sys.executable, str(command)]
    helped = run_installed(site, *runner, "--help")
    assert helped.returncode == 0, helped.stderr[-3000:]
    for subcommand in ("up", "deploy", "config", "bench", "plan"):
        assert subcommand in helped.stdout
    shown = run_installed(site, *runner, "config", "--config", str(SHIPPED_CONFIG))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "router:" in shown.stdout and "engine:" in shown.stdout
    for tool in ("bench", "plan"):
        tool_help = run_installed(site, *runner, tool, "--help")
        assert tool_help.returncode == 0, tool_help.stderr[-3000:]
