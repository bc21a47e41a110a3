"""A loopback TCP relay to the API server that fault tests can break in the two ways networks do.

`cut()` is a loud failure: every connection is reset and new ones are refused (a restarted
load balancer, a crashed node). `blackhole()` is the silent one: every connection open at that
moment stops carrying bytes in either direction but is never closed (a dropped conntrack entry,
a half-dead NAT), while new connections flow. Only a client-side read deadline notices it.
TLS passes through untouched, so the client still verifies the real server.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import yaml


class Relay:
    """A cuttable, black-holable loopback TCP relay to one upstream address."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._held: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Listen (on the same port again after a cut) and relay every connection accepted."""
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
            except ConnectionAbortedError:
                continue  # a client reset before it was accepted: the listener itself is fine
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                down.close()
                continue
            held = threading.Event()
            with self._lock:
                self._conns.append((down, up, held))
            threading.Thread(target=self._relay, args=(down, up, held), daemon=True).start()

    def _relay(self, down: socket.socket, up: socket.socket, held: threading.Event) -> None:
        """Carry one connection both ways; once both ways end, close it (a black-holed one is
        kept open on purpose until `release` or `close`)."""
        pipes = [
            threading.Thread(target=self._pipe, args=(a, b, held), daemon=True)
            for a, b in ((down, up), (up, down))
        ]
        for t in pipes:
            t.start()
        for t in pipes:
            t.join()
        if held.is_set():
            return
        with self._lock, contextlib.suppress(ValueError):
            self._conns.remove((down, up, held))
        down.close()
        up.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, held: threading.Event) -> None:
        with contextlib.suppress(OSError, ValueError):
            while not held.is_set():
                if not select.select([src], [], [], 0.1)[0]:
                    continue
                chunk = src.recv(65536)
                if held.is_set():
                    return  # black-holed: the bytes vanish, the sockets stay open
                if not chunk:
                    break
                dst.sendall(chunk)
            else:
                return
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def blackhole(self) -> int:
        """Silence every open connection for good, without closing it; new ones still flow.

        Returns how many connections were silenced (a test asserts it caught some)."""
        with self._lock:
            conns, self._conns = self._conns, []
            for down, up, held in conns:
                held.set()
                self._held.append((down, up))  # referenced, so never closed by the collector
        return len(conns)

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            socks = [s for down, up, _ in self._conns for s in (down, up)]
            self._conns = []
        for c in socks:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self.start()

    def release(self) -> None:
        """Close the black-holed connections (their client is gone): a long run of faults
        must not keep one pair of sockets per blackhole until the relay closes."""
        with self._lock:
            held, self._held = self._held, []
        for pair in held:
            for s in pair:
                s.close()

    def close(self) -> None:
        """Cut, and close the black-holed connections too: nothing is left open."""
        self.cut()
        self.release()


def relayed_kubeconfig(src: Path, dest: Path, port: int) -> Path:
    """A copy of a kubeconfig whose server is the relay (same CA and credentials)."""
    doc = yaml.safe_load(src.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dest.write_text(yaml.safe_dump(doc))
    dest.chmod(0o600)
    return dest


@contextlib.contextmanager
def relay_to(server: str, kubeconfig: Path, dest: Path) -> Iterator[tuple[Relay, Path]]:
    """A started relay to `server` and a copy of `kubeconfig` (at `dest`) that goes through it;
    closed on the way out, so no test leaves a connection open."""
    url = urlsplit(server)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 443))
    relay.start()
    try:
        yield relay, relayed_kubeconfig(kubeconfig, dest, relay.port)
    finally:
        relay.close()
