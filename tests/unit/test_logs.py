"""Tracebacks in the logs never show a frame's local variables (issue 36): a local can hold a
Secret's value. Both renderers, as configured (`logs.configure_logging`), and structlog's own
default pipeline after `import projector`, even with rich importable first."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from projector.telemetry.logs import configure_logging
from tests.support import python_runs

CANARY = "local-canary-5d1e"


def _holds_a_value_and_fails() -> None:
    value = CANARY  # what a reconcile's frame may hold: a Secret's value
    raise RuntimeError(f"failed with {len(value)} characters")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream", [io.StringIO, _Tty], ids=["json", "console"])
def test_a_logged_traceback_shows_the_code_never_a_local_value(stream: type[io.StringIO]) -> None:
    out = stream()
    try:
        configure_logging(stream=out)
        try:
            _holds_a_value_and_fails()
        except RuntimeError:
            structlog.get_logger("t").exception("reconcile crashed", grant="g")
    finally:
        structlog.reset_defaults()
    text = out.getvalue()
    if stream is io.StringIO:
        text = json.loads(text)["exception"]
    assert "Traceback" in text and "_holds_a_value_and_fails" in text and "RuntimeError" in text
    assert CANARY not in text


def test_no_local_is_rendered_even_when_rich_loads_before_projector() -> None:
    """rich (or better-exceptions) imported first makes structlog's console default a traceback
    with locals: the configured console renderer and JSON do not use it."""
    code = f"""
import io, json, sys
import rich, structlog
import projector.app
from projector.telemetry.logs import configure_logging

class Tty(io.StringIO):
    def isatty(self): return True

def fails():
    value = {CANARY!r}
    raise RuntimeError("boom")

for out in (Tty(), io.StringIO()):
    configure_logging(stream=out)
    try:
        fails()
    except RuntimeError:
        structlog.get_logger("t").exception("crashed")
    text = out.getvalue()
    assert "RuntimeError" in text, text
    assert {CANARY!r} not in text, text
"""
    python_runs(code)


def test_structlogs_own_default_draws_plain_tracebacks_after_import_projector() -> None:
    """Before `configure_logging` (`projector explain`, a library user), structlog's default
    console renderer is the one `import projector` loaded it with: no rich, no locals."""
    code = f"""
import io, sys
import projector
import structlog

out = io.StringIO()
structlog.configure(logger_factory=structlog.PrintLoggerFactory(out))

def fails():
    value = {CANARY!r}
    raise RuntimeError("boom")

try:
    fails()
except RuntimeError:
    structlog.get_logger("t").exception("crashed")
text = out.getvalue()
assert "RuntimeError" in text, text
assert {CANARY!r} not in text, text
import rich.console  # importable again afterwards
"""
    python_runs(code)
