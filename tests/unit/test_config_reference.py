"""docs/config.md is the generated configuration reference, current and complete."""

from __future__ import annotations

import difflib
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from cluster.config import PDServeConfig
from cluster.config.reference import COMMAND, describe

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"


def test_docs_config_md_is_the_generated_reference():
    expected = describe()
    actual = DOC.read_text() if DOC.is_file() else ""
    if actual != expected:
        diff = "".join(list(difflib.unified_diff(
            actual.splitlines(keepends=True), expected.splitlines(keepends=True),
            "docs/config.md", "generated"))[:40])
        raise AssertionError(f"docs/config.md is not the reference the config models give: "
                             f"regenerate it with `{COMMAND}`\n{diff}")


def test_the_reference_says_it_is_generated_and_how():
    first, second = describe().splitlines()[:2]
    assert COMMAND in first
    assert "not edit by hand" in second


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds, wherever (optional, in a list or a mapping)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Annotated, Union, types.UnionType, list, dict, tuple):
        return [model for arg in get_args(annotation) for model in models_in(arg)]
    return []


def every_model() -> set[type[BaseModel]]:
    found, pending = set(), [PDServeConfig]
    while pending:
        model = pending.pop()
        if model not in found:
            found.add(model)
            pending.extend(nested for info in model.model_fields.values()
                           for nested in models_in(info.annotation))
    return found


def keys_by_model(text: str) -> dict[str, set[str]]:
    """Each section's model name and the last part of each key its table lists."""
    sections: dict[str, set[str]] = {}
    for section in text.split("\n## ")[1:]:
        name = section.split("Model: `", 1)[1].split("`", 1)[0]
        keys = {line.split("`")[1].split(".")[-1] for line in section.splitlines()
                if line.startswith("| `")}
        sections[name] = keys
    return sections


def test_every_field_of_every_model_appears():
    sections = keys_by_model(describe())
    models = every_model()
    # the nested sections too: the pools, autoscaling's standby windows, the router's parts
    assert len(models) > 20
    for model in models:
        assert model.__name__ in sections, f"no section for {model.__name__}"
        assert sections[model.__name__] == set(model.model_fields), model.__name__
    assert len(sections) == len(models)
