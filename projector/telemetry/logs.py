"""Logs: the structlog pipeline, JSON lines on a pipe and console rendering on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def log_processors(*, console: bool) -> list[Any]:
    """The structlog pipeline, JSON (on a pipe) or console rendering (on a terminal).

    Task-local context (grant, reconcile id, trace id) is merged into every line. Tracebacks
    are plain, in both: file, line and code, never a frame's local variables, which can hold
    a Secret's values (structlog's console default, rich's or better-exceptions' traceback
    whenever either is importable, shows them; so would `dict_tracebacks`).
    """
    common: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if console:  # the console renderer formats exceptions itself
        plain = structlog.dev.plain_traceback
        return [*common, structlog.dev.ConsoleRenderer(colors=False, exception_formatter=plain)]
    # format_exc_info: the standard library's traceback text, which has no locals
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
