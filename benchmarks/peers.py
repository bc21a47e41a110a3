"""The peer controllers that benchmarks run side by side with projector (DESIGN.md section 8).

Each peer is built from its Go module by ``benchmarks/peers/build.sh`` (pinned in
``benchmarks/peers/versions.env``) into ``$cache/peers/<name>-<version>/`` and run out of cluster
against the admin kubeconfig of the local control plane, "as a user would": with its own defaults,
except what running out of cluster on a shared machine needs (kubeconfig, loopback ports, logs).

A benchmark uses a peer in four steps::

    peer = Replicator()
    peer.ensure_built()                                   # PeerUnavailable if it cannot be built
    proc = peer.start(kubeconfig, log_path)
    peer.wait_ready(proc)
    peer.setup_fanout(core_v1, custom_objects, "src", "db", ["t1", "t2"])  # copies in place
    ...update src/db, watch Secrets named peer.copy_name("db") in t1, t2...
    stop(proc)
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.controlplane.plane import cache_dir, free_port, read_versions, tail

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "peers" / "build.sh"
VERSIONS_FILE = HERE / "peers" / "versions.env"
POLL_INTERVAL = 0.1
LOG_TAIL_LINES = 30


class PeerUnavailable(RuntimeError):
    """A peer could not be built here; the message carries build.sh's own words."""


class PeerError(RuntimeError):
    """A peer did not start, did not become ready, or did not establish its copies in time."""


def build(target: str, script: Path = BUILD_SCRIPT) -> Path:
    """Run ``build.sh target`` under a lock (a no-op when cached) and return the peer's directory.

    build.sh's progress is passed through to our stderr; on failure its last lines (the module
    proxy's or the compiler's exact error) become the PeerUnavailable message.
    """
    lock_path = cache_dir() / "peers" / "build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(
            ["bash", str(script), target],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.stderr:
        print(result.stderr, end="", file=sys.stderr)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        detail = "\n".join(result.stderr.strip().splitlines()[-LOG_TAIL_LINES:])
        raise PeerUnavailable(f"{script} {target} failed (exit {result.returncode}):\n{detail}")
    return Path(lines[-1])


