"""ProjectionExports are safe to hand to namespace admins (issue 37, item 5), on a real server.

A user bound by a RoleBinding in namespace N to the built-in `admin` or `edit` ClusterRole may
create, update and delete ProjectionExports in N, and nowhere else; one bound to `view` may get
and list them, and write none; none of them may create a ProjectionGrant (cluster-scoped: a
RoleBinding never reaches it), nor write an export's status (projector's). Requests are sent
as that user (impersonated by the admin client, so the user is exactly its bindings plus
system:authenticated), and each forbidden one is a real request answered 403.

Those built-in roles reach exports only through the chart's `<release>-exports-edit` and
`-exports-view` ClusterRoles, by the kube-controller-manager's clusterrole-aggregation
controller (which the session's plane runs: tests/bed/controlplane/plane.py, `KCM_CONTROLLERS`).
This module proves it twice, with the shipped RBAC installed as every test installs it
(`install_rbac`: deploy/rbac/, the aggregated export roles included):

- users bound to `projector-exports-edit` / `projector-exports-view` directly: the rules;
- users bound to `admin`, `edit` and `view` themselves, once the aggregation controller gave
  those roles the export rules: the labels, end to end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from tests.bed import kube
from tests.bed.controlplane.plane import ControlPlane
from tests.bed.kube import api_client, eventually, unique_name
from tests.support import NamespaceFactory

GROUP, VERSION, EXPORTS, GRANTS = (
    "projector.nebari.dev",
    "v1alpha1",
    "projectionexports",
    "projectiongrants",
)
RBAC_API = "rbac.authorization.k8s.io"


def _shipped_role(suffix: str) -> str:
    """The name of the shipped ClusterRole ending in `suffix` (deploy/rbac/rbac.yaml)."""
    docs = yaml.safe_load_all((kube.RBAC / "rbac.yaml").read_text())
    names = [d["metadata"]["name"] for d in docs if d and d["kind"] == "ClusterRole"]
    (name,) = [n for n in names if n.endswith(suffix)]
    return name


EXPORTS_EDIT, EXPORTS_VIEW = _shipped_role("-exports-edit"), _shipped_role("-exports-view")


def export(name: str, to: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProjectionExport",
        "metadata": {"name": name},
        "spec": {"source": {"name": "hub"}, "keys": ["token"], "to": to},
    }


GRANT: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "ProjectionGrant",
    "spec": {"source": {"namespace": "jupyterhub", "name": "hub"}, "target": {"namespaces": ["x"]}},
}


OK = 200


def status_of(call: Callable[[], object]) -> int:
    """`OK` if the request succeeded (whatever its 2xx), else the API server's status."""
    try:
        call()
    except client.ApiException as e:
        return int(e.status)
    return OK


class Tenant:
    """A user bound by one RoleBinding in one namespace, and its requests, sent as that user."""

    def __init__(self, admin: client.ApiClient, kubeconfig: Path, namespace: str, role: str):
        self.user = unique_name(f"tenant-{role}")
        self.namespace = namespace
        client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=self.user),
                role_ref=client.V1RoleRef(api_group=RBAC_API, kind="ClusterRole", name=role),
                subjects=[client.RbacV1Subject(kind="User", name=self.user, api_group=RBAC_API)],
            ),
        )
        self.api = api_client(kubeconfig)
        self.api.set_default_header("Impersonate-User", self.user)
        self.custom = client.CustomObjectsApi(self.api)

    def create(self, namespace: str, name: str, to: list[str]) -> int:
        body = export(name, to)
        return status_of(
            lambda: self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, EXPORTS, body
            )
        )

    def get(self, namespace: str, name: str) -> int:
        return status_of(
            lambda: self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, EXPORTS, name
            )
        )

    def list_in(self, namespace: str) -> int:
        return status_of(
            lambda: self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, EXPORTS)
        )

    def update(self, admin: client.CustomObjectsApi, name: str, to: list[str]) -> int:
        """Replace the export (read by the admin, so a forbidden get cannot stop the write)."""
        body = cast(
            dict[str, Any],
            admin.get_namespaced_custom_object(GROUP, VERSION, self.namespace, EXPORTS, name),
        )
        body["spec"]["to"] = to
        return status_of(
            lambda: self.custom.replace_namespaced_custom_object(
                GROUP, VERSION, self.namespace, EXPORTS, name, body
            )
        )

    def patch(self, name: str, to: list[str]) -> int:
        return status_of(
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, EXPORTS, name, {"spec": {"to": to}}
            )
        )

    def patch_status(self, name: str) -> int:
        body = {"status": {"copies": 99}}
        return status_of(
            lambda: self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, EXPORTS, name, body
            )
        )

    def delete(self, name: str) -> int:
        return status_of(
            lambda: self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, EXPORTS, name
            )
        )

    def create_grant(self) -> int:
        body = {**copy.deepcopy(GRANT), "metadata": {"name": unique_name("tenant-grant")}}
        return status_of(
            lambda: self.custom.create_cluster_custom_object(GROUP, VERSION, GRANTS, body)
        )

    def close(self) -> None:
        self.api.close()


