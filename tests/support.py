"""Helpers only the tests use: the `Cluster` through which integration tests arrange and assert
(with canary Secret values), what must not happen (``consistently``), the audit log's writes,
scrapers' tokens, Docker detection and the fixtures' signatures.

Waiting (``eventually``), names, clients and the shipped RBAC are the bed's (`tests.bed.kube`):
the demo and the benchmarks use them too, and never import this module.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from kubernetes import client

from tests.bed.kube import (
    b64,
    bind_service_account,
    decode,
    encode,
    eventually,
    request_token,
    unique_name,
)

T = TypeVar("T")

GROUP, VERSION, PLURAL = "projector.nebari.dev", "v1alpha1", "projectiongrants"
EXPORTS = "projectionexports"


def consistently(
    condition: Callable[[], object],
    duration: float,
    interval: float = 0.1,
    message: str = "condition stopped holding",
) -> None:
    """Poll ``condition`` for ``duration`` seconds; it must hold (be truthy) at every poll.

    For what must *not* happen, such as a retry loop: a window is the only evidence, so the
    window is the test's stated bound, not a guess at how long something takes.
    """
    deadline = time.monotonic() + duration
    while True:
        value = condition()
        if not value:
            raise AssertionError(f"{message} (value: {value!r})")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def status_of(call: Callable[[], object]) -> int:
    """The HTTP status of an API call: 200 if it returned, else the ApiException's status."""
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


@functools.cache
def docker_unavailable_reason() -> str | None:
    """Why kind cannot run here (``docker info`` fails), or None if a Docker engine answers."""
    try:
        result = subprocess.run(
            ["docker", "info"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine (docker info failed: {exc})"
    if result.returncode == 0:
        return None
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    detail = lines[-1] if lines else f"exit code {result.returncode}"
    return f"no Docker engine (docker info failed: {detail})"


class NamespaceFactory(Protocol):
    """Signature of the ``make_namespace`` fixture."""

    def __call__(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
        """Create a namespace (deleted after the test) and return its name."""
        ...


class ServiceAccountKubeconfigFactory(Protocol):
    """Signature of the ``service_account_kubeconfig`` fixture."""

    def __call__(self, cluster_role: str, namespace: str) -> Path:
        """Create a ServiceAccount bound to ``cluster_role`` and return a kubeconfig for it."""
        ...


OUTAGE_LANDS_WITHIN = 5.0
"""Seconds from a change made once the API server is ready again after an outage to its first
copy landing: a correctness bound (no backoff grown by the outage may be waited out), with
headroom over DESIGN's 2 s target for a shared 2-core machine; the time itself is recorded."""


METRICS_READER = "projector-metrics-reader"
"""The shipped ClusterRole that lets a scraper `get` /metrics (deploy/rbac/)."""


def _create(call: Callable[[], object]) -> None:
    """Create something that a session reusing a plane may already have (409 is fine)."""
    try:
        call()
    except client.ApiException as e:
        if e.status != 409:
            raise


def metrics_allowed(api: client.ApiClient, namespace: str, service_account: str) -> bool:
    """The API server's RBAC authorizer lets that ServiceAccount `get` /metrics (as admin asks)."""
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=f"system:serviceaccount:{namespace}:{service_account}",
                groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                non_resource_attributes=client.V1NonResourceAttributes(path="/metrics", verb="get"),
            )
        )
    )
    return bool(review.status and review.status.allowed)


def scraper_token(
    api: client.ApiClient, namespace: str = "monitoring", service_account: str = "prometheus"
) -> str:
    """A token of a scraper's ServiceAccount bound to the shipped metrics-reader ClusterRole, as
    a Prometheus's is (the ClusterRole is installed with the shipped RBAC, `projector_kubeconfig`).
    """
    core = client.CoreV1Api(api)
    meta = client.V1ObjectMeta
    _create(lambda: core.create_namespace(client.V1Namespace(metadata=meta(name=namespace))))
    sa = client.V1ServiceAccount(metadata=meta(name=service_account))
    _create(lambda: core.create_namespaced_service_account(namespace, sa))
    rbac = client.RbacAuthorizationV1Api(api)
    binding = f"{namespace}-{service_account}-metrics-reader"
    _create(lambda: bind_service_account(rbac, binding, METRICS_READER, service_account, namespace))
    eventually(
        lambda: metrics_allowed(api, namespace, service_account),
        timeout=30,
        message=f"{namespace}/{service_account} may get /metrics",
    )
    return request_token(core, service_account, namespace)


@dataclass
class Canaries:
    """Secret values planted by tests; none may appear anywhere but in Secrets."""

    values: set[str] = field(default_factory=set)

    def add(self, value: str) -> None:
        self.values.add(value)

    def forms(self) -> set[str]:
        out = set()
        for v in self.values:
            out.add(v)
            out.add(base64.b64encode(v.encode()).decode())
        return out

    def assert_absent(self, where: str, text: str) -> None:
        leaked = sorted(f for f in self.forms() if f in text)
        assert not leaked, f"secret value(s) leaked into {where}: {len(leaked)} found"


