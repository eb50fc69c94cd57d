"""The frozen pydantic base model every settings group derives from (kept apart from
:mod:`specwatch.core.config` so that importing window names does not load pydantic)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable, and unknown fields are an error (a typo in a config file fails loudly)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
