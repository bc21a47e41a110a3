"""The hostile tenant (issue 36), on the real API server with the shipped RBAC.

A tenant may create and edit Secrets in its own namespace, labels and annotations included.
Each attack the security review ran is run again here, and its outcome asserted: one hostile
object stalls nobody, objects no grant names cost their metadata only, and credentials of the
cluster, projector's own copies and protected namespaces are never projected from or into.
The admission policy's side (a stolen token) is `test_admission_hostile.py`.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from typing import Any

from kubernetes import client

from tests.bed.kube import eventually
from tests.bed.launcher import ControllerProcess
from tests.support import Cluster, NamespaceFactory

EXPORT = "projector.nebari.dev/export"
EXPORT_TO = "projector.nebari.dev/export-to"
BOMB = ",".join(f"-bad-{i}" for i in range(20000))
"""The review's export-to: 20,000 invalid entries, 240 KiB, under the API server's limit."""


def watch_healthz(cp: ControllerProcess, stop: threading.Event, seen: list[int]) -> None:
    """GET /healthz back to back until `stop`: each status (0 when it did not answer in 5 s)."""
    while not stop.is_set():
        seen.append(cp.get("/healthz")[0])


def sources_added(cp: ControllerProcess) -> float:
    return cp.metric("projector_informer_events_total", kind="sources", type="ADDED") + cp.metric(
        "projector_informer_events_total", kind="sources", type="MODIFIED"
    )


def test_an_export_to_bomb_stalls_nobody(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """A tenant's 240 KiB export-to, patched again and again: /healthz answers throughout, an
    unrelated grant's change lands, and a grant naming the bomb is told why it is ignored."""
    tenant, src, dst = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "HOSTILE-canary-1"}, export_to=dst)
    legit = k8s.grant((src, "hub"), namespaces=[dst])
    eventually(lambda: k8s.copy_data(dst, "hub") == {"token": "HOSTILE-canary-1"})
    k8s.source(tenant, "bomb", {"k": "HOSTILE-canary-bomb-0"}, export_to=BOMB)
    stop, seen = threading.Event(), list[int]()
    prober = threading.Thread(target=watch_healthz, args=(controller, stop, seen))
    prober.start()
    try:
        before = sources_added(controller)
        for i in range(1, 21):
            k8s.patch_secret(tenant, "bomb", {"data": {"k": f"HOSTILE-canary-bomb-{i}"}})
        eventually(lambda: sources_added(controller) >= before + 20, message="bombs seen")
        k8s.patch_secret(src, "hub", {"data": {"token": "HOSTILE-canary-2"}})
        eventually(lambda: k8s.copy_data(dst, "hub") == {"token": "HOSTILE-canary-2"})
    finally:
        stop.set()
        prober.join()
    assert seen and set(seen) == {200}, f"/healthz answered {seen.count(200)} of {len(seen)}"
    told = eventually(lambda: warnings(k8s, tenant, "bomb"), message="the producer is told")
    assert len(told) == 1 and "ignored as a whole" in str(told[0].message)  # once, not per event
    named = k8s.grant((tenant, "bomb"), namespaces=[dst])
    why = eventually(lambda: (k8s.condition(named, "SourceAvailable") or {}).get("message"))
    assert "ignored as a whole" in str(why)
    assert k8s.copy(dst, "bomb") is None  # nobody, never a guess at part of it
    assert k8s.status(legit)["targets"]["projected"] == 1


def warnings(k8s: Cluster, namespace: str, name: str) -> list[client.CoreV1Event]:
    """The ExportToIgnored Warning Events about a Secret."""
    selector = f"involvedObject.name={name},reason=ExportToIgnored"
    return list(k8s.core.list_namespaced_event(namespace, field_selector=selector).items)


COUNT, SIZE = 120, 700 * 1024


