"""DESIGN §3, row by row, against the real API server and the real `projector run` process.

Every row's test is here, so `make compat`, which runs this file on the oldest and newest
Kubernetes the chart supports, runs them whole. The first part takes each row as the table
states it; the second tests rows where they bite: the narrow side of each change, not only the
easy one, each asserting a state that differs from the one before its action, so a controller
that never processed the action cannot pass it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import ControllerProcess
from tests.support import Cluster, NamespaceFactory, audit_writes, consistently

DATA = {"token": "CANARY-token-1", "other": "CANARY-other-1"}


def ready(k8s: Cluster, grant: str) -> dict[str, Any]:
    cond = k8s.condition(grant, "Ready")
    assert cond is not None and cond["status"] == "True", cond
    return cond


def failures(k8s: Cluster, grant: str) -> dict[str, str]:
    return {f["namespace"]: f["reason"] for f in k8s.status(grant).get("failures") or ()}


def test_copy_created_in_every_target_namespace(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to=f"{a},{b}")
    g = k8s.grant((src, "hub"), namespaces=[a, b])
    for ns in (a, b):
        assert eventually(lambda ns=ns: k8s.copy_data(ns, "hub")) == DATA  # type: ignore[misc]
    copy = k8s.copy(a, "hub")
    assert copy is not None
    assert copy.metadata.labels["projector.nebari.dev/managed-by"] == "projector"
    assert copy.metadata.labels["projector.nebari.dev/grant"] == g
    assert (
        copy.metadata.annotations["projector.nebari.dev/grant-uid"]
        == k8s.get_grant(g)["metadata"]["uid"]
    )
    assert copy.metadata.annotations["projector.nebari.dev/source"] == f"{src}/hub"
    assert copy.metadata.annotations["projector.nebari.dev/content-hash"].startswith("hmac-sha256:")
    eventually(lambda: ready(k8s, g))
    assert k8s.status(g)["targets"] == {"matched": 2, "projected": 2, "conflicted": 0, "denied": 0}
    assert eventually(lambda: [e for e in k8s.events(g) if e.reason == "Created"])


def test_source_change_updates_every_copy(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    k8s.grant((src, "hub"), namespaces=[a, b])
    eventually(lambda: k8s.copy_data(a, "hub") == DATA and k8s.copy_data(b, "hub") == DATA)
    k8s.patch_secret(src, "hub", {"data": {"token": "CANARY-token-2"}})
    want = {**DATA, "token": "CANARY-token-2"}
    eventually(lambda: k8s.copy_data(a, "hub") == want and k8s.copy_data(b, "hub") == want)


@pytest.mark.parametrize(
    "export_to",
    [
        pytest.param(None, id="no-export-to"),
        pytest.param("", id="empty"),
        pytest.param("someone-else", id="not-matching"),
    ],
)
def test_default_deny_without_matching_export_to(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    export_to: str | None,
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to=export_to)
    g = k8s.grant((src, "hub"), namespaces=[a])
    eventually(lambda: k8s.status(g).get("targets", {}).get("denied") == 1)
    assert k8s.copy(a, "hub") is None
    assert k8s.condition(g, "Ready")["reason"] == "Denied"


def test_globs_and_selector(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src = make_namespace()
    team = make_namespace(name=f"team-{src[-5:]}", labels={"pack": src})
    other = make_namespace(labels={"pack": src})
    k8s.source(src, "hub", DATA, export_to="team-*")
    g = k8s.grant((src, "hub"), selector={"matchLabels": {"pack": src}})
    assert eventually(lambda: k8s.copy_data(team, "hub")) == DATA
    eventually(lambda: k8s.status(g).get("targets", {}).get("denied") == 1)
    assert k8s.copy(other, "hub") is None


def test_source_namespace_is_never_a_target(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src = make_namespace(labels={"sel": "x"})
    other = make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[src, other], target_name="copy")
    eventually(lambda: k8s.copy_data(other, "copy") == DATA)
    assert eventually(lambda: failures(k8s, g).get(src)) == "SourceNamespace"
    assert k8s.copy(src, "copy") is None


def test_new_namespace_matching_selector_gets_a_copy(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src = make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), selector={"matchLabels": {"consumer": src}})
    eventually(lambda: k8s.status(g).get("targets") is not None)
    late = make_namespace(labels={"consumer": src})
    assert eventually(lambda: k8s.copy_data(late, "hub")) == DATA


def _reason(k8s: Cluster, grant: str, reason: str) -> bool:
    return (k8s.condition(grant, "SourceAvailable") or {}).get("reason") == reason


@dataclass(frozen=True)
class Unwanted:
    """One way a copy stops being wanted, the policy that then decides, what the status says."""

    act: Callable[[Cluster, client.CoreV1Api, str, str], object]
    """(k8s, core, source namespace, target namespace): what the admin or producer does."""
    settled: Callable[[Cluster, str], bool]
    """The grant's status once the controller has seen it."""
    policy: str = "on_revoke"
    selector: bool = False
    """The grant targets a labelled namespace by selector, not by name."""
    denied: int | None = None
    """The status's denied count afterwards, where the row says it."""


