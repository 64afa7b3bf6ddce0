"""The base of every request model: strict types, unknown fields ignored (OpenAI adds fields; old
clients send removed ones), immutable, no NaN or infinity."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Lenient(BaseModel):
    """Strict types, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, allow_inf_nan=False)
