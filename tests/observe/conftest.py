"""Fixtures of the observe tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.observe.scraped_sidecar import Sidecar, scraped_sidecar


@pytest.fixture
async def sidecar() -> AsyncIterator[Sidecar]:
    """See :func:`tests.observe.scraped_sidecar.scraped_sidecar`."""
    async with scraped_sidecar() as sc:
        yield sc
