"""Roles: what a vLLM server is to specwatch (standard, fly, baseline; prefill, decode)."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """What a target is: the lossless reference, the lossy FLy replica, or a baseline; and, in
    prefill/decode disaggregated serving, a prefill server (computes prompts and hands the KV
    cache on; never decodes, so never speculates) or a decode server (takes the KV cache over and
    speculates; compared with the ``baseline`` target, monolithic with speculation or without)."""

    STANDARD = "standard"
    FLY = "fly"
    BASELINE = "baseline"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def speculates(self) -> bool:
        """Whether a server of this role is meant to draft: a prefill server never decodes and a
        baseline is the no-speculation reference unless it is seen drafting."""
        return self not in (Role.PREFILL, Role.BASELINE)
