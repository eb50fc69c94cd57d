"""Roles: what a vLLM server is in specwatch's pair (standard, fly, baseline)."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """What a target is: the lossless reference, the lossy FLy replica, or a baseline."""

    STANDARD = "standard"
    FLY = "fly"
    BASELINE = "baseline"
