"""Unit tests' event loops: asyncio's, and for a test marked `both_loops` also uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The controller runs on uvloop, whose transports are not asyncio's classes."""
    if item.get_closest_marker("both_loops") is None:
        return {"asyncio": asyncio.new_event_loop}  # one factory: the test id is unchanged
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
