"""A stolen projector token against the chart's admission policies, on the real API server
(issue 36: a review with the ServiceAccount's token created a service-account-token Secret in
kube-system that the token controller filled with a powerful token, a bootstrap token, a Secret
in kube-system, and could patch any workload cluster-wide).

The token is a TokenRequest for the ServiceAccount that deploy/rbac/ creates (the session's
`projector_kubeconfig`), so it holds exactly the shipped RBAC; deploy/rbac/admission.yaml is
installed with it, and this module adds what `rollouts.enabled=true` adds (deploy/rbac/rollouts/)
and the chart's optional namespace label guard, once, then polls until each policy refuses.
Every refusal is next to a proof that projector's own writes still pass, so a policy that
refuses everything would fail here too.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils
from kubernetes.dynamic import DynamicClient

from tests.bed.helm import chart
from tests.bed.kube import (
    RBAC,
    api_client,
    apply_manifests,
    bind_service_account,
    eventually,
    token_kubeconfig,
    unique_name,
)
from tests.support import status_of

OWN_NS = "projector-system"  # the release namespace of deploy/rbac/
HASH_KEY = "projector-hash-key"
MANAGED = {"projector.nebari.dev/managed-by": "projector"}
ROLLOUT_ON = "projector.nebari.dev/rollout-on"
ROLLOUT_POLICY = "projector-rollout-annotations-only"
GUARD_POLICY = "projector-namespace-label-guard"
MANAGER = "projector-rollout"

# The policies' messages (deploy/helm/projector/templates/admissionpolicy.yaml), in part.
TOKEN_TYPE = "may not write a Secret of type kubernetes.io/service-account-token"
SA_ANNOTATION = "may not write a Secret annotated kubernetes.io/service-account."
PROTECTED = "in a protected namespace (kube-system, kube-public, kube-node-lease, projector-system)"
OPT_IN = "may not carry the producer's opt-in"
OWN = "labelled projector.nebari.dev/managed-by=projector"
WORKLOAD_VERB = "may only update a Deployment, StatefulSet or DaemonSet"
NOT_OPTED_IN = "may roll only a workload that opted in"
SPEC = "may change only the pod template's projector.nebari.dev/rollout-"
META = "may change only the projector.nebari.dev/seen-"
GUARD = "namespace labels under nebari.dev/ may be added, changed or removed only"


def refusal(call: Callable[[], object]) -> tuple[int, str]:
    """The status and message of a call that must fail; AssertionError if it succeeded."""
    try:
        call()
    except client.ApiException as e:
        try:
            message = str(json.loads(e.body or "{}").get("message", ""))
        except ValueError:
            message = str(e.body)
        return int(e.status), message
    raise AssertionError("the API server accepted it")


def assert_refused(call: Callable[[], object], message: str) -> None:
    status, said = refusal(call)
    assert status in (403, 422), (status, said)
    assert message in said, said


@dataclass(frozen=True)
class Hostile:
    """What the module's tests share: admin and stolen-token clients, and a normal namespace."""

    core: client.CoreV1Api  # admin
    apps: client.AppsV1Api  # admin
    sa_core: client.CoreV1Api  # projector's ServiceAccount
    sa_apps: client.AppsV1Api
    sa_dynamic: DynamicClient
    namespace: str  # neither protected nor projector's own


def secret(
    name: str,
    *,
    labels: Mapping[str, str] | None = MANAGED,
    annotations: Mapping[str, str] | None = None,
    type_: str = "Opaque",
    data: Mapping[str, str] | None = None,
) -> client.V1Secret:
    return client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name,
            labels=dict(labels) if labels else None,
            annotations=dict(annotations) if annotations else None,
        ),
        type=type_,
        data={k: base64.b64encode(v.encode()).decode() for k, v in (data or {}).items()} or None,
    )


def _delete(call: Callable[[], object]) -> None:
    try:
        call()
    except client.ApiException as e:
        if e.status != 404:
            raise


def _policy_docs(helm: Path, *values: str) -> list[dict[str, Any]]:
    """The chart's admission documents rendered with `values` (the release of deploy/rbac/)."""
    kinds = chart.ADMISSION_KINDS
    return [d for d in chart.documents(chart.template(helm, *values)) if d["kind"] in kinds]


