"""The plain floor: two write+watch round trips on a synchronous stdlib client, own process.

The second floor of the one-change benchmark, beside the asyncio one
(`benchmarks/floor.py`), to tell whether that floor carries overhead of its own (an event loop,
a session, a thread hop to read stdin). Here nothing but `http.client` and `json`: PUTs on one
kept-alive HTTPS connection from the caller's thread, the watch on another connection read by
a thread of this process, the two joined by a `threading.Condition`. Same protocol as
benchmarks/floor.py (JSON lines on stdin, one answer each): `watch` and `roundtrips` only.
"""

from __future__ import annotations

import base64
import http.client
import json
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from benchmarks.floor import ssl_and_headers


class SyncFloor:
    def __init__(self, kubeconfig: Path) -> None:
        server, self.ssl, self.headers = ssl_and_headers(kubeconfig)
        u = urlsplit(server)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 443
        self.conn = self._connect()
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.values: dict[tuple[str, str], str] = {}
        self.changed = threading.Condition()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=60)

    def _request(
        self, conn: http.client.HTTPSConnection, method: str, path: str, body: Any = None
    ) -> http.client.HTTPResponse:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=self.headers)
        return conn.getresponse()

    def _see(self, o: dict[str, Any]) -> None:
        m = o["metadata"]
        k = (m["namespace"], m["name"])
        with self.changed:
            self.values[k] = base64.b64decode((o.get("data") or {}).get("token", "")).decode()
            self.bodies[k] = o
            self.changed.notify_all()

    def open_watch(self, selector: str) -> dict[str, Any]:
        r = self._request(self.conn, "GET", f"/api/v1/secrets?labelSelector={quote(selector)}")
        listed = json.loads(r.read())
        for o in listed["items"]:
            self._see(o)
        rv = listed["metadata"]["resourceVersion"]
        opened = threading.Event()

        def run() -> None:
            conn = self._connect()
            r = self._request(
                conn,
                "GET",
                f"/api/v1/secrets?watch=1&labelSelector={quote(selector)}"
                f"&resourceVersion={rv}&timeoutSeconds=3600",
            )
            opened.set()
            while line := r.readline():
                ev = json.loads(line)
                if ev["type"] in ("ADDED", "MODIFIED"):
                    self._see(ev["object"])

        threading.Thread(target=run, daemon=True).start()
        opened.wait(30)
        return {"n": len(self.values)}

    def _has(self, k: tuple[str, str], value: str) -> bool:
        return self.values.get(k) == value

    def roundtrips(self, namespace: str, names: list[str], key: str, value: str) -> dict[str, Any]:
        encoded = base64.b64encode(value.encode()).decode()
        cpu0 = time.process_time()
        t0 = time.monotonic()
        marks = []
        for name in names:
            k = (namespace, name)
            body = self.bodies[k]
            body["data"][key] = encoded
            path = f"/api/v1/namespaces/{namespace}/secrets/{name}?fieldManager=floor"
            r = self._request(self.conn, "PUT", path, body)
            r.read()
            if r.status != 200:
                raise RuntimeError(f"PUT {namespace}/{name}: {r.status}")
            marks.append(time.monotonic())
            with self.changed:
                self.changed.wait_for(partial(self._has, k, value), 30)
            marks.append(time.monotonic())
        t1 = time.monotonic()
        cpu = time.process_time() - cpu0
        return {"t0": t0, "t1": t1, "cpu": cpu, "writes": len(names), "marks": marks}


def serve(kubeconfig: Path) -> None:
    floor = SyncFloor(kubeconfig)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "quit":
            return
        if op == "watch":
            out = floor.open_watch(cmd["selector"])
        elif op == "roundtrips":
            out = floor.roundtrips(cmd["namespace"], cmd["names"], cmd["key"], cmd["value"])
        else:
            out = {"error": f"unknown op {op}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
