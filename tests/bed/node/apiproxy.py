"""The test node's stand-in for kube-proxy's one job here: the API server, seen from each pod.

The API server listens on 127.0.0.1 only, and there is no kube-proxy, so the ``kubernetes``
Service's ClusterIP routes nowhere. This process opens a listener on ``127.0.0.1:PORT`` *inside
each pod's network namespace* (a socket belongs to the namespace it was created in, so one host
process can hold listeners in many) and forwards every connection to the API server's loopback
endpoint. A pod then reaches the API server with ``KUBERNETES_SERVICE_HOST=127.0.0.1`` and
``KUBERNETES_SERVICE_PORT=PORT``; TLS is end to end (the serving certificate names 127.0.0.1).
Nothing is configured on the host: no address, route, iptables rule or sysctl.

``python -m tests.bed.node.apiproxy --root ROOT --target 127.0.0.1:6443 --port 443``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import socket
import sys
import threading
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
SCAN_INTERVAL = 0.05


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def listen_in(netns: Path, port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port inside the network namespace ``netns``.

    setns() changes only the calling thread's namespace: a short-lived thread does it, so the
    main thread (which dials the API server) never leaves the host's namespace.
    """
    result: list[socket.socket | BaseException] = []

    def work() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(netns, os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                # lo starts DOWN in a fresh namespace until the loopback CNI plugin has run.
                sock.bind(("127.0.0.1", port))
                sock.listen(64)
                result.append(sock)
            finally:
                _setns(own)
        except BaseException as exc:
            result.append(exc)
        finally:
            os.close(own)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # closed: the namespace went away
            return
        try:
            upstream = socket.create_connection(target, timeout=5)
            upstream.settimeout(None)
        except OSError:
            conn.close()
            continue

        def both(a: socket.socket = conn, b: socket.socket = upstream) -> None:
            t = threading.Thread(target=_pump, args=(b, a), daemon=True)
            t.start()
            _pump(a, b)
            t.join()
            a.close()
            b.close()

        threading.Thread(target=both, daemon=True).start()


def run(target: tuple[str, int], port: int, netns_dir: Path = NETNS_DIR) -> None:
    """Follow the namespaces in ``netns_dir`` forever, one listener in each."""
    listeners: dict[str, socket.socket] = {}
    while True:
        try:
            present = {p.name for p in netns_dir.iterdir()}
        except FileNotFoundError:
            present = set()
        for name in present - listeners.keys():
            try:
                sock = listen_in(netns_dir / name, port)
            except OSError:
                continue  # not ready yet (lo down, or mid-creation): the next scan retries
            listeners[name] = sock
            threading.Thread(target=_serve, args=(sock, target), daemon=True).start()
        for name in listeners.keys() - present:
            listeners.pop(name).close()
        time.sleep(SCAN_INTERVAL)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and forward until killed."""
    parser = argparse.ArgumentParser(prog="python -m tests.bed.node.apiproxy", description=__doc__)
    parser.add_argument("--root", required=True, help="the node's root (names this process)")
    parser.add_argument("--target", required=True, help="HOST:PORT of the API server")
    parser.add_argument("--port", type=int, default=443)
    args = parser.parse_args(argv)
    host, _, port = str(args.target).rpartition(":")
    run((host, int(port)), int(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