UNWANTED = {
    "namespace-relabelled-out": Unwanted(
        lambda _k8s, core, _src, ns: core.patch_namespace(
            ns, {"metadata": {"labels": {"consumer": None}}}
        ),
        lambda k8s, g: k8s.status(g)["targets"]["matched"] == 0,
        selector=True,
    ),
    "export-label-removed": Unwanted(
        lambda k8s, _core, src, _ns: k8s.patch_secret(
            src, "hub", {"metadata": {"labels": {"projector.nebari.dev/export": None}}}
        ),
        lambda k8s, g: _reason(k8s, g, "NotExported"),
        denied=1,
    ),
    "source-deleted": Unwanted(
        lambda _k8s, core, src, _ns: core.delete_namespaced_secret("hub", src),
        lambda k8s, g: _reason(k8s, g, "SourceMissing"),
        policy="on_source_deleted",
    ),
}


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
@pytest.mark.parametrize("why", UNWANTED.values(), ids=UNWANTED.keys())
def test_a_copy_no_longer_wanted_follows_its_policy(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    core_v1: client.CoreV1Api,
    why: Unwanted,
    policy: str,
) -> None:
    """Delete removes the copy; Retain keeps the last good one (DESIGN §3's revocation rows)."""
    src = make_namespace()
    ns = make_namespace(labels={"consumer": src}) if why.selector else make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant(
        (src, "hub"),
        namespaces=None if why.selector else [ns],
        selector={"matchLabels": {"consumer": src}} if why.selector else None,
        on_revoke=policy if why.policy == "on_revoke" else None,
        on_source_deleted=policy if why.policy == "on_source_deleted" else None,
    )
    eventually(lambda: k8s.copy_data(ns, "hub") == DATA)
    why.act(k8s, core_v1, src, ns)
    eventually(lambda: why.settled(k8s, g))
    if policy == "Delete":
        eventually(lambda: k8s.copy(ns, "hub") is None)
    else:
        assert k8s.copy_data(ns, "hub") == DATA  # the last good copy is kept
    if why.denied is not None:
        assert k8s.status(g)["targets"]["denied"] == why.denied


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_grant_deleted_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a], on_revoke=policy)
    eventually(lambda: k8s.copy_data(a, "hub") == DATA)
    eventually(lambda: ready(k8s, g) and controller.idle())
    kept = k8s.version(a, "hub")
    before = controller.reconciled(g)
    k8s.delete_grant(g)
    if policy == "Delete":
        eventually(lambda: k8s.copy(a, "hub") is None)
    else:  # the deletion of THIS grant was reconciled, and left its copy as it was
        eventually(lambda: controller.reconciled(g) > before and controller.idle())
        assert kept is not None and k8s.version(a, "hub") == kept


