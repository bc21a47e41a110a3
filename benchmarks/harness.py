"""End-to-end benchmark plumbing: a control plane, bulk setup, a controller process, a watcher.

The harness sets things up with projector's own client (`projector.client.kube.Kube`), but triggers
and observes end-to-end samples with `benchmarks.floor.Observer` (the floor's client), so the
observer is the same, and fast, whatever the system under test; the floor is a separate process
on that client (see `benchmarks/floor.py`). Every system, projector, the floor and the peers,
runs with the same admin identity (exempt from API priority and fairness), against the same
control plane, in the same run, and is timed the same way: t0 just before the triggering write
is sent, t1 the watch event (seen by a `Watcher` of this process) that shows the last copy with
the new value.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.floor import Observer
from projector.client.kube import Kube
from projector.config import Config
from projector.core.kinds import GRANTS, NAMESPACES, SECRETS, Obj
from projector.errors import Conflict
from tests.bed.controlplane.plane import ControlPlane, ensure_binaries
from tests.bed.kube import b64
from tests.bed.launcher import REPO, ControllerProcess, launch

EXPORT = {"projector.nebari.dev/export": "true"}
EXPORT_ALL = {"projector.nebari.dev/export-to": "*"}
PROD_PYTHON = REPO / ".local" / "prod-venv" / "bin" / "python"


def controller_python() -> str:
    """The runtime-only venv when built (`make bench`), so RSS is a deployment's RSS."""
    return str(PROD_PYTHON) if PROD_PYTHON.exists() else sys.executable


def unb64(v: str) -> str:
    return base64.b64decode(v).decode()


@contextlib.contextmanager
def control_plane(root: Path) -> Any:
    """A fresh control plane for one benchmark run, stopped afterwards."""
    plane = ControlPlane(root, ensure_binaries())
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


async def gather_limited(coros: Iterable[Any], limit: int = 32) -> list[Any]:
    """Run coroutines with bounded concurrency (bulk setup, and the floor's writes)."""
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


def own_namespace(kubeconfig: Path) -> None:
    """Make the controller's own namespace (as the admin of `kubeconfig`) before it starts: it
    keeps its hash key there (`projector.control.hashkey`) and reconciles nothing until it has
    read it."""
    with config.new_client_from_config(str(kubeconfig)) as api:
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=Config().namespace))
        try:
            client.CoreV1Api(api).create_namespace(body)
        except client.ApiException as e:
            if e.status != 409:  # already there is fine
                raise


async def ensure(kube: Kube, res: Any, body: Obj, namespace: str | None = None) -> None:
    with contextlib.suppress(Conflict):
        await kube.create(res, body, namespace=namespace)


async def namespaces(kube: Kube, names: Iterable[str], labels: dict[str, str]) -> None:
    await gather_limited(
        ensure(kube, NAMESPACES, {"metadata": {"name": n, "labels": labels}}) for n in names
    )


def secret(
    name: str,
    data: dict[str, str],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "type": "Opaque",
        "data": {k: b64(v) for k, v in data.items()},
    }


def exported(name: str, data: dict[str, str]) -> Obj:
    """A producer's Secret opted in to every namespace: what a grant of the benchmarks copies."""
    return secret(name, data, labels=EXPORT, annotations=EXPORT_ALL)


async def sources(kube: Kube, ns: str, prefix: str, count: int) -> None:
    """Namespace `ns` with `count` opted-in Secrets `PREFIX-0`, `PREFIX-1`, ... (keys token, id)."""
    await namespaces(kube, [ns], {})
    await gather_limited(
        ensure(kube, SECRETS, exported(f"{prefix}-{s}", {"token": f"t{s}", "id": f"i{s}"}), ns)
        for s in range(count)
    )


def grant(
    name: str,
    source: tuple[str, str],
    *,
    selector: dict[str, str] | None = None,
    targets: list[str] | None = None,
    target_name: str | None = None,
) -> Obj:
    target: dict[str, Any] = {}
    if selector:
        target["namespaceSelector"] = {"matchLabels": selector}
    if targets:
        target["namespaces"] = targets
    if target_name:
        target["name"] = target_name
    return {
        "apiVersion": "projector.nebari.dev/v1alpha1",
        "kind": "ProjectionGrant",
        "metadata": {"name": name},
        "spec": {"source": {"namespace": source[0], "name": source[1]}, "target": target},
    }


async def put_value(kube: Kube | Observer, ns: str, name: str, key: str, value: str) -> float:
    """Set one key of a Secret (read, then PUT): the monotonic time just before the PUT is sent.

    That is t0 of every end-to-end sample, for every system: the triggering write's own
    round trip counts, as it does for the floor, whose t0 is taken before its first write.
    """
    body = await kube.get(SECRETS, name, namespace=ns)
    body["data"][key] = b64(value)
    t0 = time.monotonic()
    await kube.replace(SECRETS, body, namespace=ns)
    return t0