@pytest.fixture(scope="module")
def hostile(
    admin_client: client.ApiClient, projector_kubeconfig: Path, core_v1: client.CoreV1Api
) -> Iterator[Hostile]:
    """The shipped RBAC and policy (session), plus rollouts' and the namespace guard (module),
    each proven in force before any test relies on it."""
    helm = chart.helm_binary()
    guard = [
        d
        for d in _policy_docs(helm, "--set=namespaceLabelGuard.enabled=true")
        if d["metadata"]["name"] == GUARD_POLICY
    ]
    assert len(guard) == 2, guard
    assert apply_manifests(admin_client, RBAC / "rollouts") == 4
    for doc in guard:
        utils.create_from_dict(admin_client, doc)
    sa = api_client(projector_kubeconfig)
    namespace = unique_name("hostile")
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    world = Hostile(
        core=core_v1,
        apps=client.AppsV1Api(admin_client),
        sa_core=client.CoreV1Api(sa),
        sa_apps=client.AppsV1Api(sa),
        sa_dynamic=DynamicClient(sa),
        namespace=namespace,
    )
    try:
        unlabelled = secret("probe-unlabelled", labels=None)

        def secrets_policy_in_force() -> bool:
            try:
                world.sa_core.create_namespaced_secret(namespace, unlabelled)
            except client.ApiException as e:
                return e.status in (403, 422) and OWN in (e.body or "")
            core_v1.delete_namespaced_secret("probe-unlabelled", namespace)  # not yet loaded
            return False

        eventually(secrets_policy_in_force, message="the Secret policy never took effect")
        probe = unique_name("probe-bystander")
        world.apps.create_namespaced_deployment(namespace, deployment(probe))
        deployments = world.sa_dynamic.resources.get(api_version="apps/v1", kind="Deployment")
        attempts = iter(range(1_000_000))

        def rollout_policy_in_force() -> bool:  # a new value each time: always a change
            stamps = {"projector.nebari.dev/rollout-db": str(next(attempts))}
            body = rollout_apply(probe, namespace, stamps=stamps)
            try:
                world.sa_dynamic.server_side_apply(
                    deployments, body=body, field_manager=MANAGER, force_conflicts=True
                )
            except client.ApiException as e:  # RBAC's 403 until it allows: not yet either
                return e.status in (403, 422) and NOT_OPTED_IN in (e.body or "")
            return False

        eventually(rollout_policy_in_force, message="the rollout policy never took effect")
        yield world
    finally:
        admission = client.AdmissionregistrationV1Api(admin_client)
        rbac = client.RbacAuthorizationV1Api(admin_client)
        for delete in (
            lambda: admission.delete_validating_admission_policy_binding(GUARD_POLICY),
            lambda: admission.delete_validating_admission_policy(GUARD_POLICY),
            lambda: admission.delete_validating_admission_policy_binding(ROLLOUT_POLICY),
            lambda: admission.delete_validating_admission_policy(ROLLOUT_POLICY),
            lambda: rbac.delete_cluster_role_binding("projector-rollouts"),
            lambda: rbac.delete_cluster_role("projector-rollouts"),
            lambda: core_v1.delete_namespace(namespace),
        ):
            _delete(delete)


# --- Secrets and ConfigMaps -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace, name",
    [
        pytest.param("", "copy", id="copy-in-a-normal-namespace"),
        pytest.param(OWN_NS, HASH_KEY, id="hash-key-in-own-namespace"),
    ],
)
def test_projectors_own_writes_pass_under_the_policy(
    hostile: Hostile, namespace: str, name: str
) -> None:
    """A labelled copy in a normal namespace is created, updated and deleted; so is the one
    Secret projector keeps in its own namespace, projector-hash-key (a controller of an
    earlier test may have made it: then it is updated unchanged, and kept)."""
    namespace = namespace or hostile.namespace
    read = functools.partial(hostile.core.read_namespaced_secret, name, namespace)
    if status_of(read) == 200:
        hostile.sa_core.replace_namespaced_secret(name, namespace, read())
        return
    hostile.sa_core.create_namespaced_secret(namespace, secret(name, data={"k": "v1"}))
    try:  # never left behind: a controller would find a hash key it cannot use
        body = read()
        body.data = {"k": base64.b64encode(b"v2").decode()}
        hostile.sa_core.replace_namespaced_secret(name, namespace, body)
        assert base64.b64decode(read().data["k"]) == b"v2"
        hostile.sa_core.delete_namespaced_secret(name, namespace)
        assert status_of(read) == 404
    finally:
        _delete(functools.partial(hostile.core.delete_namespaced_secret, name, namespace))


