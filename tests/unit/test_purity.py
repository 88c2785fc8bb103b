"""The house's first rule, enforced: pure modules stay pure, and unit tests stay fast.

A module is pure when the first line of its docstring says "(pure" (the tag every module
carries: "(pure)" or "(shell)"). A pure module, and every project module it imports at
module level, imports none of the runtime below; the modules the policies are made of
must carry the tag. ``tests/unit`` holds only tests that import none of the heavy runtime
(directly or through the project modules they import at module level) and start no
processes; the others live in ``tests/component`` or ``tests/integration``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "router", "prefill", "decode", "kv_transfer")

# What a pure module must not import: runtimes, I/O frameworks and the clock.
IMPURE = {"ray", "vllm", "torch", "nixl", "asyncio", "time", "fastapi", "starlette",
          "httpx", "transformers", "subprocess", "threading"}
# What a unit test must not load: the heavy runtimes, and child processes.
HEAVY = {"ray", "vllm", "torch", "nixl", "transformers", "subprocess"}

# The decisions, the config and the protocol: these must be (and say they are) pure.
MUST_BE_PURE = [
    "router/admission.py", "router/versions.py", "router/canary.py",
    "router/replica_choice.py", "router/disaggregation.py", "router/protocol.py",
    "router/errors.py", "router/auth.py", "router/timing.py", "router/sse.py",
    "cluster/autoscaling/policy.py", "cluster/autoscaling/schedule.py",
    "cluster/autoscaling/config.py", "cluster/config.py", "cluster/strict.py",
    "cluster/engine/messages.py", "cluster/engine/stats.py", "cluster/engine/load_report.py",
    "cluster/engine/routing_stats.py", "kv_transfer/handle.py", "kv_transfer/ports.py",
    "decode/pacing.py", "router/cache_policy.py", "cluster/engine/cpu_support.py",
    "cluster/engine/stall.py",
    "cluster/bench/quality.py", "cluster/planner/model.py", "cluster/planner/hardware.py",
    "cluster/planner/cost_model.py", "cluster/planner/des.py", "cluster/planner/workload.py",
    "cluster/planner/search.py", "cluster/planner/output.py", "cluster/planner/fitted.py",
    "cluster/planner/replay.py", "cluster/planner/day.py",
]


def imports_of(path: Path, module_level_only: bool) -> set[str]:
    """Dotted names ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def project_file(name: str) -> Path | None:
    """The project file a dotted name refers to, if it is one of ours."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def loaded_with(path: Path, own_imports_in_functions: bool) -> dict[str, Path]:
    """Every external top-level package loaded by importing ``path`` (and, when asked,
    by running its own functions), with the project file that imports it."""
    external: dict[str, Path] = {}
    pending, seen = [(path, own_imports_in_functions)], set()
    while pending:
        current, whole_file = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in imports_of(current, module_level_only=not whole_file):
            ours = project_file(name)
            if ours is not None:
                pending.append((ours, False))
            elif name.split(".")[0] not in PACKAGES:
                external.setdefault(name.split(".")[0], current)
    return external


def is_tagged_pure(path: Path) -> bool:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return "(pure" in docstring.splitlines()[0] if docstring else False


def tagged_pure() -> list[str]:
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    return [str(p.relative_to(ROOT)) for p in files if is_tagged_pure(p)]


@pytest.mark.parametrize("module", MUST_BE_PURE)
def test_the_decisions_config_and_protocol_say_they_are_pure(module):
    assert is_tagged_pure(ROOT / module), f"{module}: first docstring line lacks '(pure'"


@pytest.mark.parametrize("module", sorted(set(tagged_pure()) | set(MUST_BE_PURE)))
def test_a_pure_module_imports_no_runtime_io_or_clock(module):
    loaded = loaded_with(ROOT / module, own_imports_in_functions=True)
    offenders = {name: str(via.relative_to(ROOT)) for name, via in loaded.items()
                 if name in IMPURE}
    assert not offenders, f"{module} imports {offenders} (package: imported by)"


UNIT_TESTS = sorted((ROOT / "tests" / "unit").glob("test_*.py"))


@pytest.mark.parametrize("test_file", UNIT_TESTS, ids=lambda p: p.name)
def test_a_unit_test_loads_no_heavy_runtime_and_starts_no_process(test_file):
    loaded = loaded_with(test_file, own_imports_in_functions=True)
    offenders = {name: str(via.relative_to(ROOT)) for name, via in loaded.items()
                 if name in HEAVY}
    assert not offenders, (f"{test_file.name} loads {offenders}: move it to tests/component")


def test_the_checker_sees_an_impure_import(tmp_path):
    """The check itself can fail: a lazy ``import ray`` inside a function is caught."""
    module = tmp_path / "tainted.py"
    module.write_text('"""A policy (pure)."""\n\ndef f():\n    import ray\n    import time\n')
    assert is_tagged_pure(module)
    assert {"ray", "time"} <= set(loaded_with(module, own_imports_in_functions=True))