class Watcher:
    """Follows Secrets matching a label selector; records when each reached a wanted value."""

    def __init__(self, kube: Kube | Observer, label_selector: str, key: str) -> None:
        self.kube = kube
        self.selector = label_selector
        self.key = key
        self.values: dict[tuple[str, str], str] = {}
        self.modified: dict[tuple[str, str], int] = {}
        self.since: dict[tuple[str, str], float] = {}
        """When (monotonic, on receipt of its watch event) each Secret got its current value."""
        self.gone: dict[tuple[str, str], float] = {}
        """When (likewise) each Secret was last seen deleted."""
        self.last: tuple[str, str] | None = None
        """The Secret of the latest event."""
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[float]]] = []
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def __aenter__(self) -> Watcher:
        items, rv = await self.kube.list(SECRETS, label_selector=self.selector)
        for o in items:
            self._see(o)
        self._task = asyncio.create_task(self._run(rv))
        await self.ready.wait()
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def _see(self, o: Obj, now: float | None = None) -> None:
        m = o["metadata"]
        v = (o.get("data") or {}).get(self.key)
        k, value = (m["namespace"], m["name"]), unb64(v) if v else ""
        if self.values.get(k) != value:
            self.since[k] = time.monotonic() if now is None else now
        self.values[k] = value

    async def _run(self, rv: str) -> None:
        while True:
            async for kind, o in self.kube.watch(
                SECRETS,
                resource_version=rv,
                label_selector=self.selector,
                timeout_seconds=600,
                read_deadline=700,
            ):
                if kind == "OPEN":
                    self.ready.set()
                    continue
                rv = o.get("metadata", {}).get("resourceVersion", rv)
                if kind == "BOOKMARK":
                    continue
                now = time.monotonic()
                m = o["metadata"]
                k = (m["namespace"], m["name"])
                self.last = k
                if kind == "DELETED":
                    self.values.pop(k, None)
                    self.gone[k] = now
                else:
                    if kind == "MODIFIED":
                        self.modified[k] = self.modified.get(k, 0) + 1
                    self._see(o, now)
                for cond, fut in list(self._waiters):
                    if not fut.done() and cond():
                        fut.set_result(now)
                        self._waiters.remove((cond, fut))

    async def until(self, cond: Callable[[], bool], within: float = 120.0) -> float:
        """The monotonic time at which `cond` first held (checked on every event)."""
        if cond():
            return time.monotonic()
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((cond, fut))
        return await asyncio.wait_for(fut, within)

    async def reached(
        self, keys: Iterable[tuple[str, str]], value: str, within: float = 120.0
    ) -> float:
        """When the last of `keys` got `value`: the receipt time of that watch event.

        Exact whenever it is awaited (values are unique per sample, so a key's current value
        was set by exactly one event), unlike `until`, which returns "now" if already true.
        """
        ks = list(keys)
        await self.until(self.all_equal(ks, value), within)
        return max(self.since[k] for k in ks)

    def all_equal(self, keys: Iterable[tuple[str, str]], value: str) -> Callable[[], bool]:
        """A condition: every key has reached `value` since now.

        Each event re-checks only its own key (`last`), so waiting for n copies costs O(n),
        not O(n) per event (25 million checks in the harness at 5,000 copies). Values are
        unique per sample, so a key that reached it keeps it.
        """
        pending = {k for k in keys if self.values.get(k) != value}

        def cond() -> bool:
            k = self.last
            if k in pending and self.values.get(k) == value:
                pending.discard(k)
            return not pending

        return cond


async def wait_ready(c: ControllerProcess, within: float = 120.0) -> float:
    """Seconds from process start to /readyz 200."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(c.ready):
            return time.monotonic() - c.started
        await asyncio.sleep(0.02)
    raise TimeoutError("controller never became ready")


def _settled(c: ControllerProcess) -> bool:
    return c.metric("projector_reconcile_total") >= 1 and c.idle()


async def settle(c: ControllerProcess, within: float = 600.0) -> None:
    """Wait until workers ran and nothing is ready, processing, debouncing or backing off."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_settled, c):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("controller never settled")


@contextlib.asynccontextmanager
async def controller(
    kubeconfig: Path,
    log: Path,
    *extra: str,
    leader_elect: bool = False,
    env: dict[str, str] | None = None,
    run_as: Path | None = None,
) -> AsyncIterator[ControllerProcess]:
    """The controller, ready; `run_as`: the kubeconfig it runs with (default the admin's)."""
    own_namespace(kubeconfig)
    c = launch(
        run_as or kubeconfig,
        log,
        "--log-level=warning",
        *extra,
        python=controller_python(),
        leader_elect=leader_elect,
        env=env,
    )
    try:
        await wait_ready(c)
        yield c
    finally:
        c.stop(timeout=30)


async def delete_grants(kube: Kube) -> None:
    items, _ = await kube.list(GRANTS)
    await gather_limited(kube.delete(GRANTS, g["metadata"]["name"]) for g in items)
