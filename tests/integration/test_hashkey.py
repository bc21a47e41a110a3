"""The keyed content hash on the real API server (issue 36 item 6).

The copies' content-hash annotation is an HMAC under the install's key, kept in the Secret
projector-hash-key in the controller's namespace: two controllers starting at once create it
once (the loser of the race reads the winner's). An upgrade over copies the version before the
key wrote (an unkeyed sha256: annotation, written here with the official client exactly as
that version wrote them) rewrites none of them and rolls no workload; a restart after it writes
nothing at all; the next content change writes the keyed annotation and rolls, once. Writes
are counted from the API server's audit log. The key is a canary: no log, metric, status or
Event holds it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from projector.core.desired import Desired, desired_copy
from projector.core.grantspec import parse_grant
from projector.core.model import (
    HASH_ANNOTATION,
    HASH_KEY_SECRET,
    MANAGED_BY_LABEL,
    content_bytes,
    parse_source,
)
from projector.rollout.decide import seen_key, stamp_key, stamp_of
from tests.bed.kube import eventually
from tests.integration.test_rollout import (
    IMAGE,
    rollout_rbac,  # noqa: F401  (a fixture, by name)
)
from tests.support import Cluster, NamespaceFactory, audit_writes, or_none
from tests.workloads import consumer, copy_hash, revision, stamp

CONTROLLER_NS = "projector-system"


def key_secret(core: client.CoreV1Api) -> client.V1Secret | None:
    return or_none(lambda: core.read_namespaced_secret(HASH_KEY_SECRET, CONTROLLER_NS))


def keyed_hash(key: bytes, copy: client.V1Secret) -> str:
    """The annotation a copy carries, recomputed from what it stores, under `key`."""
    meta = copy.metadata
    ours = {k: v for k, v in (meta.annotations or {}).items() if k != HASH_ANNOTATION}
    data = {k: str(v) for k, v in (copy.data or {}).items()}
    blob = content_bytes(str(copy.type), data, meta.labels or {}, ours)
    return "hmac-sha256:" + hmac.new(key, blob, hashlib.sha256).hexdigest()


def test_two_controllers_create_the_hash_key_once_and_sign_the_copies_with_it(
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    core_v1: client.CoreV1Api,
    audit_log: Path,
) -> None:
    if key_secret(core_v1) is not None:  # an earlier test's controllers made one: start anew
        core_v1.delete_namespaced_secret(HASH_KEY_SECRET, CONTROLLER_NS)
    since = datetime.now(UTC)
    replicas = [start_controller(wait_ready=False) for _ in range(2)]  # no election: both work
    for cp in replicas:
        eventually(cp.ready, timeout=30, message="controller /readyz")
    src, targets = make_namespace(), [make_namespace() for _ in range(2)]
    k8s.source(src, "hub", {"token": "HASHKEY-canary-1"}, export_to="*")
    grant = k8s.grant((src, "hub"), namespaces=targets)
    eventually(lambda: k8s.observed(grant)["targets"]["projected"] == 2, timeout=30)

    stored = key_secret(core_v1)
    assert stored is not None
    assert stored.metadata.labels == {MANAGED_BY_LABEL: "projector"}
    assert stored.immutable is True and stored.type == "Opaque"
    encoded = str(stored.data["key"])
    key = base64.b64decode(encoded)
    assert len(key) == 32
    k8s.canaries.add(encoded)  # scanned for in logs, metrics, statuses and Events
    k8s.canaries.add(key.hex())
    creates = [
        w
        for w in audit_writes(audit_log, since)
        if w.resource == "secrets" and w.name == HASH_KEY_SECRET and w.verb == "create"
    ]
    assert [w.code for w in creates if w.code == 201] == [201], creates  # created once
    said = [cp.logs() for cp in replicas]
    assert sum(log.count('"hash key created"') for log in said) == 1
    assert all('"hash key' in log for log in said)  # each read it, or made it
    for ns in targets:
        copy = k8s.copy(ns, "hub")
        assert copy is not None
        notes = copy.metadata.annotations
        assert notes[HASH_ANNOTATION].startswith("hmac-sha256:")
        assert notes[HASH_ANNOTATION] == keyed_hash(key, copy)


def legacy(k8s: Cluster, admin: client.ApiClient, grant: str, source: tuple[str, str]) -> Desired:
    """The copy of `grant` as the version before the hash key built it (the unkeyed hash)."""
    secret = client.CoreV1Api(admin).read_namespaced_secret(source[1], source[0])
    built = desired_copy(
        parse_grant(k8s.get_grant(grant)), parse_source(admin.sanitize_for_serialization(secret))
    )
    assert isinstance(built, Desired)
    assert built.hash.startswith("sha256:")
    return built


def copy_writes(audit_log: Path, since: datetime, namespaces: list[str]) -> list[Any]:
    return [
        w
        for w in audit_writes(audit_log, since)
        if w.agent.startswith("projector/") and w.namespace in namespaces
    ]


@pytest.mark.usefixtures("rollout_rbac")
def test_an_upgrade_over_copies_with_the_unkeyed_hash_writes_nothing_and_rolls_nothing(
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    core_v1: client.CoreV1Api,
    admin_client: client.ApiClient,
    audit_log: Path,
) -> None:
    apps = client.AppsV1Api(admin_client)
    src, targets = make_namespace(), [make_namespace() for _ in range(3)]
    k8s.source(src, "db", {"password": "UPGRADE-canary-0"}, export_to="*")
    grant = k8s.grant((src, "db"), namespaces=targets)
    old = legacy(k8s, admin_client, grant, (src, "db"))
    for ns in targets:  # what the previous version wrote: its body, its field manager
        body: Any = old.manifest(ns)  # the client takes the dict as it is
        core_v1.create_namespaced_secret(ns, body, field_manager="projector")
    # a workload the previous version rolled for its copy: its stamp, from the unkeyed hash
    web = targets[0]
    rolled_for = copy_hash(core_v1, web)
    deployment = consumer("web", IMAGE, rollout_on="db")
    deployment.metadata.annotations[seen_key("db")] = rolled_for
    deployment.spec.template.metadata.annotations = {stamp_key("db"): rolled_for}
    apps.create_namespaced_deployment(web, deployment)
    versions = {ns: k8s.version(ns, "db") for ns in targets}

    since = datetime.now(UTC)
    cp = start_controller("--rollouts")
    eventually(lambda: k8s.observed(grant)["targets"]["projected"] == 3, timeout=30)
    eventually(lambda: cp.reconciled(grant) >= 1 and cp.idle(), timeout=30)
    assert copy_writes(audit_log, since, targets) == []  # no copy, no workload written
    assert {ns: k8s.version(ns, "db") for ns in targets} == versions
    assert stamp(apps, web, "web") == rolled_for and revision(apps, web, "web") == 1
    assert cp.metric("projector_writes_total", result="ok") == 0

    assert cp.stop() == 0  # and a restart after the upgrade writes nothing at all
    since = datetime.now(UTC)
    again = start_controller("--rollouts")
    eventually(lambda: again.reconciled(grant) >= 1 and again.idle(), timeout=30)
    ours = [w for w in audit_writes(audit_log, since) if w.agent.startswith("projector/")]
    assert ours == [], ours
    assert '"hash key read"' in again.logs()

    # the next content change writes the keyed hash, and rolls the workload once
    k8s.patch_secret(src, "db", {"data": {"password": "UPGRADE-canary-1"}})
    eventually(lambda: k8s.copy_data(web, "db") == {"password": "UPGRADE-canary-1"})
    copy = k8s.copy(web, "db")
    assert copy is not None and copy.metadata.annotations[HASH_ANNOTATION].startswith("hmac-")
    now = stamp_of(copy.metadata.annotations[HASH_ANNOTATION], str(copy.metadata.uid))
    assert now == copy_hash(core_v1, web) != rolled_for
    eventually(lambda: stamp(apps, web, "web") == now, message="the template stamped")
    eventually(lambda: revision(apps, web, "web") == 2, message="the Deployment rolled, once")
