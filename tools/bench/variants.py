"""Config variants for A/B benchmarks (pure): ``name:key.path=value,key.path=value``.

``pdserve bench variants`` serves the base config once per variant, each with a few
settings overridden, and runs the same seeded workload against each; the first variant
is the baseline of the ratios. Values are YAML (``512``, ``null``, ``true``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]


def parse_variant(text: str) -> Variant:
    """``"lane:router.admission.long_prompt_tokens=2048,prefill.max_num_batched_tokens=512"``.

    A name with no overrides (``"base"``) serves the config as it is.
    A part without ``=`` continues the previous value, so a value may hold commas
    (``kv_transfer.ucx_tls=tcp,self``).
    """
    name, _, rest = text.partition(":")
    if not name.strip():
        raise ValueError(f"variant {text!r} has no name")
    items: list[str] = []
    for part in filter(None, (part.strip() for part in rest.split(","))):
        if "=" in part or not items:
            items.append(part)
        else:
            items[-1] += "," + part
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} of variant {name!r} is not key.path=value")
        overrides[key.strip()] = yaml.safe_load(value)
    return Variant(name.strip(), overrides)


def apply_overrides(document: dict, overrides: dict[str, Any]) -> dict:
    """A copy of a parsed config document with dotted keys set (missing levels created)."""
    result = copy.deepcopy(document)
    for dotted, value in overrides.items():
        node = result
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"{dotted}: {part} is not a mapping")
            node = child
        node[leaf] = value
    return result