def test_key_filter_and_rename(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    k8s.grant(
        (src, "hub"),
        namespaces=[a],
        keys=[{"from": "token", "to": "api-token"}],
        target_name="contract",
    )
    assert eventually(lambda: k8s.copy_data(a, "contract")) == {"api-token": DATA["token"]}


# -- a ProjectionExport, and the producer's key scope -------------------------------------------


def export_status(k8s: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The export's status once projector has written one that counts a copy."""
    obj = k8s.custom.get_namespaced_custom_object(
        "projector.nebari.dev", "v1alpha1", namespace, "projectionexports", name
    )
    status = cast(dict[str, Any], obj).get("status") or {}
    return status if status.get("copies") else None


def producer_told(k8s: Cluster, namespace: str, name: str) -> list[str]:
    """The messages of the Warnings recorded on the producer's object: consent lost."""
    events = k8s.core.list_namespaced_event(namespace).items
    return [
        str(e.message)
        for e in events
        if e.reason == "CopyConsentWithdrawn" and e.involved_object.name == name
    ]


def untouched_by_projector(k8s: Cluster, namespace: str, name: str) -> bool:
    """No field of the object was ever written by a manager of projector's."""
    obj = k8s.core.read_namespaced_secret(name, namespace)
    return not any((m.manager or "").startswith("projector") for m in obj.metadata.managed_fields)


def test_an_unlabelled_source_an_export_names_is_projected_as_a_labelled_one(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, exported=False)  # a third-party chart's Secret: no label
    export = k8s.export(src, "hub", [a])
    g = k8s.grant((src, "hub"), namespaces=[a, b])
    assert eventually(lambda: k8s.copy_data(a, "hub")) == DATA
    eventually(lambda: denied(k8s, g) == 1)  # b: the export does not reach it
    assert k8s.copy(b, "hub") is None
    k8s.patch_secret(src, "hub", {"data": {"token": "CANARY-token-3"}})
    want = {**DATA, "token": "CANARY-token-3"}
    eventually(lambda: k8s.copy_data(a, "hub") == want)  # its changes arrive as events
    assert untouched_by_projector(k8s, src, "hub")
    # the producer sees where it goes: the source found, the grant, one namespace with a copy
    status = eventually(lambda: export_status(k8s, src, export))
    assert status["grants"] == [g] and status["copies"] == 1
    assert status["conditions"][0]["type"] == "SourceFound"
    assert status["conditions"][0]["status"] == "True"


@pytest.mark.parametrize("via", ["export", "annotation"])
def test_the_producers_key_scope_is_a_hard_boundary(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, via: str
) -> None:
    src, a = make_namespace(), make_namespace()
    if via == "export":
        k8s.source(src, "hub", DATA, exported=False)
        k8s.export(src, "hub", ["*"], keys=["token"])
    else:
        k8s.source(src, "hub", DATA, export_to="*")
        scope = {"projector.nebari.dev/export-keys": "token"}
        k8s.patch_secret(src, "hub", {"metadata": {"annotations": scope}})
    k8s.grant((src, "hub"), namespaces=[a])  # no keys: exactly the exported ones
    assert eventually(lambda: k8s.copy_data(a, "hub")) == {"token": DATA["token"]}
    other = k8s.grant((src, "hub"), namespaces=[a], keys=[{"from": "other"}], target_name="o")
    eventually(lambda: failures(k8s, other).get(a) == "KeyNotExported")
    listed = {f["namespace"]: f["message"] for f in k8s.status(other)["failures"]}
    assert "'other'" in listed[a]  # the refused key, named
    assert k8s.copy(a, "o") is None  # no partial copy
    assert untouched_by_projector(k8s, src, "hub")


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_an_export_narrowed_then_deleted_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", CANARY, exported=False)
    e = k8s.export(src, "hub", [a, b])
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(a, "hub") == CANARY and k8s.copy_data(b, "hub") == CANARY)
    eventually(lambda: denied(k8s, g) == 0)
    k8s.patch_export(src, e, {"to": [a]})
    eventually(lambda: denied(k8s, g) == 1)
    revoked_by(k8s, policy, b, kept=a)
    # the producer is told where its data was readable, whatever onRevoke did with the copy
    told = eventually(lambda: producer_told(k8s, src, "hub"))
    assert b in told[0] and "rotating it may be due" in told[0]
    k8s.delete_export(src, e)
    eventually(lambda: denied(k8s, g) == 2)
    if policy == "Delete":
        eventually(lambda: k8s.copy(a, "hub") is None)
    else:
        assert k8s.copy_data(a, "hub") == CANARY


TLS = {"tls.crt": "CANARY-cert", "tls.key": "CANARY-key"}


@pytest.mark.parametrize(
    ("keys", "want_type"),
    [
        pytest.param(None, "kubernetes.io/tls", id="whole"),
        pytest.param([{"from": "tls.crt"}], "Opaque", id="partial"),
        pytest.param(
            [{"from": "tls.crt"}, {"from": "tls.key", "to": "key"}], "Opaque", id="renamed"
        ),
    ],
)
def test_typed_secret(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    keys: list[dict[str, str]] | None,
    want_type: str,
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "tls", TLS, export_to="*", type_="kubernetes.io/tls")
    k8s.grant((src, "tls"), namespaces=[a], keys=keys)
    copy = eventually(lambda: k8s.copy(a, "tls"))
    assert copy.type == want_type


def test_drift_is_corrected(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    core_v1: client.CoreV1Api,
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    k8s.grant((src, "hub"), namespaces=[a])
    eventually(lambda: k8s.copy_data(a, "hub") == DATA)
    k8s.patch_secret(a, "hub", {"data": {"token": "CANARY-tampered", "extra": "CANARY-extra"}})
    eventually(lambda: k8s.copy_data(a, "hub") == DATA)
    source_note = "projector.nebari.dev/source"
    k8s.patch_secret(a, "hub", {"metadata": {"annotations": {source_note: "elsewhere/x"}}})
    eventually(lambda: k8s.copy(a, "hub").metadata.annotations[source_note] == f"{src}/hub")
    # Metadata that other tools add is theirs: tolerated, not fought over (no write at all;
    # the copy still holds what its grant wants, so the event does not even wake the grant).
    eventually(controller.idle)
    before = controller.writes()
    seen = controller.metric("projector_informer_events_total", kind="copies", type="MODIFIED")
    k8s.patch_secret(a, "hub", {"metadata": {"labels": {"team": "blue"}}})
    labelled = k8s.copy(a, "hub").metadata.resource_version
    eventually(  # the controller saw their change, and acted on all it saw
        lambda: (
            controller.metric("projector_informer_events_total", kind="copies", type="MODIFIED")
            > seen
            and controller.idle()
        )
    )
    assert controller.writes() == before
    assert k8s.copy(a, "hub").metadata.resource_version == labelled
    k8s.patch_secret(src, "hub", {"data": {"other": "CANARY-other-2"}})  # a real update ...
    eventually(lambda: (k8s.copy_data(a, "hub") or {}).get("other") == "CANARY-other-2")
    assert k8s.copy(a, "hub").metadata.labels["team"] == "blue"  # ... keeps their label
    data2 = {**DATA, "other": "CANARY-other-2"}
    core_v1.delete_namespaced_secret("hub", a)
    eventually(lambda: k8s.copy_data(a, "hub") == data2)
    # counted once the reconcile's plan has run, after the write the copy shows
    eventually(lambda: controller.metric("projector_drift_corrections_total") >= 1)


def test_unowned_target_is_left_alone(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a = make_namespace(), make_namespace()
    theirs = {"mine": "CANARY-not-yours"}
    k8s.source(a, "hub", theirs, exported=False)
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a])
    assert eventually(lambda: failures(k8s, g).get(a)) == "Conflict"
    assert k8s.copy_data(a, "hub") == theirs
    assert (k8s.condition(g, "Conflicted") or {}).get("status") == "True"
    assert eventually(lambda: [e for e in k8s.events(g) if e.reason == "Conflict"])
    eventually(controller.idle)
    untouched = k8s.copy(a, "hub").metadata.resource_version
    before = controller.reconciled(g)
    k8s.delete_grant(g)
    eventually(lambda: controller.reconciled(g) > before and controller.idle())
    assert k8s.copy(a, "hub").metadata.resource_version == untouched
    assert k8s.copy_data(a, "hub") == theirs


def test_labelled_secret_in_ungranted_namespace_never_receives_data(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a, bystander = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a])
    uid = k8s.get_grant(g)["metadata"]["uid"]
    decoy = {"x": "CANARY-decoy"}
    k8s.source(
        bystander,
        "hub",
        decoy,
        exported=False,
        labels={"projector.nebari.dev/managed-by": "projector", "projector.nebari.dev/grant": g},
    )
    k8s.patch_secret(
        bystander,
        "hub",
        {
            "metadata": {
                "annotations": {
                    "projector.nebari.dev/grant-uid": uid,
                    "projector.nebari.dev/on-revoke": "Retain",
                }
            }
        },
    )
    k8s.patch_secret(src, "hub", {"data": {"token": "CANARY-token-3"}})
    eventually(lambda: (k8s.copy_data(a, "hub") or {}).get("token") == "CANARY-token-3")
    assert k8s.copy_data(bystander, "hub") == decoy


