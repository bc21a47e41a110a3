"""``python -m tests.bed.registry up|down|status``: the developer's local OCI registry.

``make registry-up`` / ``make registry-down`` call this. ``up`` starts (or reuses) the registry
under ``.local/registry`` and writes ``.local/registry.env`` (``REGISTRY=127.0.0.1:PORT``), which
``make release`` reads when no ``REGISTRY=`` is given, and the ``hosts.toml`` by which the
node of ``make node-up`` pulls from it; ``down`` stops it (its contents go with it).
"""

from __future__ import annotations

import argparse
import sys

from tests.bed.controlplane.plane import REPO_ROOT
from tests.bed.registry import Registry, RegistryError, containerd_hosts

ROOT = REPO_ROOT / ".local" / "registry"
ENV = REPO_ROOT / ".local" / "registry.env"
NODE_CERTS = REPO_ROOT / ".local" / "node" / "certs.d"
"""containerd's registry hosts directory of `make node-up`'s node (tests/bed/node)."""


def running() -> Registry | None:
    """The registry `up` started, if it still runs."""
    registry = Registry.load(ROOT)
    return registry if registry is not None and registry.running() else None


def _up() -> int:
    registry = running()
    if registry is None:
        registry = Registry(ROOT)
        try:
            registry.start()
        except RegistryError as exc:
            print(f"registry failed to start: {exc}", file=sys.stderr)
            return 1
    ENV.write_text(f"REGISTRY={registry.host}\n")
    containerd_hosts(NODE_CERTS, registry.host)  # for the node of `make node-up`, now or later
    print(f"registry on http://{registry.host}/v2/ (env: {ENV})")
    return 0


def _down() -> int:
    registry = Registry.load(ROOT)
    if registry is not None:
        registry.stop()
    ENV.unlink(missing_ok=True)
    print("stopped" if registry is not None else "not running")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; the exit code says whether it worked."""
    parser = argparse.ArgumentParser(prog="python -m tests.bed.registry", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up()
    if args.command == "down":
        return _down()
    registry = running()
    print(f"registry on {registry.host}" if registry else "registry not running")
    return 0 if registry else 1


if __name__ == "__main__":
    sys.exit(main())