def test_projectors_configmap_copies_pass_under_the_policy(hostile: Hostile) -> None:
    name = unique_name("copy")
    config_map = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=MANAGED), data={"k": "v"}
    )
    hostile.sa_core.create_namespaced_config_map(hostile.namespace, config_map)
    hostile.sa_core.delete_namespaced_config_map(name, hostile.namespace)


KUBE_SYSTEM_TOKEN = secret(
    "stolen-aggregation-token",
    type_="kubernetes.io/service-account-token",
    annotations={"kubernetes.io/service-account.name": "clusterrole-aggregation-controller"},
)
BOOTSTRAP = secret(
    "bootstrap-token-abcdef",
    type_="bootstrap.kubernetes.io/token",
    data={"token-id": "abcdef", "token-secret": "0123456789abcdef", "usage-bootstrap-signing": "1"},
)


@pytest.mark.parametrize(
    "namespace, body, message",
    [
        pytest.param("kube-system", KUBE_SYSTEM_TOKEN, TOKEN_TYPE, id="sa-token-in-kube-system"),
        pytest.param("kube-system", BOOTSTRAP, TOKEN_TYPE, id="bootstrap-token-in-kube-system"),
        pytest.param(
            "",
            secret(
                "sa-token",
                type_="kubernetes.io/service-account-token",
                annotations={"kubernetes.io/service-account.name": "default"},
            ),
            TOKEN_TYPE,
            id="sa-token-anywhere",
        ),
        pytest.param(
            "",
            secret(
                "sa-annotated",
                annotations={"kubernetes.io/service-account.name": "default"},
            ),
            SA_ANNOTATION,
            id="service-account-annotation",
        ),
        pytest.param("kube-system", secret("opaque"), PROTECTED, id="opaque-in-kube-system"),
        pytest.param("kube-public", secret("opaque"), PROTECTED, id="opaque-in-kube-public"),
        pytest.param(OWN_NS, secret("not-the-hash-key"), PROTECTED, id="own-namespace"),
        pytest.param(
            "",
            secret("exported", labels={**MANAGED, "projector.nebari.dev/export": "true"}),
            OPT_IN,
            id="export-label",
        ),
        pytest.param(
            "",
            secret("exported", annotations={"projector.nebari.dev/export-to": "*"}),
            OPT_IN,
            id="export-to",
        ),
        pytest.param(
            "",
            secret("exported", annotations={"projector.nebari.dev/export-keys": "k"}),
            OPT_IN,
            id="export-keys",
        ),
        pytest.param("", secret("unlabelled", labels=None), OWN, id="unlabelled"),
    ],
)
def test_a_stolen_token_cannot_create_this_secret(
    hostile: Hostile, namespace: str, body: client.V1Secret, message: str
) -> None:
    namespace = namespace or hostile.namespace
    name = str(body.metadata.name)
    assert_refused(lambda: hostile.sa_core.create_namespaced_secret(namespace, body), message)
    assert status_of(lambda: hostile.core.read_namespaced_secret(name, namespace)) == 404


def test_a_stolen_token_cannot_touch_a_protected_namespace_even_with_projectors_label(
    hostile: Hostile,
) -> None:
    """Updates and deletes are refused there too (the label is a hint anyone can set), and
    the hash-key exception is that one Secret's name, not a ConfigMap of that name."""
    name = unique_name("labelled")
    hostile.core.create_namespaced_secret("kube-system", secret(name, data={"k": "v"}))
    try:
        body = hostile.core.read_namespaced_secret(name, "kube-system")
        body.data = {"k": base64.b64encode(b"stolen").decode()}
        assert_refused(
            lambda: hostile.sa_core.replace_namespaced_secret(name, "kube-system", body), PROTECTED
        )
        assert_refused(
            lambda: hostile.sa_core.delete_namespaced_secret(name, "kube-system"), PROTECTED
        )
        kept = hostile.core.read_namespaced_secret(name, "kube-system")
        assert base64.b64decode(kept.data["k"]) == b"v"
    finally:
        hostile.core.delete_namespaced_secret(name, "kube-system")
    hash_key_cm = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=HASH_KEY, labels=MANAGED), data={"k": "v"}
    )
    assert_refused(
        lambda: hostile.sa_core.create_namespaced_config_map(OWN_NS, hash_key_cm), PROTECTED
    )
    assert_refused(
        lambda: hostile.sa_core.create_namespaced_config_map("kube-node-lease", hash_key_cm),
        PROTECTED,
    )