def test_two_grants_on_one_target_older_wins(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    s1, s2, a = make_namespace(), make_namespace(), make_namespace()
    k8s.source(s1, "one", {"v": "CANARY-one"}, export_to="*")
    k8s.source(s2, "two", {"v": "CANARY-two"}, export_to="*")
    # creationTimestamp has 1 s resolution: names break a tie, so make them agree with age.
    older = k8s.grant((s1, "one"), namespaces=[a], target_name="shared", name=f"{a}-a")
    eventually(lambda: k8s.copy_data(a, "shared") == {"v": "CANARY-one"})
    younger = k8s.grant((s2, "two"), namespaces=[a], target_name="shared", name=f"{a}-b")
    assert eventually(lambda: failures(k8s, younger).get(a)) == "GrantConflict"
    assert k8s.copy_data(a, "shared") == {"v": "CANARY-one"}
    ready(k8s, older)
    k8s.delete_grant(older)  # the younger takes over once the older is gone
    eventually(lambda: k8s.copy_data(a, "shared") == {"v": "CANARY-two"})


def test_source_type_change_replaces_the_copy(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    core_v1: client.CoreV1Api,
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "tls", TLS, export_to="*")
    k8s.grant((src, "tls"), namespaces=[a])
    first = eventually(lambda: k8s.copy(a, "tls"))
    core_v1.delete_namespaced_secret("tls", src)
    k8s.source(src, "tls", TLS, export_to="*", type_="kubernetes.io/tls")
    copy = eventually(
        lambda: (c := k8s.copy(a, "tls")) is not None and c.type == "kubernetes.io/tls" and c
    )
    assert copy.metadata.uid != first.metadata.uid
    assert controller.metric("projector_writes_total", action="Replace", result="ok") == 1


def test_immutable_source_gives_mutable_copies(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    core_v1: client.CoreV1Api,
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*", immutable=True)
    k8s.grant((src, "hub"), namespaces=[a])
    copy = eventually(lambda: k8s.copy(a, "hub"))
    assert not copy.immutable
    core_v1.delete_namespaced_secret("hub", src)
    v2 = {**DATA, "token": "CANARY-token-v2"}
    k8s.source(src, "hub", v2, export_to="*", immutable=True)
    eventually(lambda: k8s.copy_data(a, "hub") == v2)


def test_terminating_namespace_is_skipped_quietly(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    core_v1: client.CoreV1Api,
    audit_log: Path,
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    # A finalizer on an object keeps the namespace Terminating for the length of the test.
    core_v1.create_namespaced_config_map(
        a,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="hold", finalizers=["tests.projector.invalid/hold"])
        ),
    )
    k8s.source(src, "hub", DATA, export_to="*")
    try:
        core_v1.delete_namespace(a)
        eventually(lambda: core_v1.read_namespace(a).status.phase == "Terminating")
        started = datetime.now(UTC)
        g = k8s.grant((src, "hub"), namespaces=[a, b])
        eventually(lambda: k8s.copy_data(b, "hub") == DATA)
        eventually(lambda: ready(k8s, g) and controller.idle())
        assert k8s.copy(a, "hub") is None
        assert controller.metric("projector_writes_total", result="error") == 0
        # Skipped: counted as such, and not even tried (a refused create would be a write).
        assert controller.metric("projector_projections", state="NamespaceTerminating") == 1
        assert controller.metric("projector_writes_total", result="ok") == 1  # b's create only
        tried = [
            w
            for w in audit_writes(audit_log, started)
            if w.namespace == a and w.agent.startswith("projector/")
        ]
        assert tried == []
    finally:
        core_v1.patch_namespaced_config_map("hold", a, {"metadata": {"finalizers": None}})


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_copy_orphaned_while_controller_down(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any, policy: str
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    first = start_controller()
    g = k8s.grant((src, "hub"), namespaces=[a], on_revoke=policy)
    eventually(lambda: k8s.copy_data(a, "hub") == DATA)
    kept = k8s.version(a, "hub")
    assert first.stop() == 0
    k8s.delete_grant(g)
    second = start_controller("--debounce=0")
    if policy == "Delete":
        eventually(lambda: k8s.copy(a, "hub") is None)
    else:  # the new controller reconciled the orphan's grant name, and left the copy as it was
        eventually(lambda: second.reconciled(g) > 0 and second.idle())
        assert kept is not None and k8s.version(a, "hub") == kept


def test_restart_with_everything_up_to_date_writes_nothing(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any
) -> None:
    src = make_namespace()
    targets = [make_namespace() for _ in range(3)]
    k8s.source(src, "hub", DATA, export_to="*")
    first = start_controller("--debounce=0")
    g = k8s.grant((src, "hub"), namespaces=targets)
    conflicted = make_namespace()
    k8s.source(conflicted, "hub", {"x": "CANARY-x"}, exported=False)
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [*targets, conflicted]}}})
    eventually(lambda: failures(k8s, g).get(conflicted) == "Conflict")
    eventually(lambda: all(k8s.copy_data(ns, "hub") == DATA for ns in targets))
    eventually(lambda: k8s.observed(g) and first.idle())
    versions = {ns: k8s.copy(ns, "hub").metadata.resource_version for ns in targets}
    grant_rv = k8s.get_grant(g)["metadata"]["resourceVersion"]
    assert first.stop() == 0
    second = start_controller("--debounce=0")
    eventually(lambda: second.reconciled(g) > 0 and second.idle())  # it did look, and wrote nothing
    assert second.writes() == 0
    assert {ns: k8s.copy(ns, "hub").metadata.resource_version for ns in targets} == versions
    assert k8s.get_grant(g)["metadata"]["resourceVersion"] == grant_rv


