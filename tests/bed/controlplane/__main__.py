"""``python -m tests.bed.controlplane up|down|status|env``: the developer's local control plane.

``make cluster-up`` / ``make cluster-down`` call this. It starts detached processes recorded in
``--root`` so a later ``down`` (another process) can stop them; pytest starts its own instead.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from tests.bed.controlplane.plane import (
    REPO_ROOT,
    ControlPlane,
    ControlPlaneError,
    describe,
    ensure_binaries,
)

DEFAULT_ROOT = REPO_ROOT / ".local" / "cluster"
DEFAULT_KUBECONFIG = REPO_ROOT / ".local" / "kubeconfig"


def _up(root: Path, kubeconfig: Path) -> int:
    existing = ControlPlane.load(root)
    if existing is not None and existing.running():
        shutil.copyfile(existing.kubeconfig, kubeconfig)
        print(f"already running: {existing.server} ({existing.version()['gitVersion']})")
        print(f"export KUBECONFIG={kubeconfig}")
        return 0
    if existing is not None:
        try:  # leftovers of a half-dead plane would hold ports and the data dir
            existing.stop()
        except ControlPlaneError as exc:
            print(f"cannot stop the previous control plane: {exc}", file=sys.stderr)
            return 1
    started = time.monotonic()
    plane = ControlPlane(root, ensure_binaries())
    try:
        plane.start()
    except ControlPlaneError as exc:
        print(f"control plane failed to start: {exc}", file=sys.stderr)
        return 1
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plane.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o600)
    elapsed = time.monotonic() - started
    print(f"ready in {elapsed:.1f}s: {plane.server} ({plane.version()['gitVersion']})")
    print(f"logs: {plane.logs}")
    print(f"export KUBECONFIG={kubeconfig}")
    return 0


def _down(root: Path) -> int:
    plane = ControlPlane.load(root)
    if plane is None or not plane.processes:
        print("not running")
        return 0
    try:
        plane.stop()
    except ControlPlaneError as exc:
        print(f"control plane did not stop: {exc}", file=sys.stderr)
        return 1
    print("stopped")
    return 0


def _status(root: Path) -> int:
    plane = ControlPlane.load(root)
    if plane is None or not plane.processes:
        print(f"not running (state: {root})")
        return 1
    print(describe(plane))
    running = plane.running()
    print("ready" if running else "not ready")
    return 0 if running else 1


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; the exit code says whether it worked."""
    parser = argparse.ArgumentParser(prog="python -m tests.bed.controlplane", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="state, logs, data")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=DEFAULT_KUBECONFIG,
        help="where `up` copies the admin kubeconfig",
    )
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    kubeconfig: Path = args.kubeconfig.resolve()
    if args.command == "up":
        return _up(root, kubeconfig)
    if args.command == "down":
        return _down(root)
    if args.command == "status":
        return _status(root)
    plane = ControlPlane.load(root)
    if plane is None or not plane.running():
        print("warning: the control plane is not running (make cluster-up)", file=sys.stderr)
    print(f"export KUBECONFIG={kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