# --- workloads (rollouts.enabled) -----------------------------------------------------------------


def deployment(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    template_annotations: Mapping[str, str] | None = None,
) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, annotations=dict(annotations or {}) or None),
        spec=client.V1DeploymentSpec(
            replicas=0,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(
                    labels=labels, annotations=dict(template_annotations or {}) or None
                ),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="app", image="localhost/app:1")]
                ),
            ),
        ),
    )


def daemon_set(name: str) -> client.V1DaemonSet:
    labels = {"app": name}
    return client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector={"projector.test/no-such-node": "true"},
                    containers=[client.V1Container(name="app", image="localhost/app:1")],
                ),
            ),
        ),
    )


def rollout_apply(
    name: str,
    namespace: str,
    *,
    stamps: Mapping[str, str],
    seen: Mapping[str, str] | None = None,
    kind: str = "Deployment",
) -> dict[str, Any]:
    """The body projector's rollout applies (projector.rollout.decide.manifest), plus what a test
    adds."""
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(seen or {})},
        "spec": {"template": {"metadata": {"annotations": dict(stamps)}}},
    }


@pytest.fixture
def workloads(hostile: Hostile) -> Iterator[tuple[str, str, str]]:
    """Three Deployments in the module's namespace: opted in on its metadata, opted in on its
    pod template, and not opted in."""
    names = tuple(unique_name(n) for n in ("opted-in", "template-opted-in", "bystander"))
    opted, template_opted, bystander = names
    hostile.apps.create_namespaced_deployment(
        hostile.namespace, deployment(opted, annotations={ROLLOUT_ON: "db"})
    )
    hostile.apps.create_namespaced_deployment(
        hostile.namespace, deployment(template_opted, template_annotations={ROLLOUT_ON: "db"})
    )
    hostile.apps.create_namespaced_deployment(hostile.namespace, deployment(bystander))
    yield opted, template_opted, bystander
    for name in names:
        _delete(
            functools.partial(hostile.apps.delete_namespaced_deployment, name, hostile.namespace)
        )


def test_a_rollout_annotation_apply_passes_and_nothing_else_on_a_workload(
    hostile: Hostile, workloads: tuple[str, str, str]
) -> None:
    opted, template_opted, bystander = workloads
    ns = hostile.namespace
    deployments = hostile.sa_dynamic.resources.get(api_version="apps/v1", kind="Deployment")

    def apply(body: dict[str, Any]) -> object:
        return hostile.sa_dynamic.server_side_apply(
            deployments, body=body, field_manager=MANAGER, force_conflicts=True
        )

    # legitimate: what projector applies, on either way of opting in
    stamp = {"projector.nebari.dev/rollout-db": "0123456789abcdef"}
    seen = {"projector.nebari.dev/seen-db": "0123456789abcdef"}
    apply(rollout_apply(opted, ns, stamps=stamp, seen=seen))
    apply(rollout_apply(template_opted, ns, stamps=stamp))
    for name in (opted, template_opted):
        got = hostile.apps.read_namespaced_deployment(name, ns)
        assert (
            got.spec.template.metadata.annotations["projector.nebari.dev/rollout-db"]
            == stamp["projector.nebari.dev/rollout-db"]
        )
    notes = hostile.apps.read_namespaced_deployment(opted, ns).metadata.annotations
    assert notes["projector.nebari.dev/seen-db"] == seen["projector.nebari.dev/seen-db"]
    # the same apply on a workload that did not opt in
    assert_refused(lambda: apply(rollout_apply(bystander, ns, stamps=stamp)), NOT_OPTED_IN)

    def image(name: str, value: str) -> Callable[[], object]:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": value}]}}}}
        return lambda: hostile.sa_apps.patch_namespaced_deployment(name, ns, patch)

    def patch(name: str, body: dict[str, Any]) -> Callable[[], object]:
        return lambda: hostile.sa_apps.patch_namespaced_deployment(name, ns, body)

    assert_refused(image(opted, "evil.example/miner:1"), SPEC)
    assert_refused(image(bystander, "evil.example/miner:1"), NOT_OPTED_IN)
    assert_refused(patch(opted, {"spec": {"replicas": 5}}), SPEC)
    template_changes: tuple[dict[str, Any], ...] = (  # beyond its rollout stamps
        {"metadata": {"labels": {"app": opted, "extra": "x"}}},
        {"metadata": {"annotations": {"other.example/x": "y"}}},
        {"metadata": {"annotations": {ROLLOUT_ON: "other"}}},  # not projector's to opt in
    )
    for change in template_changes:
        assert_refused(patch(opted, {"spec": {"template": change}}), SPEC)
    metadata_changes: tuple[dict[str, Any], ...] = (  # beyond its seen baselines
        {"labels": {"extra": "x"}},
        {"annotations": {ROLLOUT_ON: "db,other"}},
        {"annotations": {"other.example/x": "y"}},
        {"finalizers": ["example.com/stuck"]},
        {
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "gone",
                    "uid": "00000000-0000-0000-0000-000000000000",
                }
            ]
        },
    )
    for change in metadata_changes:
        assert_refused(patch(opted, {"metadata": change}), META)
    # server-side apply of a workload that is not there arrives as a CREATE
    missing = unique_name("created")
    full = hostile.apps.api_client.sanitize_for_serialization(deployment(missing))
    full |= {"apiVersion": "apps/v1", "kind": "Deployment"}
    full["metadata"]["namespace"] = ns
    status, said = refusal(lambda: apply(full))
    assert status == 403, said  # RBAC (no create) or the policy; never created
    assert status_of(lambda: hostile.apps.read_namespaced_deployment(missing, ns)) == 404
    after = hostile.apps.read_namespaced_deployment(opted, ns)
    assert after.spec.replicas == 0 and after.spec.template.spec.containers[0].image == (
        "localhost/app:1"
    )
    assert after.metadata.labels is None and not after.metadata.finalizers


