"""`python -m projector run ...` and the `projector` console script: dispatch only."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch the subcommand; `run` is the controller."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: projector run [flags]   (projector run --help for the flags)")
        return 0 if args else 2
    if args[0] != "run":
        print(f"projector: unknown command {args[0]!r}; try: projector run --help", file=sys.stderr)
        return 2
    from projector import app

    return app.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
