"""The README's folder map is checked against the folders, so that it cannot drift.

The map is the Markdown table under "## Folder map" in README.md whose rows start with a
backticked path (`` `cluster/engine/` ``). Every top-level folder of the repository (but
hidden ones and what .gitignore names) and every package folder (one holding .py files)
under the code's top folders must be listed, and every listed path must exist. Standard
library only: a unit test loads no Ray, vLLM or torch, and starts no process (git
included), so the folders are read from disk.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAP_HEADING = "## Folder map"
# The code's top folders: each folder with .py files below them is a package to list.
CODE = ("cluster", "router", "prefill", "decode", "kv_transfer", "tools")
# Folders that need no row: data a doc cites or a test reads, never code. docs/bench is
# under docs/ (not top level) and tests/*/data under tests/, so nothing is exempt today;
# a new top-level data folder would be named here, on purpose.
EXEMPT: frozenset[str] = frozenset()
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def map_section(text: str) -> str:
    """The README's folder-map section: from its heading to the next ``## `` heading."""
    start = text.index(MAP_HEADING) + len(MAP_HEADING)
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


def listed_paths(text: str) -> list[str]:
    """The paths the map's rows name, as written (folders end with ``/``)."""
    return [match.group(1) for line in map_section(text).splitlines()
            if (match := ROW.match(line))]


def ignored_names(root: Path) -> list[str]:
    """The top-level patterns of ``.gitignore`` (``.venv/``, ``/build/``, ``*.egg-info/``)."""
    gitignore = root / ".gitignore"
    if not gitignore.exists():
        return []
    patterns = []
    for line in gitignore.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            patterns.append(line.strip("/"))
    return patterns


def folders_to_list(root: Path, code: tuple[str, ...] = CODE,
                    exempt: frozenset[str] = EXEMPT) -> set[str]:
    """Every folder the map must name, as ``name/``: the top-level folders (not hidden, not
    ignored, not exempt) and each folder under ``code`` that holds a .py file."""
    ignored = ignored_names(root)
    wanted = set()
    for path in root.iterdir():
        name = path.name
        if (path.is_dir() and not name.startswith(".")
                and not any(fnmatch.fnmatch(name, pattern) for pattern in ignored)
                and name not in exempt):
            wanted.add(f"{name}/")
    for top in code:
        for source in (root / top).rglob("*.py"):
            folder = source.parent
            parts = folder.relative_to(root).parts
            if any(part.startswith(".") or part == "__pycache__" for part in parts):
                continue
            wanted.add("/".join(parts) + "/")
    return wanted


def missing_and_stale(root: Path, readme_text: str) -> tuple[set[str], set[str]]:
    """Folders the map leaves out, and listed paths that do not exist."""
    listed = listed_paths(readme_text)
    normalised = {path if path.endswith("/") or not (root / path).is_dir() else f"{path}/"
                  for path in listed}
    missing = folders_to_list(root) - normalised
    stale = {path for path in listed if not (root / path.rstrip("/")).exists()
             or (path.endswith("/") and not (root / path.rstrip("/")).is_dir())}
    return missing, stale


def test_the_map_has_rows():
    paths = listed_paths(README.read_text())
    assert len(paths) >= 10, paths
    assert len(paths) == len(set(paths)), "a folder is listed twice"


def test_every_folder_is_in_the_readme_map():
    missing, _ = missing_and_stale(ROOT, README.read_text())
    assert not missing, (f"README.md's folder map lacks {sorted(missing)}: add a row "
                         f"(or name a data folder in EXEMPT)")


def test_every_path_in_the_readme_map_exists():
    _, stale = missing_and_stale(ROOT, README.read_text())
    assert not stale, f"README.md's folder map names paths that do not exist: {sorted(stale)}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for folder in ("cluster/engine", "router", "docs/bench", ".ci", "build", "tools/planner"):
        (tmp_path / folder).mkdir(parents=True)
    for source in ("cluster/app.py", "cluster/engine/host.py", "router/server.py",
                   "tools/planner/des.py", "cluster/engine/__pycache__/host.py"):
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_text("")
    (tmp_path / ".gitignore").write_text("/build/\n# a comment\n*.egg-info/\n")
    return tmp_path


def readme(*paths: str) -> str:
    rows = "\n".join(f"| `{path}` | something |" for path in paths)
    return (f"# x\n\n{MAP_HEADING}\n\n| folder | what |\n|---|---|\n{rows}\n\n"
            "## Next\n\n| `gone/` | x |\n")


def test_the_checks_see_a_missing_folder_and_a_stale_row(repo: Path):
    """Shown able to fail: a package folder left out, a top-level folder left out, a row
    for a folder that is gone; hidden, ignored and __pycache__ folders never asked for,
    and rows after the map's section not read."""
    complete = readme("cluster/", "cluster/engine/", "router/", "docs/", "tools/",
                      "tools/planner/")
    assert missing_and_stale(repo, complete) == (set(), set())

    missing, stale = missing_and_stale(repo, readme("cluster/", "router/", "docs/",
                                                    "tools/", "gone/"))
    assert missing == {"cluster/engine/", "tools/planner/"}
    assert stale == {"gone/"}

    (repo / "scripts").mkdir()
    missing, _ = missing_and_stale(repo, complete)
    assert missing == {"scripts/"}


def test_a_file_row_must_exist_and_a_folder_row_must_be_a_folder(repo: Path):
    _, stale = missing_and_stale(repo, readme("cluster/", "cluster/engine/", "router/",
                                              "docs/", "tools/", "tools/planner/",
                                              "cluster/app.py", "cluster/app.py/",
                                              "cluster/nothing.py"))
    assert stale == {"cluster/app.py/", "cluster/nothing.py"}
