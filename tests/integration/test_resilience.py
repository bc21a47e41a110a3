"""The API server becomes unreachable mid-flight: nothing is deleted on a guess, and once it is
back, the controller converges (DESIGN §3, last row).

The controller talks to the real API server through a loopback TCP relay that the test can cut
(every connection reset, new ones refused) and restore.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.controlplane.plane import ControlPlane
from tests.support import Cluster, NamespaceFactory, eventually

DATA = {"token": "CANARY-resilience-1"}


class Relay:
    """A cuttable loopback TCP relay to one upstream address."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen(64)
        except OSError:
            s.close()
            raise
        self.port = s.getsockname()[1]
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                down, _ = listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                down.close()
                continue
            with self._lock:
                self._conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def restore(self) -> None:
        self.start()


def relayed_kubeconfig(src: Path, dest: Path, port: int) -> Path:
    doc = yaml.safe_load(src.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dest.write_text(yaml.safe_dump(doc))
    return dest


def test_unreachable_api_server_deletes_nothing_and_converges_when_back(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    control_plane: ControlPlane,
    projector_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    url = urlsplit(control_plane.server)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 443))
    relay.start()
    kubeconfig = relayed_kubeconfig(projector_kubeconfig, tmp_path / "relayed", relay.port)
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    ctl = start_controller(f"--kubeconfig={kubeconfig}")
    k8s.grant((src, "hub"), namespaces=[a])
    revoked = k8s.grant((src, "hub"), namespaces=[b], target_name="other")
    eventually(lambda: k8s.copy_data(a, "hub") == DATA and k8s.copy_data(b, "other") == DATA)
    uid = k8s.copy(a, "hub").metadata.uid
    try:
        relay.cut()
        eventually(
            lambda: ctl.metric("projector_informer_events_total", type="ERROR") >= 4,
            message="every informer noticed the outage",
        )
        v2 = {"token": "CANARY-resilience-2"}
        k8s.patch_secret(src, "hub", {"data": v2})
        k8s.delete_grant(revoked)
        assert k8s.copy_data(a, "hub") == DATA  # nothing could be written meanwhile
        assert ctl.get("/healthz")[0] == 200  # alive, waiting, not crashing
    finally:
        relay.restore()
    eventually(lambda: k8s.copy_data(a, "hub") == v2, timeout=60)
    eventually(lambda: k8s.copy(b, "other") is None, timeout=60)  # authoritative: grant gone
    assert k8s.copy(a, "hub").metadata.uid == uid  # updated in place, never deleted
    relay.cut()
