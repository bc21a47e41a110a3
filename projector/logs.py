"""Logs: the structlog pipeline, JSON lines on a pipe and console rendering on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def log_processors(*, console: bool) -> list[Any]:
    """The structlog pipeline, JSON (on a pipe) or console rendering (on a terminal).

    Task-local context (grant, reconcile id, trace id) is merged into every line.
    """
    common: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if console:  # the console renderer formats exceptions itself
        return [*common, structlog.dev.ConsoleRenderer(colors=False)]
    return [*common, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]


def configure_logging(level: str = "info", stream: Any = None) -> None:
    """Logs via structlog: JSON on a pipe or file, console rendering on a terminal."""
    out = stream or sys.stdout
    isatty = getattr(out, "isatty", None)
    structlog.configure(
        processors=log_processors(console=bool(isatty and isatty())),
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
