"""`projector explain` against the real control plane, as the controller left it.

Arranged: one grant over six namespaces covering every state (projected, denied by the
producer's export-to, conflicted by a foreign Secret, pending on a missing namespace,
terminating), plus grants whose source lacks the export label or the export-to annotation.
explain reads the cluster once and runs the controller's own plan(); its output never carries
a Secret value (every value is a canary, searched for in text and JSON, raw and base64).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from tests.bed.controlplane.plane import ControlPlane
from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import ControllerProcess, explain
from tests.support import Canaries, Cluster, NamespaceFactory


@pytest.fixture
def terminating_namespace(core_v1: client.CoreV1Api, make_namespace: NamespaceFactory) -> Any:
    """A namespace held in Terminating by a ConfigMap's finalizer (released after the test)."""
    name = make_namespace()
    hold = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="hold", finalizers=["projector.test/hold"])
    )
    core_v1.create_namespaced_config_map(name, hold)
    core_v1.delete_namespace(name)
    eventually(lambda: core_v1.read_namespace(name).status.phase == "Terminating")
    yield name
    core_v1.patch_namespaced_config_map("hold", name, {"metadata": {"finalizers": None}})


def test_explain_says_why_per_namespace_and_never_prints_a_value(
    k8s: Cluster,
    core_v1: client.CoreV1Api,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    control_plane: ControlPlane,
    canaries: Canaries,
    terminating_namespace: str,
) -> None:
    src = make_namespace()
    projected, denied, conflicted, other = (make_namespace() for _ in range(4))
    missing = unique_name("explain-missing")
    k8s.source(
        src,
        "hub",
        {"token": "CANARY-explain-1"},
        export_to=f"{projected},{conflicted},{missing},{terminating_namespace},{other}",
    )
    foreign = client.V1Secret(
        metadata=client.V1ObjectMeta(name="hub"), string_data={"mine": "CANARY-explain-2"}
    )
    canaries.add("CANARY-explain-2")
    core_v1.create_namespaced_secret(conflicted, foreign)
    grant = k8s.grant(
        (src, "hub"),
        namespaces=[projected, denied, conflicted, missing, terminating_namespace],
    )
    eventually(lambda: k8s.copy_data(projected, "hub") is not None)
    eventually(lambda: (k8s.status(grant).get("targets") or {}).get("conflicted") == 1)

    text = explain(control_plane.kubeconfig, grant)
    assert text.returncode == 0, text.stderr
    as_json = explain(control_plane.kubeconfig, grant, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    states = {e["namespace"]: (e["state"], e["reason"], e["why"]) for e in report["entries"]}
    assert states[projected][0] == "projected"
    assert states[denied][:2] == ("denied", "Denied")
    assert "export-to" in states[denied][2] and "does not match" in states[denied][2]
    assert states[conflicted][:2] == ("conflicted", "Conflict")
    assert f"Secret {conflicted}/hub" in states[conflicted][2]
    assert states[missing][:2] == ("pending", "NamespaceMissing")
    assert states[terminating_namespace][:2] == ("terminating", "NamespaceTerminating")
    assert report["source"] == f"{src}/hub" and report["source_state"] == "Available"
    for ns in (projected, denied, conflicted, terminating_namespace):
        assert ns in text.stdout

    # one namespace; and one the grant does not target (the admin's consent is missing)
    one = json.loads(explain(control_plane.kubeconfig, grant, "-n", denied, "-o", "json").stdout)
    assert [e["namespace"] for e in one["entries"]] == [denied]
    untargeted = explain(control_plane.kubeconfig, grant, "-n", other)
    assert "no grant target" in untargeted.stdout

    # the Secret's view: which grants project it where, and who else export-to allows
    by_secret = explain(control_plane.kubeconfig, "--secret", f"{src}/hub")
    assert by_secret.returncode == 0, by_secret.stderr
    assert f"grant {grant}" in by_secret.stdout
    assert "targeted by no grant (1)" in by_secret.stdout and other in by_secret.stdout
    secret_json = json.loads(
        explain(control_plane.kubeconfig, "--secret", f"{src}/hub", "-o", "json").stdout
    )
    assert secret_json["exported"] is True and secret_json["untargeted"] == [other]

    for out in (text, as_json, untargeted, by_secret):
        canaries.assert_absent("explain output", out.stdout + out.stderr)


def test_explain_names_the_missing_producer_consent(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    control_plane: ControlPlane,
    canaries: Canaries,
) -> None:
    src, dst = make_namespace(), make_namespace()
    k8s.source(src, "unlabelled", {"k": "CANARY-explain-3"}, exported=False, export_to=dst)
    k8s.source(src, "no-export-to", {"k": "CANARY-explain-4"})
    g1 = k8s.grant((src, "unlabelled"), namespaces=[dst])
    g2 = k8s.grant((src, "no-export-to"), namespaces=[dst])
    no_label = explain(control_plane.kubeconfig, g1)
    assert "no label projector.nebari.dev/export=true" in no_label.stdout, no_label.stdout
    no_annotation = explain(control_plane.kubeconfig, g2)
    assert "no projector.nebari.dev/export-to annotation" in no_annotation.stdout
    not_exported = explain(control_plane.kubeconfig, "--secret", f"{src}/unlabelled")
    assert "not exported" in not_exported.stdout
    for out in (no_label, no_annotation, not_exported):
        canaries.assert_absent("explain output", out.stdout + out.stderr)


def test_explain_of_nothing_fails_clearly(control_plane: ControlPlane) -> None:
    unknown = explain(control_plane.kubeconfig, "no-such-grant")
    assert unknown.returncode == 1
    assert "no ProjectionGrant named 'no-such-grant'" in unknown.stderr
    assert explain(control_plane.kubeconfig).returncode == 2
    assert explain(control_plane.kubeconfig, "--secret", "no-slash").returncode == 1


def test_explain_without_cluster_wide_secret_read_stops_with_the_forbidden_request(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    rbac_v1: client.RbacAuthorizationV1Api,
    service_account_kubeconfig: Any,
) -> None:
    """docs/cli.md: grants and namespaces alone are not enough to plan; explain says which
    request the server refused, and plans nothing on a partial view."""
    src, dst = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "CANARY-explain-rbac"}, export_to=dst)
    grant = k8s.grant((src, "hub"), namespaces=[dst])
    role = unique_name("explain-no-secrets")
    rbac_v1.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=role),
            rules=[
                client.V1PolicyRule(
                    api_groups=["projector.nebari.dev"],
                    resources=["projectiongrants"],
                    verbs=["get", "list"],
                ),
                client.V1PolicyRule(api_groups=[""], resources=["namespaces"], verbs=["list"]),
            ],
        )
    )
    try:
        out = explain(service_account_kubeconfig(role, src), grant)
    finally:
        rbac_v1.delete_cluster_role(role)
    assert out.returncode != 0 and out.stdout == ""
    assert "403" in out.stderr and 'cannot list resource "secrets"' in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_explain_names_the_export_that_consents_and_the_key_it_refuses(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    control_plane: ControlPlane,
    controller: ControllerProcess,
    canaries: Canaries,
) -> None:
    src, dst = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "CANARY-explain-5", "cfg": "CANARY-explain-6"}, exported=False)
    export = k8s.export(src, "hub", [dst], keys=["token"])
    ok = k8s.grant((src, "hub"), namespaces=[dst])
    refused = k8s.grant((src, "hub"), namespaces=[dst], keys=[{"from": "cfg"}], target_name="c")
    eventually(lambda: k8s.copy_data(dst, "hub") is not None)
    by_grant = explain(control_plane.kubeconfig, ok)
    assert f"producer consent by export {src}/{export} (keys token)" in by_grant.stdout
    refusal = explain(control_plane.kubeconfig, refused)
    assert "the producer does not export key 'cfg'" in refusal.stdout, refusal.stdout
    by_secret = explain(control_plane.kubeconfig, "--secret", f"{src}/hub")
    assert "exported by ProjectionExport only" in by_secret.stdout, by_secret.stdout
    assert f"{src}/{export}: to {dst}; keys token" in by_secret.stdout
    for out in (by_grant, refusal, by_secret):
        canaries.assert_absent("explain output", out.stdout + out.stderr)
