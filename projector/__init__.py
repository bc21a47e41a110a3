"""projector: mirror contract Secrets across namespaces, only where admin and producer agree."""

import sys
from importlib.metadata import version

__version__ = version("projector")
"""The installed distribution's version: pyproject.toml is its one place."""


_FANCY_TRACEBACKS = ("rich", "better_exceptions")
"""What structlog draws its default console tracebacks with when it can import it: both show
every frame's local variables, which can hold a Secret's values."""


def _structlog_without_rich() -> None:
    """Import structlog as if rich were not installed: 3.1 MiB and 67 modules less RSS.

    rich is here only for the command line of the CEL package (common-expression-language,
    through typer), but structlog imports it whenever it is installed, to draw tracebacks the
    controller never draws: its JSON lines format exceptions with `format_exc_info`, and its
    console lines with `plain_traceback` (`projector.telemetry.logs`), neither with locals. So
    rich (and
    better-exceptions, were it installed) is made unimportable while structlog loads, then
    importable again: a later `import rich` (a tool, a test) loads it whole. structlog's own
    default pipeline, used before `logs.configure_logging` runs, then draws plain tracebacks
    too: no local variable is ever rendered.
    """
    if "structlog" in sys.modules or any(m in sys.modules for m in _FANCY_TRACEBACKS):
        return  # loaded already, with whatever it found: nothing to save
    for module in _FANCY_TRACEBACKS:
        sys.modules[module] = None  # type: ignore[assignment]  # `import` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        for module in _FANCY_TRACEBACKS:
            del sys.modules[module]


_structlog_without_rich()
