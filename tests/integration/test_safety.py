"""Defects a review found, each guarded against the real API server (issue: safety)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils

from tests import reliability
from tests.bed.controlplane.plane import ControlPlane
from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import ControllerProcess, explain
from tests.support import Cluster, NamespaceFactory, deletes_since, status_of


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
    eventually(lambda: k8s.grant_gone(name))
    # The same name again, for another source and another namespace, with onRevoke Delete.
    k8s.grant((src2, "other"), name=name, namespaces=[b])
    eventually(lambda: k8s.copy_data(b, "other") == {"token": "reuse-canary-2"})
    eventually(lambda: k8s.observed(name) and controller.idle())
    kept = k8s.copy(a, "hub")
    assert kept is not None, "the earlier grant's Retained copy was deleted by the new grant"
    assert kept.metadata.uid == retained.metadata.uid
    assert k8s.copy_data(a, "hub") == {"token": "reuse-canary-1"}


@pytest.mark.parametrize("refusal", ["not-exported-there", "source-missing", "wanted-there"])
def test_a_grant_reusing_a_name_where_it_may_not_write_keeps_the_retained_copy(
    refusal: str,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    control_plane: ControlPlane,
) -> None:
    """The reported data loss: grant g (Retain) projects src-a/old into `a` as `shared` and is
    deleted, its copy kept; a new grant g aims at `a`, target `shared`, for another source that
    is not exported to `a` (or does not exist, with onSourceDeleted Delete). The copy stays:
    it follows the policy recorded on it, not the new grant's. Where the new grant may write,
    the kept copy is a conflict, and `explain` names the earlier grant's copy as the holder."""
    src_a, src_b, a, elsewhere = (make_namespace() for _ in range(4))
    k8s.source(src_a, "old", {"token": "orphan-canary-1"}, export_to="*")
    name = unique_name("reused")
    k8s.grant((src_a, "old"), name=name, namespaces=[a], target_name="shared", on_revoke="Retain")
    eventually(lambda: k8s.copy_data(a, "shared") == {"token": "orphan-canary-1"})
    retained = k8s.version(a, "shared")
    seen = controller.reconciled(name)
    k8s.delete_grant(name)
    eventually(lambda: controller.reconciled(name) > seen and controller.idle())
    assert k8s.version(a, "shared") == retained

    if refusal != "source-missing":
        to = a if refusal == "wanted-there" else elsewhere
        k8s.source(src_b, "new", {"token": "orphan-canary-2"}, export_to=to)
    k8s.grant(
        (src_b, "new"),
        name=name,
        namespaces=[a],
        target_name="shared",
        on_revoke="Delete",
        on_source_deleted="Delete",
    )
    reason = {"not-exported-there": "Denied", "source-missing": "SourceMissing"}.get(
        refusal, "Conflict"
    )
    eventually(lambda: (k8s.condition(name, "Ready") or {}).get("reason") == reason)
    eventually(lambda: k8s.observed(name) and controller.idle())
    assert k8s.version(a, "shared") == retained, "the earlier grant's Retained copy was deleted"
    assert k8s.copy_data(a, "shared") == {"token": "orphan-canary-1"}
    if refusal == "wanted-there":
        said = explain(control_plane.kubeconfig, name, "-n", a, "-o", "json")
        assert said.returncode == 0, said.stderr
        (only,) = json.loads(said.stdout)["entries"]
        assert only["state"] == "conflicted" and "earlier grant" in only["why"], only