TenantFactory = Callable[[str, str], Tenant]


def _tenants(admin: client.ApiClient, kubeconfig: Path) -> Iterator[TenantFactory]:
    made: list[Tenant] = []

    def make(namespace: str, role: str) -> Tenant:
        made.append(Tenant(admin, kubeconfig, namespace, role))
        return made[-1]

    yield make
    for t in made:
        t.close()


def manages_exports_only_in_its_namespace(
    tenant: Tenant, admin: client.CustomObjectsApi, other: str
) -> None:
    """What `admin` and `edit` (and the exports-edit role) allow, and where it stops."""
    name = unique_name("export")
    eventually(  # the authorizer's cache may not hold the new binding yet
        lambda: tenant.create(tenant.namespace, name, ["dask-gateway"]) == OK,
        message=f"{tenant.user} never could create an export in {tenant.namespace}",
    )
    assert tenant.get(tenant.namespace, name) == OK
    assert tenant.list_in(tenant.namespace) == OK
    assert tenant.update(admin, name, ["dask-gateway", "team-*"]) == OK
    assert tenant.patch(name, ["dask-gateway"]) == OK
    stored = admin.get_namespaced_custom_object(GROUP, VERSION, tenant.namespace, EXPORTS, name)
    assert stored["spec"]["to"] == ["dask-gateway"]
    assert tenant.patch_status(name) == 403, "an export's status is projector's to write"
    assert tenant.delete(name) == OK

    assert tenant.create(other, unique_name("export"), ["dask-gateway"]) == 403
    assert tenant.list_in(other) == 403
    held = unique_name("held")
    admin.create_namespaced_custom_object(GROUP, VERSION, other, EXPORTS, export(held, ["a"]))
    assert tenant.get(other, held) == 403
    assert tenant.create_grant() == 403


def reads_exports_and_writes_none(
    tenant: Tenant, admin: client.CustomObjectsApi, other: str
) -> None:
    """What `view` (and the exports-view role) allow."""
    name = unique_name("export")
    admin.create_namespaced_custom_object(
        GROUP, VERSION, tenant.namespace, EXPORTS, export(name, ["dask-gateway"])
    )
    eventually(
        lambda: tenant.list_in(tenant.namespace) == OK,
        message=f"{tenant.user} never could list exports in {tenant.namespace}",
    )
    assert tenant.get(tenant.namespace, name) == OK
    assert tenant.create(tenant.namespace, unique_name("export"), ["dask-gateway"]) == 403
    assert tenant.update(admin, name, ["*"]) == 403
    assert tenant.patch(name, ["*"]) == 403
    assert tenant.patch_status(name) == 403
    assert tenant.delete(name) == 403
    assert tenant.list_in(other) == 403
    assert tenant.create_grant() == 403


# --- the shipped roles, bound directly, on the session's plane ------------------------------------


