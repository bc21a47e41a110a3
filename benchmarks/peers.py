"""The peer controllers that benchmarks run side by side with projector (DESIGN.md section 8).

Each peer is built from source by ``benchmarks/peers/build.sh`` (pinned in
``benchmarks/peers/versions.env``: the archives of ``../shared/peers``, else ``go install`` of the
pinned version) into ``$cache/peers/<name>-<version>/`` and run out of cluster
against the admin kubeconfig of the local control plane, "as a user would": with its own defaults,
except what running out of cluster on a shared machine needs (kubeconfig, loopback ports, logs).

A benchmark uses a peer in four steps::

    peer = Replicator()
    peer.ensure_built()                                   # PeerUnavailable if it cannot be built
    proc = peer.start(kubeconfig, log_path)
    peer.wait_ready(proc)
    peer.setup_fanout(core_v1, custom_objects, "src", "db", ["t1", "t2"],
                      namespace_label=("bench", "x"))     # copies in place
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
from typing import Any, ClassVar

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.bed.controlplane.plane import cache_dir, free_port, read_versions, tail

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


@dataclass(frozen=True)
class Fanout:
    """One fan-out asked of a peer: the source Secret, its targets, how they are chosen.

    `labels` go on the source (both peers copy them onto the copies, so a label selector finds
    the copies); `namespace_label` (key, value) selects the targets by label, as the projector
    grant of the same benchmark does, else the targets are named.
    """

    source_ns: str
    source_name: str
    targets: Sequence[str]
    labels: Mapping[str, str] | None
    namespace_label: tuple[str, str] | None

    def label_source(self, core: k8s.CoreV1Api, annotations: Mapping[str, str]) -> None:
        """Merge-patch the source's annotations (a peer's opt-in marks) and `labels`."""
        meta = {"annotations": dict(annotations), "labels": dict(self.labels or {})}
        core.patch_namespaced_secret(self.source_name, self.source_ns, {"metadata": meta})


@dataclass
class Peer:
    """What a benchmark needs from a peer controller, and what both peers share.

    Each is a binary from build.sh, ready on a loopback ``/readyz``, whose copies keep the
    source's name. A peer says how it starts (`start`, which sets `ready_port` and
    `log_path`) and how a fan-out is asked of it (`_project`); `setup_fanout` then waits.
    """

    name: str
    version: str
    ready_port: int = 0
    log_path: Path = Path(os.devnull)

    BINARY: ClassVar[str]
    TARGET: ClassVar[str]

    def ensure_built(self) -> Path:
        """Build the peer (a no-op when cached); PeerUnavailable with the exact error if not."""
        return build(self.TARGET) / self.BINARY

    def built(self) -> Path | None:
        """The binary if already built (never builds), else None."""
        return cached(self.name, self.version, self.BINARY)

    def start(self, kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
        """Start the peer out of cluster with the given admin kubeconfig, logging to log_path."""
        raise NotImplementedError

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
        """Return once the started peer reports itself ready (its caches are synced)."""
        url = f"http://127.0.0.1:{self.ready_port}/readyz"
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
        namespace_label: tuple[str, str] | None = None,
    ) -> None:
        """Project the existing Secret source_ns/source_name into targets (see `Fanout`);
        return once every copy is in place."""
        fanout = Fanout(source_ns, source_name, targets, labels, namespace_label)
        self._project(core, custom, fanout)
        wait_copies(
            core, source_ns, source_name, self.copy_name(source_name), targets, timeout, self.name
        )

    def _project(self, core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, fanout: Fanout) -> None:
        """Ask the peer for the fan-out of `setup_fanout` (which then waits for the copies)."""
        raise NotImplementedError

    def copy_name(self, source_name: str) -> str:
        """The name of the peer's copy of source_name in each target namespace."""
        return source_name