def test_a_kube_system_daemonset_cannot_be_repointed(hostile: Hostile) -> None:
    """The issue's example: a DaemonSet's image in kube-system (it never opted in)."""
    name = unique_name("node-agent")
    hostile.apps.create_namespaced_daemon_set("kube-system", daemon_set(name))
    try:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "evil"}]}}}}
        assert_refused(
            lambda: hostile.sa_apps.patch_namespaced_daemon_set(name, "kube-system", patch),
            NOT_OPTED_IN,
        )
        got = hostile.apps.read_namespaced_daemon_set(name, "kube-system")
        assert got.spec.template.spec.containers[0].image == "localhost/app:1"
    finally:
        hostile.apps.delete_namespaced_daemon_set(name, "kube-system")


# --- the namespace label guard --------------------------------------------------------------------


@pytest.fixture
def tenant(
    hostile: Hostile,
    admin_client: client.ApiClient,
    tmp_path: Path,
) -> Iterator[tuple[str, client.CoreV1Api]]:
    """A namespace (labelled nebari.dev/pack=tenant by its admin) and a ServiceAccount in it that
    may get and patch that namespace, and nothing else."""
    rbac = client.RbacAuthorizationV1Api(admin_client)
    ns = unique_name("tenant")
    meta = client.V1ObjectMeta(name=ns, labels={"nebari.dev/pack": "tenant"})
    hostile.core.create_namespace(client.V1Namespace(metadata=meta))
    role = unique_name("tenant-patches-its-namespace")
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=role),
            rules=[
                client.V1PolicyRule(
                    api_groups=[""],
                    resources=["namespaces"],
                    resource_names=[ns],
                    verbs=["get", "patch"],
                )
            ],
        )
    )
    hostile.core.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="tenant"))
    )
    bind_service_account(rbac, role, role, "tenant", ns)
    kubeconfig = token_kubeconfig(
        tmp_path / "tenant.kubeconfig", hostile.core.api_client, "tenant", ns
    )
    try:
        yield ns, client.CoreV1Api(api_client(kubeconfig))
    finally:
        _delete(lambda: rbac.delete_cluster_role_binding(role))
        _delete(lambda: rbac.delete_cluster_role(role))
        _delete(lambda: hostile.core.delete_namespace(ns))


