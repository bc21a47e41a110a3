"""Smoke test of benchmarks/peers.py: each peer mirrors a Secret into 3 namespaces, then an update.

``.venv/bin/python -m benchmarks.smoke_peers`` starts a local control plane in a temporary
directory, builds (or reuses) every peer and, for each one in turn: starts it, sets up a fan-out
of one source Secret to 3 namespaces, updates the source and prints the time until a watch has
seen every copy hold the new value; then stops the peer. A peer that cannot be built is reported
with the build's own error. Exit code 0 only if every buildable peer passed and one at least did.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from benchmarks.peers import Peer, PeerError, PeerUnavailable, all_peers, stop
from tests.bed.controlplane.plane import ControlPlane, ensure_binaries
from tests.bed.kube import b64

KEY = "value"
COPIES = 3  # the default; the first 3 copies are printed one by one
TIMEOUT = 60.0


class CopyWatch:
    """A watch on every Secret named ``name``, opened before the update so no event is missed.

    Opening returns once the API server has answered the watch request (headers received), so
    the watch is established; a thread then timestamps each event as it arrives.
    """

    def __init__(self, core: k8s.CoreV1Api, name: str, targets: Sequence[str], value: str):
        listed = core.list_secret_for_all_namespaces(field_selector=f"metadata.name={name}")
        # Without preloading, the client returns the raw urllib3 response: an iterator of lines.
        self.resp: Any = core.list_secret_for_all_namespaces(
            field_selector=f"metadata.name={name}",
            watch=True,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=int(TIMEOUT),
            _preload_content=False,
            _request_timeout=(5, TIMEOUT + 5),
        )
        self.pending = set(targets)
        self.want = b64(value)
        self.seen: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.resp:
                now = time.monotonic()
                obj = json.loads(line)["object"]
                ns = obj["metadata"]["namespace"]
                if ns in self.pending and (obj.get("data") or {}).get(KEY) == self.want:
                    self.pending.discard(ns)
                    self.seen[ns] = now
                    if not self.pending:
                        return
        finally:
            self.done.set()

    def close(self) -> None:
        self.resp.release_conn()


def make_namespaces(core: k8s.CoreV1Api, names: Sequence[str]) -> None:
    for name in names:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))


def smoke(
    peer: Peer,
    core: k8s.CoreV1Api,
    custom: k8s.CustomObjectsApi,
    plane: ControlPlane,
    copies: int = COPIES,
) -> bool | None:
    """Run the story for one peer: True if it passed, False if it failed, None if unavailable."""
    started = time.monotonic()
    try:
        binary = peer.ensure_built()
    except PeerUnavailable as exc:
        print(f"{peer.name} {peer.version}: UNAVAILABLE, not built here:\n{exc}")
        return None
    print(f"{peer.name} {peer.version}: binary {binary} ({time.monotonic() - started:.1f}s)")

    short = "repl" if "replicator" in peer.name else peer.name[:4]
    source_ns, source_name = f"{short}-source", "shared"
    targets = [f"{short}-tenant-{i}" for i in range(1, copies + 1)]
    make_namespaces(core, [source_ns, *targets])
    core.create_namespaced_secret(
        source_ns,
        k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=source_name), data={KEY: b64("v1")}),
    )

    log_path = plane.root / "logs" / f"{peer.name}.log"
    proc = peer.start(plane.kubeconfig, log_path)
    try:
        t0 = time.monotonic()
        peer.wait_ready(proc)
        print(f"  ready in {time.monotonic() - t0:.2f}s (log: {log_path})")
        t0 = time.monotonic()
        peer.setup_fanout(core, custom, source_ns, source_name, targets, timeout=TIMEOUT)
        print(f"  fan-out to {copies} namespaces in place in {time.monotonic() - t0:.2f}s")

        watch = CopyWatch(core, peer.copy_name(source_name), targets, "v2")
        t0 = time.monotonic()
        core.patch_namespaced_secret(source_name, source_ns, {"data": {KEY: b64("v2")}})
        finished = watch.done.wait(TIMEOUT)
        watch.close()
        if not finished or watch.pending:
            print(f"  FAILED: no new value within {TIMEOUT:.0f}s in {sorted(watch.pending)}")
            return False
        for ns in targets[:COPIES]:
            print(f"  {ns}/{peer.copy_name(source_name)} = v2 after {watch.seen[ns] - t0:.3f}s")
        print(
            f"  all {copies} copies updated {max(watch.seen.values()) - t0:.3f}s after the update"
        )
        return True
    except PeerError as exc:
        print(f"  FAILED: {exc}")
        return False
    finally:
        code = stop(proc)
        print(f"  stopped (exit code {code})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.smoke_peers", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--copies", type=int, default=COPIES, help="target namespaces per peer")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="projector-peers-"))
    plane = ControlPlane(root, ensure_binaries(), crd_dir=None, die_with_parent=True)
    t0 = time.monotonic()
    plane.start()
    print(f"control plane {plane.version()['gitVersion']} at {plane.server} ({root})")
    print(f"  ready in {time.monotonic() - t0:.1f}s")
    results: dict[str, bool | None] = {}
    try:
        api = k8s_config.new_client_from_config(str(plane.kubeconfig))
        core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        for peer in all_peers():
            results[peer.name] = smoke(peer, core, custom, plane, args.copies)
    finally:
        plane.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("summary: " + ", ".join(f"{n}: {_word(ok)}" for n, ok in results.items()))
    ran = [ok for ok in results.values() if ok is not None]
    return 0 if ran and all(ran) else 1


def _word(ok: bool | None) -> str:
    return "unavailable" if ok is None else ("ok" if ok else "FAILED")


if __name__ == "__main__":
    sys.exit(main())