@pytest.mark.fault
def test_one_namespace_refusing_its_copy_stays_local_and_is_reported(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    admin_client: client.ApiClient,
    audit_log: Path,
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
        started = datetime.now(UTC)
        k8s.source(src, "hub", {"token": "refusal-canary"}, export_to="*")
        grant = k8s.grant((src, "hub"), namespaces=[refusing, fine])
        eventually(lambda: k8s.copy_data(fine, "hub") == {"token": "refusal-canary"})

        def reported() -> dict[str, str] | None:
            failures = k8s.status(grant).get("failures") or []
            return next((f for f in failures if f["namespace"] == refusing), None)

        failure = eventually(reported)
        elsewhere = k8s.copy_data(fine, "hub") == {"token": "refusal-canary"}
        assert failure["reason"] == "WriteFailed"
        assert "refused by policy" in failure["message"]
        assert k8s.copy(refusing, "hub") is None
        assert [f["namespace"] for f in k8s.status(grant)["failures"]] == [refusing]
        lifted = time.monotonic()
        k8s.core.patch_namespace(refusing, {"metadata": {"labels": {mark: None}}})
        eventually(lambda: k8s.copy_data(refusing, "hub") == {"token": "refusal-canary"})
        eventually(lambda: not k8s.status(grant).get("failures"))
        converged = time.monotonic() - lifted
        deletes = deletes_since(audit_log, started)
        want = {"token": "refusal-canary"}
        reliability.record(
            "Admission refuses the copy in one namespace",
            injected=(
                "a ValidatingAdmissionPolicy refusing every Secret write in one of a grant's two "
                "target namespaces; later lifted (the namespace unlabelled)."
            ),
            observed={
                "deletes": len(deletes),
                "missed_updates": sum(k8s.copy_data(ns, "hub") != want for ns in (fine, refusing)),
                "converge_seconds": converged,
                "other_namespace_projected_during_refusal": "yes" if elsewhere else "no",
                "refusal_reported_in_status": failure["reason"],
            },
        )
        assert deletes == []
    finally:
        admission.delete_validating_admission_policy_binding(mark)
        admission.delete_validating_admission_policy(mark)


@pytest.mark.fault
def test_probes_tell_a_dead_informer_and_recover_with_it(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    rbac_v1: client.RbacAuthorizationV1Api,
    admin_client: client.ApiClient,
    audit_log: Path,
) -> None:
    """Without the right to list namespaces, the controller is never Ready and, past
    --informer-dead-after, not Live either (its pod would restart), and writes nothing; with it
    back, both recover and the grant waiting meanwhile is projected."""
    src, target = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "probe-canary"}, export_to="*")
    k8s.grant((src, "hub"), namespaces=[target])
    started = datetime.now(UTC)
    role = rbac_v1.read_cluster_role("projector")
    rules = role.rules or []
    without = [r for r in rules if "namespaces" not in (r.resources or [])]
    assert len(without) == len(rules) - 1
    as_json = admin_client.sanitize_for_serialization
    rbac_v1.patch_cluster_role("projector", {"rules": as_json(without)})
    try:
        ctl = start_controller("--informer-dead-after=2s", wait_ready=False)
        eventually(lambda: ctl.get("/healthz")[0] == 503, timeout=30)
        dead_after = time.monotonic() - ctl.started
        assert ctl.get("/readyz")[0] == 503
        assert k8s.copy(target, "hub") is None  # an unsynced controller writes nothing
    finally:
        rbac_v1.patch_cluster_role("projector", {"rules": as_json(rules)})
    restored = time.monotonic()
    eventually(lambda: ctl.get("/readyz")[0] == 200, timeout=60)
    assert ctl.get("/healthz")[0] == 200
    eventually(lambda: k8s.copy_data(target, "hub") == {"token": "probe-canary"}, timeout=60)
    converged = time.monotonic() - restored
    deletes = deletes_since(audit_log, started)
    reliability.record(
        "An informer that cannot list (RBAC removed)",
        injected=(
            "the controller started without the right to list namespaces (its ClusterRole's "
            "rule removed), a grant waiting; --informer-dead-after=2s; the rule restored."
        ),
        observed={
            "deletes": len(deletes),
            "missed_updates": int(k8s.copy_data(target, "hub") != {"token": "probe-canary"}),
            "converge_seconds": converged,
            "liveness_failed_after_seconds": dead_after,
        },
    )
    assert deletes == []


def test_a_quota_refusing_secrets_in_one_namespace_is_a_named_failure(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """A ResourceQuota `secrets: "0"` (enforced: the plane runs the resourcequota controller)
    refuses the copy in one namespace: status.failures names it with the server's reason, one
    Event tells it however often the write is retried, and the grant's other namespace and
    another grant are projected meanwhile."""
    src, quoted, fine, other = (make_namespace() for _ in range(4))
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-secrets"),
        spec=client.V1ResourceQuotaSpec(hard={"secrets": "0"}),
    )
    k8s.core.create_namespaced_resource_quota(quoted, quota)
    probe = client.V1Secret(metadata=client.V1ObjectMeta(generate_name="probe-"))
    eventually(
        lambda: status_of(lambda: k8s.core.create_namespaced_secret(quoted, probe)) == 403,
        message="the quota was never enforced (is the resourcequota controller running?)",
    )
    want = {"token": "quota-canary"}
    k8s.source(src, "hub", want, export_to="*")
    grant = k8s.grant((src, "hub"), namespaces=[quoted, fine])
    bystander = k8s.grant((src, "hub"), namespaces=[other], target_name="elsewhere")

    def reported() -> dict[str, str] | None:
        failures = k8s.status(grant).get("failures") or []
        return next((f for f in failures if f["namespace"] == quoted), None)

    failure = eventually(reported)
    assert failure["reason"] == "WriteFailed"
    assert "exceeded quota" in failure["message"], failure
    assert k8s.copy_data(fine, "hub") == want
    eventually(lambda: k8s.copy_data(other, "elsewhere") == want)
    seen = controller.reconciled(grant)
    eventually(lambda: controller.reconciled(grant) >= seen + 3, message="no retry with backoff")
    assert k8s.copy(quoted, "hub") is None
    told = [
        e for e in k8s.events(grant) if e.reason == "WriteFailed" and quoted in (e.message or "")
    ]
    assert len(told) == 1 and told[0].count in (None, 1), [(e.message, e.count) for e in told]
    assert (k8s.condition(bystander, "Ready") or {}).get("status") == "True"