# --- the rows where they bite: the narrow side of each change -------------------------------------

CANARY = {"token": "ROWS-canary-1"}
"""The data of the second part's sources (the first part's are `DATA`)."""


def revoked_by(k8s: Cluster, policy: str, ns: str, *, kept: str) -> None:
    """The copy in `ns` went (Delete) or stayed as it was (Retain); the one in `kept` stayed."""
    if policy == "Delete":
        eventually(lambda: k8s.copy(ns, "hub") is None)
    else:
        assert k8s.copy_data(ns, "hub") == CANARY
    assert k8s.copy_data(kept, "hub") == CANARY


def denied(k8s: Cluster, grant: str) -> int:
    return int(k8s.status(grant)["targets"]["denied"])


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_narrowing_export_to_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", CANARY, export_to=f"{a},{b}")
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(a, "hub") == CANARY and k8s.copy_data(b, "hub") == CANARY)
    eventually(lambda: denied(k8s, g) == 0)  # the status follows the copies
    k8s.patch_secret(
        src, "hub", {"metadata": {"annotations": {"projector.nebari.dev/export-to": a}}}
    )
    eventually(lambda: denied(k8s, g) == 1)
    revoked_by(k8s, policy, b, kept=a)


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_a_namespace_removed_from_the_grant_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", CANARY, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(b, "hub") == CANARY)
    eventually(lambda: k8s.status(g)["targets"]["matched"] == 2)  # the status follows the copies
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [a]}}})
    eventually(lambda: k8s.status(g)["targets"]["matched"] == 1)
    revoked_by(k8s, policy, b, kept=a)