def test_the_namespace_label_guard_keeps_selector_labels_to_admins(
    hostile: Hostile, tenant: tuple[str, client.CoreV1Api]
) -> None:
    ns, as_tenant = tenant

    def labels() -> dict[str, str]:
        return dict(hostile.core.read_namespace(ns).metadata.labels or {})

    # the tenant may label its namespace (RBAC may lag a moment) with keys outside the prefix
    eventually(lambda: as_tenant.patch_namespace(ns, {"metadata": {"labels": {"team": "a"}}}))
    assert labels()["team"] == "a"

    def refused() -> bool:
        status, said = refusal(
            lambda: as_tenant.patch_namespace(
                ns, {"metadata": {"labels": {"nebari.dev/pack": "jupyterhub"}}}
            )
        )
        return status in (403, 422) and GUARD in said

    def guard_in_force() -> bool:
        try:
            return refused()
        except AssertionError:  # accepted: the guard not loaded yet; the admin puts it back
            hostile.core.patch_namespace(
                ns, {"metadata": {"labels": {"nebari.dev/pack": "tenant"}}}
            )
            return False

    eventually(guard_in_force, message="the namespace label guard never took effect")
    for change in (
        {"nebari.dev/pack": None},  # removing one widens what a NotIn selector matches
        {"nebari.dev/tier": "platform"},  # adding one
    ):
        body = {"metadata": {"labels": change}}
        assert_refused(functools.partial(as_tenant.patch_namespace, ns, body), GUARD)
    assert labels()["nebari.dev/pack"] == "tenant" and "nebari.dev/tier" not in labels()
    as_tenant.patch_namespace(ns, {"metadata": {"labels": {"team": "b"}}})  # still free
    assert labels()["team"] == "b"
    hostile.core.patch_namespace(ns, {"metadata": {"labels": {"nebari.dev/pack": "x"}}})  # admin
    assert labels()["nebari.dev/pack"] == "x"


# --- the chart's rendering ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    return chart.helm_binary()


def _render(helm: Path, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in chart.documents(chart.template(helm, *values))
    }


def _args(docs: Mapping[tuple[str, str], dict[str, Any]]) -> list[str]:
    return list(
        docs[("Deployment", "projector")]["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_the_chart_passes_protected_namespaces_and_configmaps_off_to_controller_and_rbac(
    helm_bin: Path,
) -> None:
    default = _render(helm_bin)
    protected = "--protected-namespaces=kube-system,kube-public,kube-node-lease,projector-system"
    assert protected in _args(default) and "--no-configmaps" not in _args(default)
    verbs = {
        res: set(r["verbs"])
        for r in default[("ClusterRole", "projector")]["rules"]
        for res in r["resources"]
    }
    assert {"create", "update", "delete"} <= verbs["configmaps"]
    assert ("ValidatingAdmissionPolicy", GUARD_POLICY) not in default
    off = _render(
        helm_bin,
        "--set=configMaps.enabled=false",
        "--set=protectedNamespaces={kube-system,projector-system,vault}",
    )
    assert "--no-configmaps" in _args(off)
    assert "--protected-namespaces=kube-system,projector-system,vault" in _args(off)
    rules = off[("ClusterRole", "projector")]["rules"]
    cm = [set(r["verbs"]) for r in rules if "configmaps" in r["resources"]]
    assert cm == [{"get", "list", "watch"}]
    policy = off[("ValidatingAdmissionPolicy", "projector-own-secrets-only")]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert '["kube-system","projector-system","vault"]' in variables["protected"]
    guard = _render(
        helm_bin,
        "--set=namespaceLabelGuard.enabled=true",
        "--set=namespaceLabelGuard.exemptUsers={argocd}",
        "--set=admissionPolicy.enabled=false",
    )
    assert ("ValidatingAdmissionPolicy", GUARD_POLICY) in guard
    assert ("ValidatingAdmissionPolicy", "projector-own-secrets-only") not in guard
    conditions = guard[("ValidatingAdmissionPolicy", GUARD_POLICY)]["spec"]["matchConditions"]
    assert '["argocd"]' in conditions[0]["expression"]
    chart.helm(
        helm_bin,
        "lint",
        "--strict",
        str(chart.CHART),
        "--set=namespaceLabelGuard.enabled=true",
        "--set=rollouts.enabled=true",
        "--set=configMaps.enabled=false",
    )


@pytest.mark.parametrize(
    "value, error",
    [
        ("protectedNamespaces={Kube_System}", "protectedNamespaces"),
        ("configMaps.enabled=maybe", "configMaps"),
        ("namespaceLabelGuard.prefixes={}", "prefixes"),
        ('namespaceLabelGuard.exemptGroups={a"b}', "exemptGroups"),
        ("namespaceLabelGuard.validationActions={Allow}", "validationActions"),
    ],
)
def test_values_schema_refuses_bad_admission_values(helm_bin: Path, value: str, error: str) -> None:
    with pytest.raises(RuntimeError, match=error):
        chart.template(helm_bin, f"--set={value}")
