"""projector: mirror contract Secrets across namespaces, only where admin and producer agree."""

import sys

__version__ = "0.1.0"


def _structlog_without_rich() -> None:
    """Import structlog as if rich were not installed: 3.1 MiB and 67 modules less RSS.

    rich is here only for the command line of the CEL package (common-expression-language,
    through typer), but structlog imports it whenever it is installed, to draw tracebacks the
    controller never draws: its JSON lines format exceptions with `format_exc_info`, and its
    console lines fall back to plain tracebacks. So rich is made unimportable while structlog
    loads, then importable again: a later `import rich` (a tool, a test) loads it whole.
    """
    if "structlog" in sys.modules or "rich" in sys.modules:
        return  # loaded already, with whatever it found: nothing to save
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


_structlog_without_rich()