def test_the_source_namespace_with_the_source_name_is_refused_and_the_source_untouched(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """The copy would overwrite the source itself: a condition, and no write at all."""
    src, other = make_namespace(), make_namespace()
    source = k8s.source(src, "hub", CANARY, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[src, other])  # the target name defaults to "hub"
    eventually(lambda: k8s.copy_data(other, "hub") == CANARY)
    failures = eventually(lambda: k8s.status(g).get("failures"))
    assert [(f["namespace"], f["reason"]) for f in failures] == [(src, "SourceNamespace")]
    now = k8s.core.read_namespaced_secret("hub", src)
    assert now.metadata.resource_version == source.metadata.resource_version
    assert "projector.nebari.dev/grant-uid" not in (now.metadata.annotations or {})


@pytest.mark.parametrize("selected", [False, True], ids=["listed", "selected"])
def test_a_copy_in_the_namespace_the_source_moves_into_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, selected: bool
) -> None:
    """Issue 42: the grant's source moves into a namespace where it holds a copy; that one is
    the source's own namespace now, never a target, and its copy (onRevoke Delete) goes."""
    label = {"projector-test/moved": unique_name("m")}
    p1, p2 = make_namespace(), make_namespace(labels=label)
    k8s.source(p1, "s", CANARY, export_to="*")
    k8s.source(p2, "other", {"token": "ROWS-canary-other"}, export_to="*")
    target = {"selector": {"matchLabels": label}} if selected else {"namespaces": [p2]}
    g = k8s.grant((p1, "s"), target_name="copy", on_revoke="Delete", **target)
    eventually(lambda: k8s.copy_data(p2, "copy") == CANARY)
    k8s.patch_grant(g, {"spec": {"source": {"namespace": p2, "name": "other"}}})
    eventually(lambda: k8s.copy(p2, "copy") is None, message="the stranded copy is revoked")
    assert k8s.copy_data(p2, "other") == {"token": "ROWS-canary-other"}  # the source untouched


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_a_namespace_untargeted_while_the_controller_is_down_follows_its_recorded_policy(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", CANARY, export_to="*")
    first = start_controller()
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(b, "hub") == CANARY)
    kept = k8s.version(b, "hub")
    assert first.stop() == 0
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [a]}}})
    second = start_controller("--debounce=0")
    eventually(lambda: k8s.observed(g)["targets"]["matched"] == 1)
    if policy == "Delete":
        eventually(lambda: k8s.copy(b, "hub") is None)
    else:
        eventually(second.idle)
        assert kept is not None and k8s.version(b, "hub") == kept


