"""``python -m tests.bed.node up|down|status|image``: the developer's local node.

``make node-up`` / ``make node-down`` / ``make image`` call this. ``up`` starts the local control
plane first if it is not running (``make cluster-up``'s), then containerd and the kubelet under
``.local/node``, and writes ``.local/node.env`` (shell assignments: the node's name, its
containerd socket, the kubeconfig). ``down`` stops the node and puts the host back.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.bed.controlplane.__main__ import DEFAULT_KUBECONFIG, DEFAULT_ROOT
from tests.bed.controlplane.__main__ import _up as plane_up
from tests.bed.controlplane.plane import REPO_ROOT, ControlPlane, ControlPlaneError, ensure_binaries
from tests.bed.node.images import ImageError, build_projector_image, import_archive
from tests.bed.node.node import (
    HOST_STATE_FILE,
    Node,
    NodeError,
    ensure_node_binaries,
    missing_prerequisites,
)

NODE_ROOT = REPO_ROOT / ".local" / "node"
NODE_ENV = REPO_ROOT / ".local" / "node.env"


def _env_text(node: Node) -> str:
    return (
        f"NODE_NAME={node.name}\n"
        f"CONTAINERD_ADDRESS={node.socket}\n"
        f"CONTAINERD_NAMESPACE=k8s.io\n"
        f"KUBECONFIG={DEFAULT_KUBECONFIG}\n"
        # kubectl's discovery cache, else it lands in $HOME/.kube (outside the project)
        f"KUBECACHEDIR={REPO_ROOT / '.local' / 'kube-cache'}\n"
        f"CTR={node.node_binaries / 'ctr'}\n"
        f"KUBECTL={node.kube_binaries / 'kubectl'}\n"
    )


def _up() -> int:
    reason = missing_prerequisites()
    if reason is not None:
        print(f"no node can run here: {reason}", file=sys.stderr)
        return 1
    existing = Node.load(NODE_ROOT)
    if existing is not None and existing.running():
        print(f"already running: node {existing.name}, containerd {existing.socket}")
        NODE_ENV.write_text(_env_text(existing))
        print(f"env: {NODE_ENV}")
        return 0
    if existing is not None:
        try:
            existing.stop()
        except (NodeError, ControlPlaneError) as exc:
            print(f"cannot stop the previous node: {exc}", file=sys.stderr)
            return 1
    if plane_up(DEFAULT_ROOT, DEFAULT_KUBECONFIG) != 0:
        return 1
    plane = ControlPlane.load(DEFAULT_ROOT)
    assert plane is not None
    started = time.monotonic()
    node = Node(NODE_ROOT, plane, ensure_binaries(), ensure_node_binaries())
    try:
        node.start()
    except (NodeError, ControlPlaneError, ImageError) as exc:
        print(f"node failed to start: {exc}", file=sys.stderr)
        return 1
    NODE_ENV.write_text(_env_text(node))
    print(f"node {node.name} Ready in {time.monotonic() - started:.1f}s")
    print(f"containerd: {node.socket}")
    print(f"logs: {node.logs}")
    print(f"env: {NODE_ENV}")
    return 0


def _down() -> int:
    node = Node.load(NODE_ROOT)
    if node is None or (not node.processes and not (NODE_ROOT / HOST_STATE_FILE).exists()):
        print("not running")
        NODE_ENV.unlink(missing_ok=True)
        return 0
    try:
        node.stop()
    except (NodeError, ControlPlaneError) as exc:
        print(f"node did not stop cleanly: {exc}", file=sys.stderr)
        return 1
    NODE_ENV.unlink(missing_ok=True)
    print("stopped; host restored")
    return 0


def _status() -> int:
    node = Node.load(NODE_ROOT)
    running = node is not None and node.running()
    print(f"node {'Ready' if running else 'not running'}")
    return 0 if running else 1


def _image(name: str) -> int:
    try:
        image = build_projector_image(name)
    except ImageError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    print(
        f"built {image.name} in {image.seconds:.0f}s: {image.size_bytes / 2**20:.0f} MiB "
        f"unpacked, {image.archive_bytes / 2**20:.0f} MiB as an OCI archive ({image.archive})"
    )
    node = Node.load(NODE_ROOT)
    if node is not None and node.running():
        try:
            import_archive(node, image.archive)
        except NodeError as exc:
            print(f"make image: import into the node failed: {exc}", file=sys.stderr)
            return 1
        print(f"imported into the node's containerd ({node.socket})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; the exit code says whether it worked."""
    parser = argparse.ArgumentParser(prog="python -m tests.bed.node", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "image"])
    parser.add_argument("--image", default="localhost/projector:dev")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up()
    if args.command == "down":
        return _down()
    if args.command == "status":
        return _status()
    return _image(str(args.image))


if __name__ == "__main__":
    sys.exit(main())