@dataclass
class Replicator(Peer):
    """kubernetes-replicator (github.com/mittwald/kubernetes-replicator) v2.12.4, commit f535dd9.

    Built from source (see versions.env and build.sh). Push fan-out: the source carries
    ``replicator.v1.mittwald.de/replicate-to-matching: "LABEL=VALUE"`` and the controller creates
    (then updates) a copy of the same name in every namespace with that label; copies keep the
    source's labels. No status object: a copy is current when its annotation
    ``replicator.v1.mittwald.de/replicated-from-version`` equals the source's resourceVersion
    (the benchmarks use unique values instead, which says the same).

    Run with its defaults, client-go's 5 QPS / burst 10 included, out of cluster with
    ``-kubeconfig``, ``-status-addr=127.0.0.1:<free port>`` (default ``:9102``), and only Secrets
    replicated (``-replicate-configmaps=false -replicate-roles=false
    -replicate-role-bindings=false -replicate-service-accounts=false``). Ready: ``/readyz`` 200.
    """

    name: str = "kubernetes-replicator"
    version: str = field(default_factory=lambda: read_versions(VERSIONS_FILE)["REPLICATOR_VERSION"])

    REPLICATE_TO_MATCHING: ClassVar[str] = "replicator.v1.mittwald.de/replicate-to-matching"
    BINARY: ClassVar[str] = "kubernetes-replicator"
    TARGET: ClassVar[str] = "replicator"

    def start(self, kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
        self.ready_port, self.log_path = free_port(), log_path
        args = [
            str(self.ensure_built()),
            f"-kubeconfig={kubeconfig}",
            f"-status-addr=127.0.0.1:{self.ready_port}",
            "-replicate-configmaps=false",
            "-replicate-roles=false",
            "-replicate-role-bindings=false",
            "-replicate-service-accounts=false",
        ]
        return spawn(args, log_path)

    def _project(self, core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, fanout: Fanout) -> None:
        """Annotate the source to replicate to the namespaces labelled `namespace_label`.

        Without a label, the targets are given as anchored regexps (``replicate-to``).
        """
        if label := fanout.namespace_label:
            ann = {self.REPLICATE_TO_MATCHING: f"{label[0]}={label[1]}"}
        else:
            to = ",".join(f"^{t}$" for t in fanout.targets)
            ann = {"replicator.v1.mittwald.de/replicate-to": to}
        fanout.label_source(core, ann)


@dataclass
class Projection(Peer):
    """projection (github.com/projection-operator/projection) main at bb25bf3 (after v0.3.1).

    Built from source (see versions.env and build.sh). A controller-runtime operator with two
    cluster-wide CRDs (group ``projection.sh/v1``). A fan-out is one cluster-scoped
    ``ClusterProjection`` with ``spec.source`` {kind: Secret, namespace, name} and
    ``spec.destination.namespaceSelector`` (or ``namespaces``); the source must carry
    ``projection.sh/projectable: "true"`` (default ``--source-mode=allowlist``). Copies keep the
    source's name and labels, and are labelled ``projection.sh/owned-by-cluster-projection-uid``.

    Run with its defaults (``--selector-write-concurrency=16``, no client-side rate limit, no
    leader election), out of cluster with ``--kubeconfig``, ``--metrics-bind-address=0`` (off)
    and ``--health-probe-bind-address=127.0.0.1:<free port>`` (default ``:8081``). Ready:
    ``/readyz`` 200. start() first installs the CRDs of its source (``config/crd/bases``, copied
    next to the binary by build.sh).
    """

    name: str = "projection"
    version: str = field(default_factory=lambda: read_versions(VERSIONS_FILE)["PROJECTION_VERSION"])

    GROUP: ClassVar[str] = "projection.sh"
    API_VERSION: ClassVar[str] = "v1"
    PLURAL: ClassVar[str] = "clusterprojections"
    PROJECTABLE: ClassVar[str] = "projection.sh/projectable"
    BINARY: ClassVar[str] = "projection"
    TARGET: ClassVar[str] = "projection"

    def built(self) -> Path | None:
        binary = super().built()
        return binary if binary and any((binary.parent / "crds").glob("*.yaml")) else None

    def start(self, kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
        binary = self.ensure_built()
        install_crds(kubeconfig, sorted((binary.parent / "crds").glob("*.yaml")))
        self.ready_port, self.log_path = free_port(), log_path
        args = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{self.ready_port}",
        ]
        return spawn(args, log_path)

    def _project(self, core: k8s.CoreV1Api, custom: k8s.CustomObjectsApi, fanout: Fanout) -> None:
        fanout.label_source(core, {self.PROJECTABLE: "true"})
        source_ns, source_name = fanout.source_ns, fanout.source_name
        destination: dict[str, Any] = (
            {"namespaceSelector": {"matchLabels": dict([label])}}
            if (label := fanout.namespace_label)
            else {"namespaces": list(fanout.targets)}
        )
        body: dict[str, Any] = {
            "apiVersion": f"{self.GROUP}/{self.API_VERSION}",
            "kind": "ClusterProjection",
            "metadata": {"name": f"{source_ns}.{source_name}"},
            "spec": {
                "source": {"kind": "Secret", "namespace": source_ns, "name": source_name},
                "destination": destination,
            },
        }
        try:
            custom.create_cluster_custom_object(self.GROUP, self.API_VERSION, self.PLURAL, body)
        except k8s.ApiException as exc:
            if exc.status != 409:  # already there: a rerun against the same cluster
                raise


def cached(name: str, version: str, binary: str) -> Path | None:
    """The peer's binary if build.sh already built it (no build is started), else None."""
    path = cache_dir() / "peers" / f"{name}-{version}" / binary
    return path if path.is_file() and os.access(path, os.X_OK) else None


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
    return (Projection(), Replicator())


__all__ = [
    "Fanout",
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
