"""The house's first rules, enforced: pure modules stay pure, the runtime stands apart from
the tools run against it, imports never go round in a circle, and unit tests stay fast.

A module is pure when the first line of its docstring says "(pure" (the tag every module
carries: "(pure)" or "(shell)"). A pure module, and every project module it imports at
module level, imports none of the runtime below; the modules the policies are made of
must carry the tag. ``tests/unit`` holds only tests that import none of the heavy runtime
(directly or through the project modules they import at module level) and start no
processes; the others live in ``tests/component`` or ``tests/integration``.

The import graph (every import, lazy ones included, file to file) has no circle; no runtime
module imports the tools wing (``tools/``: it plugs into the CLI through entry points); and
a pure module imports only pure project modules, so a shell's imports cannot be dodged by
moving them into its functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("cluster", "router", "prefill", "decode", "kv_transfer")
TOOLS = "tools"
PACKAGES = (*RUNTIME, TOOLS)
# Run by hand from a checkout, never imported: outside the graph.
EXPERIMENTS = ROOT / TOOLS / "experiments"

# What a pure module must not import: runtimes, I/O frameworks and the clock.
IMPURE = {"ray", "vllm", "torch", "nixl", "asyncio", "time", "fastapi", "starlette",
          "httpx", "transformers", "subprocess", "threading"}
# What a unit test must not load: the heavy runtimes, and child processes.
HEAVY = {"ray", "vllm", "torch", "nixl", "transformers", "subprocess"}

# The decisions, the config and the protocol: these must be (and say they are) pure.
MUST_BE_PURE = [
    "router/admission.py", "router/versions.py", "router/canary.py",
    "router/replica_choice/__init__.py", "router/replica_choice/loads.py",
    "router/replica_choice/prefixes.py", "router/replica_choice/decode_cache.py",
    "router/replica_choice/pending.py", "router/replica_choice/spread.py",
    "router/replica_choice/ranking.py", "router/disaggregation.py", "router/protocol.py",
    "router/errors.py", "router/auth.py", "router/quarantine_memory.py", "router/timing.py",
    "router/sse.py",
    "cluster/autoscaling/policy.py", "cluster/autoscaling/schedule.py",
    "cluster/autoscaling/config.py", "cluster/strict.py",
    "cluster/config/__init__.py", "cluster/config/root.py", "cluster/config/model.py",
    "cluster/config/engine.py", "cluster/config/kv_transfer.py", "cluster/config/canary.py",
    "cluster/config/router.py", "cluster/config/routing.py", "cluster/config/ray.py",
    "cluster/config/reference.py",
    "cluster/engine/messages.py", "cluster/engine/stats.py", "cluster/engine/load_report.py",
    "cluster/engine/routing_stats.py", "kv_transfer/handle.py", "kv_transfer/ports.py",
    "decode/pacing.py", "router/cache_policy.py", "cluster/engine/cpu_support.py",
    "cluster/engine/stall.py",
    "tools/bench/quality.py", "tools/soak/report.py", "tools/planner/model.py",
    "tools/planner/hardware.py",
    "tools/planner/cost_model.py", "tools/planner/des.py", "tools/planner/workload.py",
    "tools/planner/search.py", "tools/planner/output.py", "tools/planner/fitted.py",
    "tools/planner/replay.py", "tools/planner/day.py", "tools/planner/standby_fit.py",
    "tools/planner/des_admission.py",
    "tools/planner/des_engine.py", "tools/planner/des_events.py",
    "tools/planner/des_requests.py", "tools/planner/des_results.py",
    "tools/planner/des_routing.py", "tools/planner/des_spec.py",
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


def project_files() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
            if EXPERIMENTS not in p.parents]


def tagged_pure() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in project_files() if is_tagged_pure(p)]


def import_graph(files: list[Path]) -> dict[Path, set[Path]]:
    """Each file and the project files it imports anywhere in it (lazy imports too)."""
    graph: dict[Path, set[Path]] = {}
    for path in files:
        targets = {project_file(name) for name in imports_of(path, module_level_only=False)}
        graph[path] = {target for target in targets if target not in (None, path)}
    return graph


def circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The graph's strongly connected parts of more than one file (Tarjan's algorithm)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    found: list[list[Path]] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while (top := stack.pop()) != node:
                part.append(top)
            if part:
                found.append([node, *part])

    for node in graph:
        if node not in index:
            visit(node)
    return found


def runtime_imports_of_tools(graph: dict[Path, set[Path]], root: Path = ROOT) -> list[str]:
    """Arrows from a runtime file to a file of the tools wing."""
    def package(path: Path) -> str:
        return path.relative_to(root).parts[0]

    return [f"{source.relative_to(root)} -> {target.relative_to(root)}"
            for source, targets in graph.items() if package(source) in RUNTIME
            for target in targets if package(target) == TOOLS]


def pure_imports_of_shells(graph: dict[Path, set[Path]], root: Path = ROOT) -> list[str]:
    """Arrows from a module tagged pure to a project module that is not (packages'
    ``__init__`` files aside)."""
    return [f"{source.relative_to(root)} -> {target.relative_to(root)}"
            for source, targets in graph.items() if is_tagged_pure(source)
            for target in targets
            if target.name != "__init__.py" and not is_tagged_pure(target)]


@pytest.mark.parametrize("module", MUST_BE_PURE)
def test_the_decisions_config_and_protocol_say_they_are_pure(module):
    assert is_tagged_pure(ROOT / module), f"{module}: first docstring line lacks '(pure'"


@pytest.mark.parametrize("module", sorted(set(tagged_pure()) | set(MUST_BE_PURE)))
def test_a_pure_module_imports_no_runtime_io_or_clock(module):
    loaded = loaded_with(ROOT / module, own_imports_in_functions=True)
    offenders = {name: str(via.relative_to(ROOT)) for name, via in loaded.items()
                 if name in IMPURE}
    assert not offenders, f"{module} imports {offenders} (package: imported by)"


def test_no_import_circle():
    found = circles(import_graph(project_files()))
    assert not found, [[str(p.relative_to(ROOT)) for p in part] for part in found]


def test_no_runtime_module_imports_the_tools():
    offenders = runtime_imports_of_tools(import_graph(project_files()))
    assert not offenders, offenders


def test_a_pure_module_imports_only_pure_project_modules():
    offenders = pure_imports_of_shells(import_graph(project_files()))
    assert not offenders, offenders


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


def test_the_graph_checks_see_a_circle_a_runtime_import_of_the_tools_and_a_shell(tmp_path):
    """The three graph checks can fail: a two-file circle, a runtime file importing the
    tools, and a pure file importing a shell are each seen."""
    policy = tmp_path / "cluster" / "policy.py"
    tool = tmp_path / "tools" / "tool.py"
    policy.parent.mkdir()
    tool.parent.mkdir()
    policy.write_text('"""A policy (pure)."""\n')
    tool.write_text('"""A tool (shell)."""\n')
    graph = {policy: {tool}, tool: {policy}}
    assert [set(part) for part in circles(graph)] == [{policy, tool}]
    assert not circles({policy: {tool}, tool: set()})
    assert runtime_imports_of_tools(graph, tmp_path) == ["cluster/policy.py -> tools/tool.py"]
    assert pure_imports_of_shells(graph, tmp_path) == ["cluster/policy.py -> tools/tool.py"]
    assert not runtime_imports_of_tools({tool: {policy}}, tmp_path)