class Cluster:
    """Arrange and assert with the official client, as admin."""

    def __init__(
        self,
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
        canaries: Canaries,
        prefix: str,
    ) -> None:
        self.core = core
        self.custom = custom
        self.canaries = canaries
        self.prefix = prefix
        self.grants: list[str] = []
        self.last_status: dict[str, dict[str, Any]] = {}

    # -- sources ---------------------------------------------------------------------------------

    def source(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        *,
        export_to: str | None = None,
        exported: bool = True,
        type_: str = "Opaque",
        immutable: bool | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> client.V1Secret:
        for v in data.values():
            self.canaries.add(v)
        meta_labels = dict(labels or {})
        if exported:
            meta_labels["projector.nebari.dev/export"] = "true"
        annotations = (
            {"projector.nebari.dev/export-to": export_to} if export_to is not None else None
        )
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, labels=meta_labels, annotations=annotations),
            type=type_,
            data=encode(data),
            immutable=immutable,
        )
        return self.core.create_namespaced_secret(namespace, body)

    def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        for v in ((patch.get("data") or {}) | (patch.get("stringData") or {})).values():
            if v is not None:
                self.canaries.add(v)
        if "data" in patch:
            patch = {
                **patch,
                "data": {k: None if v is None else b64(v) for k, v in patch["data"].items()},
            }
        self.core.patch_namespaced_secret(name, namespace, patch)

    def burst(self, namespace: str, name: str, key: str, prefix: str) -> None:
        """100 updates of the Secret's `key` in 10 s, evenly paced: f"{prefix}0" to "…99"."""
        start = time.monotonic()
        for i in range(100):
            self.patch_secret(namespace, name, {"data": {key: f"{prefix}{i}"}})
            wait = start + (i + 1) * 0.1 - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # allowed-sleep: the load's pacing, 100 updates spread over 10 s

    def config_source(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        *,
        binary: Mapping[str, bytes] | None = None,
        export_to: str | None = None,
        exported: bool = True,
    ) -> client.V1ConfigMap:
        """A contract ConfigMap; its values are canaries too (kept out of logs like a Secret's)."""
        for v in [*data.values(), *(b.decode() for b in (binary or {}).values())]:
            self.canaries.add(v)
        meta_labels = {"projector.nebari.dev/export": "true"} if exported else {}
        annotations = (
            {"projector.nebari.dev/export-to": export_to} if export_to is not None else None
        )
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, labels=meta_labels, annotations=annotations),
            data=dict(data),
            binary_data=(
                {k: base64.b64encode(v).decode() for k, v in binary.items()} if binary else None
            ),
        )
        return self.core.create_namespaced_config_map(namespace, body)

    def patch_config_map(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        for v in (patch.get("data") or {}).values():
            if v is not None:
                self.canaries.add(v)
        self.core.patch_namespaced_config_map(name, namespace, patch)

    def config_copy(self, namespace: str, name: str) -> client.V1ConfigMap | None:
        return or_none(lambda: self.core.read_namespaced_config_map(name, namespace))

    def config_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data (binaryData keys map to their decoded text)."""
        cm = self.config_copy(namespace, name)
        if cm is None:
            return None
        binary = {k: base64.b64decode(v).decode() for k, v in (cm.binary_data or {}).items()}
        return dict(cm.data or {}) | binary

    # -- grants ----------------------------------------------------------------------------------

    def grant(
        self,
        source: tuple[str, str],
        *,
        name: str | None = None,
        namespaces: Sequence[str] | None = None,
        selector: Mapping[str, Any] | None = None,
        keys: Sequence[Mapping[str, str]] | None = None,
        target_name: str | None = None,
        on_revoke: str | None = None,
        on_source_deleted: str | None = None,
        labels: Mapping[str, str] | None = None,
        kind: str | None = None,
    ) -> str:
        name = name or unique_name(self.prefix)
        target: dict[str, Any] = {}
        if namespaces is not None:
            target["namespaces"] = list(namespaces)
        if selector is not None:
            target["namespaceSelector"] = dict(selector)
        if target_name:
            target["name"] = target_name
        if labels:
            target["labels"] = dict(labels)
        spec: dict[str, Any] = {
            "source": {"namespace": source[0], "name": source[1]},
            "target": target,
        }
        if kind is not None:
            spec["source"]["kind"] = kind
        if keys is not None:
            spec["keys"] = list(keys)
        policy = {
            k: v for k, v in (("onRevoke", on_revoke), ("onSourceDeleted", on_source_deleted)) if v
        }
        if policy:
            spec["policy"] = policy
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProjectionGrant",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        self.grants.append(name)
        return name

    def export(
        self,
        namespace: str,
        source: str,
        to: list[str],
        *,
        keys: list[str] | None = None,
        name: str | None = None,
    ) -> str:
        """Create a ProjectionExport of `source` (a Secret of `namespace`); its name."""
        name = name or unique_name("export")
        spec: dict[str, Any] = {"source": {"name": source}, "to": to}
        if keys is not None:
            spec["keys"] = keys
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProjectionExport",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, EXPORTS, body)
        return name

    def patch_export(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        body = {"spec": spec}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, EXPORTS, name, body)

    def delete_export(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, EXPORTS, name)

    def get_grant(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        return cast(dict[str, Any], obj)

    def patch_grant(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, patch)

    def delete_grant(self, name: str) -> None:
        """Delete a grant (already gone is fine), keeping its last status for the canary scan."""
        try:
            self.last_status[name] = self.status(name)
            self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except client.ApiException as e:
            if e.status != 404:
                raise

    def grant_gone(self, name: str) -> bool:
        """The API server answers 404 for the grant: deleted (and no finalizer held it)."""
        try:
            self.get_grant(name)
        except client.ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    def status(self, name: str) -> dict[str, Any]:
        return self.get_grant(name).get("status") or {}

    def observed(self, name: str) -> dict[str, Any]:
        """The grant's status once the controller acted on its current spec; raises before.

        Its observedGeneration reaching metadata.generation is the reconcile of THIS grant at
        THIS generation, which no reconcile of an earlier test or spec can fake.
        """
        obj = self.get_grant(name)
        got = (obj.get("status") or {}).get("observedGeneration")
        want = obj["metadata"]["generation"]
        assert got == want, f"{name}: observedGeneration {got}, generation {want}"
        return cast(dict[str, Any], obj["status"])

    def condition(self, grant: str, type_: str) -> dict[str, Any] | None:
        for c in self.status(grant).get("conditions") or ():
            if c["type"] == type_:
                return dict(c)
        return None

    def events(self, grant: str) -> list[client.CoreV1Event]:
        evs = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={grant}"
        )
        return list(evs.items)

    # -- copies ----------------------------------------------------------------------------------

    def copy(self, namespace: str, name: str) -> client.V1Secret | None:
        return or_none(lambda: self.core.read_namespaced_secret(name, namespace))

    def version(self, namespace: str, name: str) -> tuple[str, str] | None:
        """A Secret's (uid, resourceVersion): equal later only if it was never rewritten."""
        s = self.copy(namespace, name)
        return None if s is None else (str(s.metadata.uid), str(s.metadata.resource_version))

    def copy_data(self, namespace: str, name: str) -> dict[str, str] | None:
        s = self.copy(namespace, name)
        return None if s is None else decode(s.data or {})

    def scan(self) -> None:
        """No canary in any test grant's status (a deleted grant's last one) or Events."""
        for g in dict.fromkeys(self.grants):
            try:
                statuses = [self.status(g)]
            except client.ApiException as e:
                if e.status != 404:
                    raise
                statuses = []
            statuses.append(self.last_status.get(g, {}))
            self.canaries.assert_absent(f"status of {g}", json.dumps(statuses))
            text = json.dumps([(e.reason, e.message) for e in self.events(g)])
            self.canaries.assert_absent(f"events of {g}", text)

    def cleanup(self) -> None:
        for g in self.grants:
            self.delete_grant(g)


def python_runs(code: str) -> None:
    """Run `code` in a fresh interpreter (nothing imported yet); fail with its stderr if it fails.

    For what only a clean `sys.modules` shows: which packages an import really loads.
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def or_none(read: Callable[[], T]) -> T | None:
    """What `read` returns, or None if the API server answers 404."""
    try:
        return read()
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


AUDIT_WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
REVIEWS = frozenset({"tokenreviews", "subjectaccessreviews"})
"""What the metrics port asks of each scrape: creates in the audit log, yet nothing is stored."""
_REPLICA_AGENT = re.compile(r"^projector/\S+ \((?P<id>[^)]+)\)")


@dataclass(frozen=True)
class AuditWrite:
    """One write request in the API server's audit log (tests/conftest.py enables it)."""

    at: datetime
    agent: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int

    @property
    def replica(self) -> str:
        """The projector replica that sent it (its User-Agent names it), or ''."""
        m = _REPLICA_AGENT.match(self.agent)
        return m["id"] if m else ""


def audit_writes(audit_log: Path, since: datetime | None = None) -> list[AuditWrite]:
    """Every write the API server received (since `since`), in the order it received them.

    Reviews (a scrape's token and access checks) are questions, not writes: left out.
    """
    out = []
    for line in audit_log.read_text().splitlines():
        ev = json.loads(line)
        if (
            ev.get("verb") not in AUDIT_WRITES
            or (ev.get("objectRef") or {}).get("resource") in REVIEWS
        ):
            continue
        at = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if since is not None and at < since:
            continue
        ref = ev.get("objectRef") or {}
        out.append(
            AuditWrite(
                at,
                str(ev.get("userAgent", "")),
                ev["verb"],
                ref.get("resource", ""),
                ref.get("namespace", ""),
                ref.get("name", ""),
                int((ev.get("responseStatus") or {}).get("code", 0)),
            )
        )
    return sorted(out, key=lambda w: w.at)


def deletes_since(audit_log: Path, since: datetime) -> list[str]:
    """Secret deletions the API server received since `since`, from any client."""
    return [
        f"{w.namespace}/{w.name} by {w.agent}"
        for w in audit_writes(audit_log, since)
        if w.verb == "delete" and w.resource == "secrets"
    ]