def spawn(args: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a peer in its own session, stdout and stderr appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM the peer, SIGKILL it after the deadline; returns its exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


def wait_http_ok(
    proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float, name: str
) -> None:
    """Poll a plain-HTTP health URL until it answers 200, failing fast if the process exits."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(
                f"{name} exited ({proc.returncode}) before {url} was ready; "
                f"last lines of {log_path}:\n{tail(log_path, LOG_TAIL_LINES)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(POLL_INTERVAL)
    raise PeerError(
        f"{name} not ready at {url} after {timeout:.0f}s (last: {last}); "
        f"last lines of {log_path}:\n{tail(log_path, LOG_TAIL_LINES)}"
    )


def wait_copies(
    core: k8s.CoreV1Api,
    source_ns: str,
    source_name: str,
    copy_name: str,
    targets: Sequence[str],
    timeout: float,
    peer: str,
) -> None:
    """Poll (one cluster-wide list per round) until every target's copy holds the source's data."""
    want = core.read_namespaced_secret(source_name, source_ns).data or {}
    pending = set(targets)
    deadline = time.monotonic() + timeout
    while True:
        copies = core.list_secret_for_all_namespaces(field_selector=f"metadata.name={copy_name}")
        pending.difference_update(
            s.metadata.namespace for s in copies.items if (s.data or {}) == want
        )
        if not pending:
            return
        if time.monotonic() > deadline:
            missing = sorted(pending)
            raise PeerError(
                f"{peer}: {len(missing)} of {len(targets)} copies of {source_ns}/{source_name} "
                f"not in place after {timeout:.0f}s, e.g. {missing[:5]}"
            )
        time.sleep(POLL_INTERVAL)


def annotate(
    core: k8s.CoreV1Api, namespace: str, name: str, annotations: Mapping[str, str]
) -> None:
    """Merge-patch annotations onto a Secret."""
    core.patch_namespaced_secret(name, namespace, {"metadata": {"annotations": dict(annotations)}})


class Peer(Protocol):
    """What a benchmark needs from a peer controller."""

    name: str
    version: str

    def ensure_built(self) -> Path:
        """Build the peer (a no-op when cached); PeerUnavailable with the exact error if not."""
        ...

    def start(self, kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
        """Start the peer out of cluster with the given admin kubeconfig, logging to log_path."""
        ...

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
        """Return once the started peer reports itself ready (its caches are synced)."""
        ...

    def setup_fanout(
        self,
        core: k8s.CoreV1Api,
        custom: k8s.CustomObjectsApi,
        source_ns: str,
        source_name: str,
        targets: Sequence[str],
        timeout: float = 600.0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Project the existing Secret source_ns/source_name into targets; return once in place."""
        ...

    def copy_name(self, source_name: str) -> str:
        """The name of the peer's copy of source_name in each target namespace."""
        ...


@dataclass
class Replicator:
    """kubernetes-replicator (github.com/mittwald/kubernetes-replicator) v1.0.0, 2019-03-05.

    The only version the module proxy serves here (see versions.env); built with client-go
    v5.0.1 as pinned by its glide.lock. v1.0.0 is pull-based only: there is no ``replicate-to``
    (that came in v2). The source opts in with ``replicator.v1.mittwald.de/replication-allowed:
    "true"`` and ``replication-allowed-namespaces`` (comma-separated, each an unanchored Go
    regexp); each target namespace holds a Secret of its own annotated
    ``replicator.v1.mittwald.de/replicate-from: <ns>/<name>``, whose ``data`` the controller
    overwrites from the source's.

    Run with its defaults: one informer over every Secret and ConfigMap in the cluster,
    ``--resync-period=30m``, --allow-all off, client-go's default rate limit of 5 QPS / burst 10,
    one event handler goroutine writing copies one by one, no leader election (v1.0.0 has none),
    no namespace scoping, no metrics (only ``/healthz``, 200 once its informers have synced).
    Out of cluster we pass ``--kubeconfig``, ``--status-addr=127.0.0.1:<free port>`` (default
    ``:9102``) and glog's ``--logtostderr`` (client-go logs through glog, which otherwise writes
    files into /tmp).
    """

    name: str = "kubernetes-replicator"
    version: str = field(default_factory=lambda: read_versions(VERSIONS_FILE)["REPLICATOR_VERSION"])
    status_port: int = 0
    log_path: Path = Path(os.devnull)

    ALLOWED: ClassVar[str] = "replicator.v1.mittwald.de/replication-allowed"
    ALLOWED_NAMESPACES: ClassVar[str] = "replicator.v1.mittwald.de/replication-allowed-namespaces"
    REPLICATE_FROM: ClassVar[str] = "replicator.v1.mittwald.de/replicate-from"

    def ensure_built(self) -> Path:
        return build("replicator") / "kubernetes-replicator"

    def start(self, kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
        self.status_port, self.log_path = free_port(), log_path
        args = [
            str(self.ensure_built()),
            f"--kubeconfig={kubeconfig}",
            f"--status-addr=127.0.0.1:{self.status_port}",
            "--logtostderr",
        ]
        return spawn(args, log_path)

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
        url = f"http://127.0.0.1:{self.status_port}/healthz"
        wait_http_ok(proc, url, self.log_path, timeout, self.name)

    def setup_fanout(
        self,
        core: k8s.CoreV1Api,
        custom: k8s.CustomObjectsApi,
        source_ns: str,
        source_name: str,
        targets: Sequence[str],
        timeout: float = 600.0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Allow the targets on the source, then create one replicate-from Secret per target.

        The allow-list is the targets' common prefix as one anchored regexp when they share one
        (as a user with 1,000 tenant namespaces would write ``^tenant-``), else each name
        anchored: v1.0.0 compiles every entry for every permission check.
        """
        prefix = os.path.commonprefix(list(targets))  # noqa: RUF071 - characters are meant
        allowed = f"^{prefix}" if prefix else ",".join(f"^{t}$" for t in targets)
        annotate(
            core, source_ns, source_name, {self.ALLOWED: "true", self.ALLOWED_NAMESPACES: allowed}
        )
        for target in targets:
            body = k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(
                    name=self.copy_name(source_name),
                    labels=dict(labels or {}),
                    annotations={self.REPLICATE_FROM: f"{source_ns}/{source_name}"},
                ),
                type="Opaque",  # a typed Secret (e.g. kubernetes.io/tls) cannot start empty
            )
            core.create_namespaced_secret(target, body)
        wait_copies(
            core, source_ns, source_name, self.copy_name(source_name), targets, timeout, self.name
        )

    def copy_name(self, source_name: str) -> str:
        return source_name


@dataclass
class Projection:
    """projection (github.com/projection-operator/projection, formerly be0x74a/projection) v0.3.1.

    NOT BUILDABLE HERE: the module proxy refuses every version of both module paths (see
    versions.env), so ensure_built() raises PeerUnavailable with the proxy's words; the rest is
    written from the v0.3.1 source and has not been run.

    A controller-runtime operator with two cluster-wide CRDs (group ``projection.sh/v1``). A
    fan-out is one cluster-scoped ``ClusterProjection`` with ``spec.source`` {kind: Secret,
    namespace, name} and ``spec.destination.namespaces`` (or a ``namespaceSelector``); the
    source must carry ``projection.sh/projectable: "true"`` (default ``--source-mode=allowlist``).
    Copies keep the source's name (``destination.name`` unset).

    Run with its defaults: ``--selector-write-concurrency=16``, ``--requeue-interval=30s``,
    secure (authn/authz-filtered HTTPS) metrics, controller-runtime's client rate limit, no
    namespace scoping. Out of cluster we pass ``--kubeconfig``,
    ``--metrics-bind-address=127.0.0.1:<free port>`` (default "0", off),
    ``--health-probe-bind-address=127.0.0.1:<free port>`` (default ``:8081``) and leave
    ``--leader-elect`` at its default, false. start() first installs the CRDs shipped in the
    module (``config/crd/bases``, copied next to the binary by build.sh).
    """

    name: str = "projection"
    version: str = field(default_factory=lambda: read_versions(VERSIONS_FILE)["PROJECTION_VERSION"])
    probe_port: int = 0
    metrics_port: int = 0
    log_path: Path = Path(os.devnull)

    GROUP: ClassVar[str] = "projection.sh"
    API_VERSION: ClassVar[str] = "v1"
    PLURAL: ClassVar[str] = "clusterprojections"
    PROJECTABLE: ClassVar[str] = "projection.sh/projectable"

    def ensure_built(self) -> Path:
        return build("projection") / "projection"

    def start(self, kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
        binary = self.ensure_built()
        install_crds(kubeconfig, sorted((binary.parent / "crds").glob("*.yaml")))
        self.probe_port, self.metrics_port, self.log_path = free_port(), free_port(), log_path
        args = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
        ]
        return spawn(args, log_path)

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
        url = f"http://127.0.0.1:{self.probe_port}/readyz"
        wait_http_ok(proc, url, self.log_path, timeout, self.name)

    def setup_fanout(
        self,
        core: k8s.CoreV1Api,
        custom: k8s.CustomObjectsApi,
        source_ns: str,
        source_name: str,
        targets: Sequence[str],
        timeout: float = 600.0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        annotate(core, source_ns, source_name, {self.PROJECTABLE: "true"})
        body: dict[str, Any] = {
            "apiVersion": f"{self.GROUP}/{self.API_VERSION}",
            "kind": "ClusterProjection",
            "metadata": {"name": f"{source_ns}.{source_name}"},
            "spec": {
                "source": {"kind": "Secret", "namespace": source_ns, "name": source_name},
                "destination": {"namespaces": list(targets)},
            },
        }
        custom.create_cluster_custom_object(self.GROUP, self.API_VERSION, self.PLURAL, body)
        wait_copies(
            core, source_ns, source_name, self.copy_name(source_name), targets, timeout, self.name
        )

    def copy_name(self, source_name: str) -> str:
        return source_name


def install_crds(kubeconfig: Path, paths: Sequence[Path], timeout: float = 60.0) -> None:
    """Create (or replace) each CRD and wait until it is Established, as ``kubectl apply`` would."""
    api = k8s.ApiextensionsV1Api(k8s_config.new_client_from_config(str(kubeconfig)))
    names = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            name = doc["metadata"]["name"]
            try:
                api.create_custom_resource_definition(doc)
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise
                current = api.read_custom_resource_definition(name)
                doc["metadata"]["resourceVersion"] = current.metadata.resource_version
                api.replace_custom_resource_definition(name, doc)
            names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            conditions = api.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise PeerError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(POLL_INTERVAL)


def secret_value(data: Mapping[str, str] | None, key: str) -> str | None:
    """Decode one key of a Secret's base64 ``data`` (None when absent)."""
    if not data or key not in data:
        return None
    return base64.b64decode(data[key]).decode()


def all_peers() -> tuple[Peer, ...]:
    """A fresh instance of each peer (an instance remembers the ports of its last start)."""
    return (Replicator(), Projection())


__all__ = [
    "Peer",
    "PeerError",
    "PeerUnavailable",
    "Projection",
    "Replicator",
    "all_peers",
    "build",
    "install_crds",
    "secret_value",
    "stop",
]
