"""Defects a review found, each guarded against the real API server (issue: safety)."""

from __future__ import annotations

from typing import Any

from kubernetes import client, utils

from tests.launcher import ControllerProcess
from tests.support import (
    GROUP,
    PLURAL,
    VERSION,
    Cluster,
    NamespaceFactory,
    eventually,
    status_of,
    unique_name,
)


def test_a_reused_grant_name_leaves_the_earlier_grants_retained_copies_alone(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src1, src2, a, b = (make_namespace() for _ in range(4))
    k8s.source(src1, "hub", {"token": "reuse-canary-1"}, export_to="*")
    k8s.source(src2, "other", {"token": "reuse-canary-2"}, export_to="*")
    name = unique_name("reused")
    k8s.grant((src1, "hub"), name=name, namespaces=[a], on_revoke="Retain")
    eventually(lambda: k8s.copy_data(a, "hub") == {"token": "reuse-canary-1"})
    retained = k8s.copy(a, "hub")
    assert retained is not None
    k8s.delete_grant(name)

    def gone() -> bool:
        try:
            k8s.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except client.ApiException as e:
            return e.status == 404
        return False

    eventually(gone)
    # The same name again, for another source and another namespace, with onRevoke Delete.
    k8s.grant((src2, "other"), name=name, namespaces=[b])
    eventually(lambda: k8s.copy_data(b, "other") == {"token": "reuse-canary-2"})
    eventually(lambda: k8s.observed(name) and controller.idle())
    kept = k8s.copy(a, "hub")
    assert kept is not None, "the earlier grant's Retained copy was deleted by the new grant"
    assert kept.metadata.uid == retained.metadata.uid
    assert k8s.copy_data(a, "hub") == {"token": "reuse-canary-1"}


def test_one_namespace_refusing_its_copy_stays_local_and_is_reported(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    admin_client: client.ApiClient,
) -> None:
    """An admission policy refuses copies in one namespace: the others are projected, the
    refusal is in status.failures with the server's reason, and lifting it converges."""
    mark = unique_name("refuse")
    src, refusing, fine = make_namespace(), make_namespace(labels={mark: "yes"}), make_namespace()
    admission = client.AdmissionregistrationV1Api(admin_client)
    policy: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": mark},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["secrets"],
                    }
                ]
            },
            "validations": [
                {"expression": "false", "message": "refused by policy", "reason": "Forbidden"}
            ],
        },
    }
    binding: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": mark},
        "spec": {
            "policyName": mark,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {mark: "yes"}}},
        },
    }
    utils.create_from_dict(admin_client, policy)
    utils.create_from_dict(admin_client, binding)
    try:
        probe = client.V1Secret(metadata=client.V1ObjectMeta(generate_name="probe-"))

        def refused() -> bool:
            return status_of(lambda: k8s.core.create_namespaced_secret(refusing, probe)) == 403

        eventually(refused, message="the admission policy never took effect")
        k8s.source(src, "hub", {"token": "refusal-canary"}, export_to="*")
        grant = k8s.grant((src, "hub"), namespaces=[refusing, fine])
        eventually(lambda: k8s.copy_data(fine, "hub") == {"token": "refusal-canary"})

        def reported() -> dict[str, str] | None:
            failures = k8s.status(grant).get("failures") or []
            return next((f for f in failures if f["namespace"] == refusing), None)

        failure = eventually(reported)
        assert failure["reason"] == "WriteFailed"
        assert "refused by policy" in failure["message"]
        assert k8s.copy(refusing, "hub") is None
        assert [f["namespace"] for f in k8s.status(grant)["failures"]] == [refusing]
        k8s.core.patch_namespace(refusing, {"metadata": {"labels": {mark: None}}})
        eventually(lambda: k8s.copy_data(refusing, "hub") == {"token": "refusal-canary"})
        eventually(lambda: not k8s.status(grant).get("failures"))
    finally:
        admission.delete_validating_admission_policy_binding(mark)
        admission.delete_validating_admission_policy(mark)


def test_probes_tell_a_dead_informer_and_recover_with_it(
    start_controller: Any, rbac_v1: client.RbacAuthorizationV1Api, admin_client: client.ApiClient
) -> None:
    """Without the right to list namespaces, the controller is never Ready and, past
    --informer-dead-after, not Live either (its pod would restart); with it back, both recover."""
    role = rbac_v1.read_cluster_role("projector")
    rules = role.rules or []
    without = [r for r in rules if "namespaces" not in (r.resources or [])]
    assert len(without) == len(rules) - 1
    as_json = admin_client.sanitize_for_serialization
    rbac_v1.patch_cluster_role("projector", {"rules": as_json(without)})
    try:
        ctl = start_controller("--informer-dead-after=2s", wait_ready=False)
        eventually(lambda: ctl.get("/healthz")[0] == 503, timeout=30)
        assert ctl.get("/readyz")[0] == 503
    finally:
        rbac_v1.patch_cluster_role("projector", {"rules": as_json(rules)})
    eventually(lambda: ctl.get("/readyz")[0] == 200, timeout=60)
    assert ctl.get("/healthz")[0] == 200
