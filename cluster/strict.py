"""The base of every config model (pure): strict and immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # A misspelt key is a bug in the config file, not something to ignore silently.
    model_config = ConfigDict(extra="forbid", frozen=True)