def test_a_denied_consumer_learns_nothing_of_the_source(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """Granted by an admin but not exported to: its namespace gets no Secret and no Event, and
    nothing a consumer can read there names the source."""
    src, allowed, refused = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", CANARY, export_to=allowed)
    g = k8s.grant((src, "hub"), namespaces=[allowed, refused])
    eventually(lambda: k8s.copy_data(allowed, "hub") == CANARY)
    eventually(lambda: denied(k8s, g) == 1)
    assert k8s.core.list_namespaced_secret(refused).items == [] or all(
        not (s.metadata.labels or {}).get("projector.nebari.dev/grant")
        for s in k8s.core.list_namespaced_secret(refused).items
    )
    events = k8s.core.list_namespaced_event(refused).items
    assert not [
        e for e in events if src in json.dumps(k8s.core.api_client.sanitize_for_serialization(e))
    ]
    assert all(f["namespace"] != refused for f in k8s.status(g).get("failures") or ())


def test_a_burst_of_source_changes_is_one_write_per_copy(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    audit_log: Path,
) -> None:
    """50 patches, each well within the debounce (3 s) of the one before, under a maximum wait
    (60 s) no burst reaches: each copy is written once, with the last value.

    A behaviour, not a speed: only the gaps between patches must stay under 3 s. How many
    writes a burst costs at the default debounce, and how fast, is `make bench`'s burst.
    """
    ctl = start_controller("--debounce=3", "--debounce-max=60", "--debounce-hot-max=60")
    src = make_namespace()
    targets = [make_namespace() for _ in range(3)]
    k8s.source(src, "hub", {"token": "burst-canary-0"}, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=targets)
    eventually(lambda: all(k8s.copy_data(ns, "hub") for ns in targets))
    eventually(lambda: k8s.observed(g) and ctl.idle())
    started = datetime.now(UTC)
    values = [f"burst-canary-{i}" for i in range(1, 51)]

    def patch(chunk: list[str]) -> None:
        for v in chunk:
            k8s.patch_secret(src, "hub", {"stringData": {"token": v}})

    # Five senders at once; the last value is sent after all the others have landed.
    threads = [threading.Thread(target=patch, args=(values[i:49:5],)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    patch(values[49:])
    eventually(lambda: all(k8s.copy_data(ns, "hub") == {"token": values[-1]} for ns in targets))
    eventually(ctl.idle)  # nothing of the burst is still debouncing: no write is yet to come
    writes: dict[str, int] = {ns: 0 for ns in targets}
    for w in audit_writes(audit_log, started):
        if (
            w.verb in ("update", "patch", "create")
            and w.resource == "secrets"
            and w.namespace in writes
            and w.agent.startswith("projector/")
        ):
            writes[w.namespace] += 1
    assert writes == {ns: 1 for ns in targets}, writes


def test_unsatisfiable_grants_are_told_once_and_not_retried_in_a_loop(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
) -> None:
    """Valid grants the world cannot satisfy yet: a listed namespace that does not exist, a
    source that does not exist, a source that has not opted in. Each gets Ready=False with the
    reason and one Warning Event; nothing is written; the controller does not keep reconciling
    them; and each is satisfied as soon as the world catches up."""
    controller = start_controller()
    src, b, c = make_namespace(), make_namespace(), make_namespace()
    missing = unique_name("rows-missing")
    k8s.source(src, "hub", CANARY, export_to="*")
    k8s.source(src, "plain", {"token": "ROWS-canary-plain"}, exported=False, export_to="*")
    reasons = {
        k8s.grant((src, "hub"), namespaces=[missing]): "NamespaceMissing",
        k8s.grant((src, "ghost"), namespaces=[b]): "SourceMissing",
        k8s.grant((src, "plain"), namespaces=[c]): "NotExported",
    }

    def ready_reasons() -> dict[str, str]:
        return {g: (k8s.condition(g, "Ready") or {}).get("reason", "") for g in reasons}

    def warnings() -> dict[str, list[str]]:
        return {g: [str(e.reason) for e in k8s.events(g) if e.type == "Warning"] for g in reasons}

    eventually(lambda: ready_reasons() == reasons, timeout=60)
    assert all((k8s.condition(g, "Ready") or {}).get("status") == "False" for g in reasons)
    assert {f["namespace"]: f["reason"] for f in k8s.status(next(iter(reasons)))["failures"]} == {
        missing: "NamespaceMissing"
    }
    eventually(lambda: all(reasons[g] in w for g, w in warnings().items()), timeout=60)
    eventually(controller.idle, timeout=60)

    def runs(c: ControllerProcess) -> int:
        return sum(c.reconciled(g) for g in reasons)

    reconciles = runs(controller)
    statuses = controller.metric("projector_status_writes_total")
    bound = 2  # a hot loop at a 20 ms debounce would do about 150 in the window
    consistently(
        lambda: (
            runs(controller) <= reconciles + bound
            and controller.metric("projector_status_writes_total") <= statuses + bound
        ),
        duration=3,
        message="an unsatisfiable grant is reconciled again and again",
    )
    assert controller.metric("projector_writes_total") == 0  # not one copy written
    # a restart reconciles each grant again in the same state: still told once, not per reconcile
    assert controller.stop() == 0
    again = start_controller()
    eventually(lambda: all(again.reconciled(g) >= 1 for g in reasons) and again.idle(), timeout=60)
    told = warnings()
    assert all(told[g].count(r) == 1 for g, r in reasons.items()), told  # told once, not per retry
    assert k8s.copy(b, "ghost") is None and k8s.copy(c, "plain") is None

    make_namespace(missing)
    k8s.source(src, "ghost", {"token": "ROWS-canary-ghost"}, export_to="*")
    k8s.patch_secret(
        src, "plain", {"metadata": {"labels": {"projector.nebari.dev/export": "true"}}}
    )
    eventually(lambda: k8s.copy_data(missing, "hub") == CANARY, timeout=60)
    eventually(lambda: k8s.copy_data(b, "ghost") == {"token": "ROWS-canary-ghost"}, timeout=60)
    eventually(lambda: k8s.copy_data(c, "plain") == {"token": "ROWS-canary-plain"}, timeout=60)
    eventually(lambda: set(ready_reasons().values()) == {"Projected"}, timeout=60)


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
def test_a_cleared_conflict_is_noticed_within_the_usual_latency(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, kind: str
) -> None:
    """A foreign, unlabelled object of the copy's name blocks it (no informer caches it); once
    its owner deletes it, the copy lands within seconds, not at the next conflict recheck (60 s,
    the controller's default here): a watch of that name, metadata only, saw it go."""
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    theirs = {"mine": f"ROWS-canary-theirs-{kind}"}
    if kind == "Secret":
        k8s.source(a, "hub", theirs, exported=False)
        k8s.source(src, "hub", CANARY, export_to="*")
        g = k8s.grant((src, "hub"), namespaces=[a, b])
        copy_data, delete = k8s.copy_data, k8s.core.delete_namespaced_secret
    else:
        k8s.config_source(a, "hub", theirs, exported=False)
        k8s.config_source(src, "hub", CANARY, export_to="*")
        g = k8s.grant((src, "hub"), namespaces=[a, b], kind=kind)
        copy_data, delete = k8s.config_data, k8s.core.delete_namespaced_config_map
    eventually(lambda: copy_data(b, "hub") == CANARY)
    eventually(lambda: k8s.status(g)["targets"]["conflicted"] == 1)
    assert copy_data(a, "hub") == theirs
    # The watch has listed the place: from here on a deletion is an event, not a recheck.
    eventually(lambda: "conflict place listed" in controller.logs(), timeout=10)
    delete("hub", a)
    eventually(lambda: copy_data(a, "hub") == CANARY, timeout=10, message="the copy landed")
    eventually(lambda: k8s.status(g)["targets"]["conflicted"] == 0, timeout=10)
    assert "conflict cleared; waking" in controller.logs()