def test_exported_secrets_no_grant_names_cost_metadata_not_data(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """120 unnamed 700 KiB export-labelled Secrets (84 MB of data) raise the RSS by at most
    30 MB; a grant created afterwards for one of them still projects it."""
    tenant, dst = make_namespace(), make_namespace()
    eventually(controller.idle)
    base = controller.rss_mib()
    before = sources_added(controller)
    values = {}
    for i in range(COUNT):
        values[i] = f"HOSTILE-big-{i}-" + secrets.token_urlsafe(SIZE)[: SIZE - 20]
        k8s.source(tenant, f"big-{i}", {"blob": values[i]}, export_to="*")
    eventually(
        lambda: sources_added(controller) >= before + COUNT, timeout=60, message="all cached"
    )
    grown = controller.rss_mib() - base
    print(f"RSS {base:.1f} MiB, +{grown:.1f} MiB with {COUNT} unnamed {SIZE // 1024} KiB Secrets")
    assert grown * 1.048576 <= 30, f"+{grown:.1f} MiB"
    started = time.monotonic()
    k8s.grant((tenant, "big-7"), namespaces=[dst])
    eventually(lambda: k8s.copy_data(dst, "big-7") == {"blob": values[7]}, timeout=30)
    print(f"a grant created afterwards projected it in {time.monotonic() - started:.2f} s")


def test_credentials_copies_and_protected_namespaces_are_refused(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any
) -> None:
    """A grant whose source is a ServiceAccount or bootstrap token, or one of projector's own
    copies, writes nothing and says why; a protected namespace is never written into."""
    src, dst, guarded = make_namespace(), make_namespace(), make_namespace()
    start_controller(f"--protected-namespaces={guarded}")
    k8s.core.create_namespaced_secret(
        src,
        client.V1Secret(
            metadata=client.V1ObjectMeta(
                name="sa-token",
                labels={"projector.nebari.dev/export": "true"},
                annotations={EXPORT_TO: "*", "kubernetes.io/service-account.name": "default"},
            ),
            type="kubernetes.io/service-account-token",
        ),
    )
    k8s.source(
        src,
        "boot",
        {"token-id": "abcdef", "token-secret": "HOSTILE-canary-boot"},
        export_to="*",
        type_="bootstrap.kubernetes.io/token",
    )
    k8s.source(src, "hub", {"token": "HOSTILE-canary-hub"}, export_to="*")
    hub = k8s.grant((src, "hub"), namespaces=[dst, guarded])
    eventually(lambda: k8s.copy_data(dst, "hub") == {"token": "HOSTILE-canary-hub"})
    failures = eventually(lambda: k8s.status(hub).get("failures"))
    assert [(f["namespace"], f["reason"]) for f in failures] == [(guarded, "ProtectedNamespace")]
    # The consumer opts the copy in as if it were its own contract: still never a source.
    k8s.core.patch_namespaced_secret(
        "hub",
        dst,
        {
            "metadata": {
                "labels": {EXPORT: "true"},
                "annotations": {EXPORT_TO: "*"},
            }
        },
    )
    refused = [
        k8s.grant((src, "sa-token"), namespaces=[dst]),
        k8s.grant((src, "boot"), namespaces=[dst]),
    ]
    copy_grant = k8s.grant((dst, "hub"), namespaces=[guarded, src], target_name="copy-of-copy")
    for g in refused:
        cond = eventually(functools.partial(k8s.condition, g, "SourceAvailable"))
        assert (cond["status"], cond["reason"]) == ("False", "SourceRefused"), cond
    # The copy's opt-in markers are projector's prefix: drift correction takes them off again,
    # and until it has, the copy is refused as a source (SourceRefused, then NotExported).
    eventually(lambda: copy_labels(k8s, dst) and EXPORT not in copy_labels(k8s, dst))
    cond = eventually(functools.partial(k8s.condition, copy_grant, "SourceAvailable"))
    assert cond["status"] == "False" and cond["reason"] in ("SourceRefused", "NotExported"), cond
    assert k8s.copy(dst, "sa-token") is None and k8s.copy(dst, "boot") is None
    assert k8s.copy(src, "copy-of-copy") is None and k8s.copy(guarded, "hub") is None


def copy_labels(k8s: Cluster, namespace: str) -> dict[str, str]:
    found = k8s.copy(namespace, "hub")
    return {} if found is None else dict(found.metadata.labels or {})
