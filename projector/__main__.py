"""`python -m projector run ...` and the `projector` console script: dispatch only."""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: projector --version
       projector run [flags]                  the controller (projector run --help)
       projector validate PATH...              check grant manifests offline
       projector explain GRANT [-n NS] [-o json]  why a grant's copies are where they are
       projector explain --secret NS/NAME      which grants project a Secret, and where"""


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch the subcommand; `run` is the controller."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        from projector import __version__

        print(f"projector {__version__}")
        return 0
    if args[0] in ("validate", "explain"):
        from projector import cli

        return cli.main(args)
    if args[0] != "run":
        print(f"projector: unknown command {args[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    from projector import app

    return app.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