@pytest.fixture
def session_tenants(
    admin_client: client.ApiClient, control_plane: ControlPlane
) -> Iterator[TenantFactory]:
    kube.install_rbac(admin_client)  # the shipped RBAC, the aggregated export roles among it
    yield from _tenants(admin_client, control_plane.kubeconfig)


def test_the_shipped_export_roles_carry_the_labels_the_built_in_roles_aggregate(
    rbac_v1: client.RbacAuthorizationV1Api, admin_client: client.ApiClient
) -> None:
    """Read on the server: the selectors of admin, edit and view pick the roles they should
    (and view never the one that writes)."""
    kube.install_rbac(admin_client)

    def selected_by(built_in: str, role: str) -> bool:
        rule = rbac_v1.read_cluster_role(built_in).aggregation_rule
        labels = rbac_v1.read_cluster_role(role).metadata.labels or {}
        return any(
            all(labels.get(k) == v for k, v in (s.match_labels or {}).items())
            and not s.match_expressions
            for s in (rule.cluster_role_selectors if rule else None) or []
        )

    assert selected_by("admin", EXPORTS_EDIT) and selected_by("edit", EXPORTS_EDIT)
    assert selected_by("view", EXPORTS_VIEW)
    assert not selected_by("view", EXPORTS_EDIT)


def test_the_exports_edit_role_manages_exports_in_its_namespace_only(
    session_tenants: TenantFactory,
    make_namespace: NamespaceFactory,
    custom_objects: client.CustomObjectsApi,
) -> None:
    tenant = session_tenants(make_namespace(), EXPORTS_EDIT)
    manages_exports_only_in_its_namespace(tenant, custom_objects, make_namespace())


def test_the_exports_view_role_reads_exports_and_writes_none(
    session_tenants: TenantFactory,
    make_namespace: NamespaceFactory,
    custom_objects: client.CustomObjectsApi,
) -> None:
    tenant = session_tenants(make_namespace(), EXPORTS_VIEW)
    reads_exports_and_writes_none(tenant, custom_objects, make_namespace())


# --- admin, edit and view themselves, once aggregated ---------------------------------------------


def aggregated(rbac: client.RbacAuthorizationV1Api, role: str, verb: str) -> bool:
    """True once the aggregation controller gave the built-in ``role`` ``verb`` on exports."""
    rules = rbac.read_cluster_role(role).rules or []
    return any(
        EXPORTS in (r.resources or []) and verb in (r.verbs or []) and GROUP in (r.api_groups or [])
        for r in rules
    )


@pytest.fixture
def aggregated_tenants(
    admin_client: client.ApiClient,
    control_plane: ControlPlane,
    rbac_v1: client.RbacAuthorizationV1Api,
) -> Iterator[TenantFactory]:
    kube.install_rbac(admin_client)
    for role, verb in (("admin", "create"), ("edit", "create"), ("view", "list")):
        eventually(
            lambda: aggregated(rbac_v1, role, verb),  # noqa: B023 (called before the loop goes on)
            message=f"export rules aggregated into {role}",
        )
    assert not aggregated(rbac_v1, "view", "create")
    yield from _tenants(admin_client, control_plane.kubeconfig)


@pytest.mark.parametrize("role", ["admin", "edit"])
def test_admin_and_edit_manage_exports_in_their_namespace_only(
    aggregated_tenants: TenantFactory,
    make_namespace: NamespaceFactory,
    custom_objects: client.CustomObjectsApi,
    role: str,
) -> None:
    tenant = aggregated_tenants(make_namespace(), role)
    manages_exports_only_in_its_namespace(tenant, custom_objects, make_namespace())


def test_view_reads_exports_and_writes_none(
    aggregated_tenants: TenantFactory,
    make_namespace: NamespaceFactory,
    custom_objects: client.CustomObjectsApi,
) -> None:
    tenant = aggregated_tenants(make_namespace(), "view")
    reads_exports_and_writes_none(tenant, custom_objects, make_namespace())
