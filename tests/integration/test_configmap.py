"""ConfigMap grants on the real API server: DESIGN §3's rows for `spec.source.kind: ConfigMap`.

The copy of a ConfigMap is a ConfigMap (data and binaryData), under the same two-sided consent,
ownership, policies and drift correction as a Secret's; a Secret is never projected as a
ConfigMap. A Secret and a ConfigMap of one name in one namespace are two places: two grants
projecting them both succeed, and revoking one never touches the other. Every value is a
canary (the controller's logs, metrics, the grants' statuses and Events are scanned for it).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from tests.bed.controlplane.plane import ControlPlane
from tests.bed.kube import eventually
from tests.bed.launcher import ControllerProcess, explain, validate
from tests.support import Cluster, NamespaceFactory, consistently

CM = "ConfigMap"
EXPORT_TO = "projector.nebari.dev/export-to"
DATA = {"hub-url": "http://hub.CM-canary-1.svc:8081", "client-id": "CM-canary-2"}
BINARY = {"logo.png": b"PNG CM-canary-3"}
BOTH = DATA | {k: v.decode() for k, v in BINARY.items()}


def holds(k8s: Cluster, namespace: str, data: dict[str, str]) -> bool:
    """The ConfigMap copy `hub` in `namespace` holds exactly `data` (binaryData decoded)."""
    return k8s.config_data(namespace, "hub") == data


def projected_once(k8s: Cluster, grant: str) -> bool:
    return int(k8s.observed(grant)["targets"]["projected"]) == 1


def test_a_configmap_is_projected_as_a_configmap_with_data_and_binary_data(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """Project, update, Ready: the copies are ConfigMaps, and no Secret is written."""
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.config_source(src, "hub", DATA, binary=BINARY, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a, b], kind=CM)
    for ns in (a, b):
        eventually(functools.partial(holds, k8s, ns, BOTH))
        copy = k8s.config_copy(ns, "hub")
        assert copy is not None and copy.binary_data == {
            "logo.png": base64.b64encode(BINARY["logo.png"]).decode()
        }
        assert copy.metadata.labels["projector.nebari.dev/grant"] == g
        assert k8s.copy(ns, "hub") is None  # never a Secret
    status = eventually(lambda: k8s.observed(g))
    assert status["targets"]["projected"] == 2
    ready = k8s.condition(g, "Ready")
    assert ready is not None and ready["status"] == "True"
    source_ok = k8s.condition(g, "SourceAvailable")
    assert source_ok is not None and "ConfigMap" in source_ok["message"]

    # "source data changes": every copy updated
    k8s.patch_config_map(src, "hub", {"data": {"client-id": "CM-canary-4"}})
    for ns in (a, b):
        eventually(functools.partial(holds, k8s, ns, BOTH | {"client-id": "CM-canary-4"}))


def test_drift_in_a_configmap_copy_is_corrected(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a = make_namespace(), make_namespace()
    k8s.config_source(src, "hub", DATA, binary=BINARY, export_to=a)
    k8s.grant((src, "hub"), namespaces=[a], kind=CM)
    eventually(lambda: k8s.config_data(a, "hub") == BOTH)
    k8s.core.patch_namespaced_config_map("hub", a, {"data": {"hub-url": "http://evil"}})
    eventually(lambda: k8s.config_data(a, "hub") == BOTH, message="edited data restored")
    k8s.core.patch_namespaced_config_map("hub", a, {"binaryData": {"logo.png": "AAAA"}})
    eventually(lambda: k8s.config_data(a, "hub") == BOTH, message="edited binaryData restored")
    k8s.core.delete_namespaced_config_map("hub", a)
    eventually(lambda: k8s.config_data(a, "hub") == BOTH, message="deleted copy re-created")


@pytest.mark.parametrize(
    ("deleted", "policy"),
    [("grant", "Delete"), ("grant", "Retain"), ("source", "Retain"), ("source", "Delete")],
)
def test_a_deleted_configmap_grant_or_source_follows_its_policy(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    deleted: str,
    policy: str,
) -> None:
    """A grant deleted follows its onRevoke, a source deleted its grant's onSourceDeleted (once
    the grant is gone, or says SourceMissing): Delete removes the copy, Retain keeps it."""
    src, a = make_namespace(), make_namespace()
    k8s.config_source(src, "hub", DATA, export_to="*")
    g = k8s.grant(
        (src, "hub"),
        namespaces=[a],
        kind=CM,
        on_revoke=policy if deleted == "grant" else None,
        on_source_deleted=policy if deleted == "source" else None,
    )
    eventually(lambda: k8s.config_data(a, "hub") == DATA)
    if deleted == "grant":
        k8s.delete_grant(g)
        eventually(lambda: k8s.grant_gone(g))
    else:
        k8s.core.delete_namespaced_config_map("hub", src)
        eventually(
            lambda: (k8s.condition(g, "SourceAvailable") or {}).get("reason") == "SourceMissing"
        )
    if policy == "Delete":
        eventually(lambda: k8s.config_copy(a, "hub") is None)
    else:
        consistently(lambda: k8s.config_data(a, "hub") == DATA, duration=2.0)


def test_withdrawn_consent_revokes_and_missing_consent_projects_nothing(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """The export label removed: the copy goes (onRevoke Delete), Denied; no export-to: nobody."""
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.config_source(src, "hub", DATA, export_to=a)
    k8s.config_source(src, "quiet", DATA)  # exported, but no export-to: nobody
    g = k8s.grant((src, "hub"), namespaces=[a], kind=CM)
    quiet = k8s.grant((src, "quiet"), namespaces=[b], kind=CM)
    eventually(lambda: k8s.config_data(a, "hub") == DATA)
    eventually(lambda: k8s.observed(quiet)["targets"]["denied"] == 1)
    assert k8s.config_copy(b, "quiet") is None
    k8s.patch_config_map(
        src, "hub", {"metadata": {"labels": {"projector.nebari.dev/export": None}}}
    )
    eventually(lambda: k8s.config_copy(a, "hub") is None, message="copy revoked")
    eventually(lambda: k8s.status(g)["targets"]["denied"] == 1)


def test_an_unowned_configmap_of_the_target_name_is_left_alone(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    theirs = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="hub"), data={"mine": "not-projectors"}
    )
    k8s.core.create_namespaced_config_map(a, theirs)
    before = k8s.config_copy(a, "hub")
    assert before is not None
    k8s.config_source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a, b], kind=CM)
    eventually(lambda: k8s.config_data(b, "hub") == DATA)
    eventually(lambda: k8s.status(g)["targets"]["conflicted"] == 1)
    conflicted = k8s.condition(g, "Conflicted")
    assert conflicted is not None and "ConfigMap" in conflicted["message"]
    after = k8s.config_copy(a, "hub")
    assert after is not None and after.metadata.resource_version == before.metadata.resource_version
    assert after.data == {"mine": "not-projectors"}


def test_a_secret_is_never_projected_as_a_configmap(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """A ConfigMap grant naming an exported Secret finds no ConfigMap: nothing is written."""
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "CM-canary-5"}, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a], kind=CM)
    status = eventually(lambda: k8s.observed(g))
    assert (k8s.condition(g, "SourceAvailable") or {}).get("reason") == "SourceMissing", status
    assert k8s.config_copy(a, "hub") is None and k8s.copy(a, "hub") is None
    # and the reverse: a Secret grant naming an exported ConfigMap
    k8s.config_source(src, "endpoints", DATA, export_to="*")
    g2 = k8s.grant((src, "endpoints"), namespaces=[a])
    eventually(lambda: k8s.observed(g2))
    assert k8s.copy(a, "endpoints") is None and k8s.config_copy(a, "endpoints") is None


def test_a_secret_and_a_configmap_of_one_name_in_one_namespace_never_collide(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """Secret `x` and ConfigMap `x` projected into one namespace by two grants: both land, and
    revoking either leaves the other exactly as it was (same resourceVersion)."""
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "x", {"token": "CM-canary-6"}, export_to="*")
    k8s.config_source(src, "x", DATA, export_to="*")
    secret_grant = k8s.grant((src, "x"), namespaces=[a])
    cm_grant = k8s.grant((src, "x"), namespaces=[a], kind=CM)
    eventually(lambda: k8s.copy_data(a, "x") == {"token": "CM-canary-6"})
    eventually(lambda: k8s.config_data(a, "x") == DATA)
    for g in (secret_grant, cm_grant):
        eventually(functools.partial(projected_once, k8s, g))
        assert k8s.status(g)["targets"].get("conflicted", 0) == 0

    cm_version = k8s.config_copy(a, "x").metadata.resource_version
    k8s.delete_grant(secret_grant)
    eventually(lambda: k8s.copy(a, "x") is None, message="the Secret copy revoked")
    kept = k8s.config_copy(a, "x")
    assert kept is not None and kept.metadata.resource_version == cm_version

    # and the other way round: a new Secret grant, then the ConfigMap grant revoked
    again = k8s.grant((src, "x"), namespaces=[a])
    eventually(lambda: k8s.copy_data(a, "x") == {"token": "CM-canary-6"})
    eventually(lambda: k8s.observed(again)["targets"]["projected"] == 1)
    secret_version = k8s.version(a, "x")
    k8s.delete_grant(cm_grant)
    eventually(lambda: k8s.config_copy(a, "x") is None, message="the ConfigMap copy revoked")
    consistently(lambda: k8s.version(a, "x") == secret_version, duration=2.0)


def test_explain_and_validate_know_configmap_grants(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    control_plane: ControlPlane,
) -> None:
    src, a, conflicted = make_namespace(), make_namespace(), make_namespace()
    k8s.core.create_namespaced_config_map(
        conflicted, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="hub"))
    )
    k8s.config_source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a, conflicted], kind=CM)
    eventually(lambda: k8s.config_data(a, "hub") == DATA)
    out = explain(control_plane.kubeconfig, g)
    assert out.returncode == 0, out.stderr
    assert "target ConfigMap 'hub'" in out.stdout
    assert f"ConfigMap {conflicted}/hub exists and is not owned by this grant" in out.stdout
    for v in DATA.values():
        assert v not in out.stdout + out.stderr
    checked = validate("grants/")
    assert checked.returncode == 0, checked.stdout + checked.stderr


UNRELATED = 10_000
EXPORTED = 1_000


def create_config_maps(
    core: client.CoreV1Api, namespace: str, prefix: str, n: int, labels: dict[str, str]
) -> None:
    body = {"x": "y" * 8192}  # 8 KiB of data each

    def one(i: int) -> None:
        meta = client.V1ObjectMeta(name=f"{prefix}-{i}", labels=labels or None)
        core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta, data=body))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def test_unrelated_configmaps_cost_nothing(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    record_property: Callable[[str, object], None],
) -> None:
    """10,000 ConfigMaps without the export label never reach the controller: its ConfigMap
    informers see no event, and its RSS barely moves. Side by side, in the same process, 1,000
    exported ConfigMaps (no export-to: consent to nobody) are seen, one event each, and cached.
    Each holds 8 KiB of data.

    RSS is VmRSS of the controller's process, read once it is idle before and after each
    batch; the figures are printed and recorded as test properties.
    """
    src, a = make_namespace(), make_namespace()
    k8s.config_source(src, "hub", DATA, export_to=a)
    k8s.grant((src, "hub"), namespaces=[a], kind=CM)
    eventually(lambda: k8s.config_data(a, "hub") == DATA)
    eventually(controller.idle)

    def events() -> float:
        """Objects the ConfigMap informers received (not their OPEN/BOOKMARK/RELIST signs)."""
        return sum(
            controller.metric("projector_informer_events_total", kind=kind, type=type_)
            for kind in ("configmap-sources", "configmap-copies")
            for type_ in ("ADDED", "MODIFIED", "DELETED")
        )

    before_events, rss0 = events(), controller.rss_mib()
    unrelated = make_namespace()
    create_config_maps(k8s.core, unrelated, "u", UNRELATED, {})
    eventually(controller.idle)
    rss1, after_unrelated = controller.rss_mib(), events()
    exported = make_namespace()
    create_config_maps(k8s.core, exported, "e", EXPORTED, {"projector.nebari.dev/export": "true"})
    eventually(lambda: events() - after_unrelated >= EXPORTED, timeout=120)
    eventually(controller.idle)
    rss2 = controller.rss_mib()
    figures = {
        "rss_before_mib": round(rss0, 1),
        "rss_delta_10000_unrelated_mib": round(rss1 - rss0, 1),
        "rss_delta_1000_exported_mib": round(rss2 - rss1, 1),
        "informer_events_from_unrelated": after_unrelated - before_events,
    }
    for k, v in figures.items():
        record_property(k, v)
    print(f"\nConfigMap memory: {figures}")
    assert after_unrelated == before_events, "an unrelated ConfigMap reached an informer"
    assert rss1 - rss0 < 8, figures


def test_without_configmaps_no_configmap_is_listed_and_their_grants_are_refused(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any
) -> None:
    """--no-configmaps (chart configMaps.enabled=false): Secret grants as ever, no ConfigMap
    listed or written, and a ConfigMap grant says why it is not served (no retry loop)."""
    cp: ControllerProcess = start_controller("--no-configmaps")
    src, dst = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "CM-canary-off"}, export_to=dst)
    k8s.config_source(src, "hub", DATA, export_to=dst)
    secret_grant = k8s.grant((src, "hub"), namespaces=[dst])
    config_grant = k8s.grant((src, "hub"), namespaces=[dst], kind=CM)
    eventually(lambda: k8s.copy_data(dst, "hub") == {"token": "CM-canary-off"})
    cond = eventually(functools.partial(k8s.condition, config_grant, "SourceAvailable"))
    assert (cond["status"], cond["reason"]) == ("False", "SourceRefused"), cond
    assert "--no-configmaps" in cond["message"]
    assert k8s.config_copy(dst, "hub") is None
    eventually(lambda: int(k8s.status(secret_grant)["targets"]["projected"]) == 1)
    listed = sum(
        cp.metric("projector_informer_events_total", kind=kind)
        for kind in ("configmap-sources", "configmap-copies")
    )
    assert listed == 0
    assert cp.reconciled(config_grant, "error") == 0
