"""The fault relay keeps no socket it no longer needs: a long fuzz run opens thousands."""

from __future__ import annotations

import os
import socket
import threading

from tests.bed.kube import eventually
from tests.bed.proxy import Relay


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def echo_server() -> tuple[socket.socket, threading.Event]:
    """A loopback upstream that echoes each connection until its client closes it."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(4096):
                conn.sendall(chunk)

    threading.Thread(target=serve, daemon=True).start()
    return server, stop


def round_trip(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"ping")
        assert c.recv(4) == b"ping"


def test_ended_and_black_holed_connections_are_closed() -> None:
    server, stop = echo_server()
    relay = Relay(server.getsockname())
    relay.start()
    try:
        before = open_fds()
        for _ in range(20):
            round_trip(relay.port)
        # both sides of every ended connection closed: no socket per connection left behind
        eventually(lambda: not relay._conns and open_fds() <= before + 2, timeout=10)
        held = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        eventually(lambda: len(relay._conns) == 1, timeout=10)
        assert relay.blackhole() == 1
        held.close()
        relay.release()
        assert not relay._held
        eventually(lambda: open_fds() <= before + 2, timeout=10)
    finally:
        relay.close()
        stop.set()
        server.close()
