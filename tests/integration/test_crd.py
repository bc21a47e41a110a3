"""The CRD (what the API server enforces) and projector.core.model (what the controller assumes)
agree: every spec is accepted by both or rejected by both, with the rule's message, and the
server's defaults are the model's defaults.
"""

from __future__ import annotations

import copy
import json
from typing import Any, cast

import pytest
from kubernetes import client

from projector.core.grantspec import parse_grant
from projector.core.model import (
    OnRevoke,
    OnSourceDeleted,
    SourceKind,
)
from projector.errors import InvalidGrant
from tests.bed.kube import eventually, unique_name

GROUP, VERSION, PLURAL = "projector.nebari.dev", "v1alpha1", "projectiongrants"
BASE: dict[str, Any] = {
    "source": {"namespace": "jupyterhub", "name": "hub"},
    "target": {"namespaces": ["dask-gateway"]},
}


def spec(**changes: Any) -> dict[str, Any]:
    s = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = s
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return s


VALID = [
    pytest.param(spec(), id="minimal"),
    pytest.param(spec(keys=[{"from": "a.b", "to": "c"}, {"from": "c", "to": "d"}]), id="renames"),
    pytest.param(
        spec(target__namespaces=None, target__namespaceSelector={"matchLabels": {"pack": "x"}}),
        id="selector",
    ),
    pytest.param(
        spec(
            target__namespaceSelector={
                "matchExpressions": [{"key": "pack", "operator": "In", "values": ["a", "b"]}]
            }
        ),
        id="expressions",
    ),
    pytest.param(
        spec(
            target__name="contract", target__labels={"app": "x"}, target__annotations={"note": "y"}
        ),
        id="metadata",
    ),
    pytest.param(spec(policy={"onRevoke": "Retain", "onSourceDeleted": "Delete"}), id="policy"),
    pytest.param(spec(source__kind="ConfigMap"), id="configmap"),
    pytest.param(spec(source__kind="Secret"), id="secret-explicit"),
]

INVALID = [
    pytest.param(
        spec(target__namespaces=None),
        "target needs namespaces or namespaceSelector",
        id="no-targets",
    ),
    pytest.param(
        spec(target__namespaces=[]),
        "target needs namespaces or namespaceSelector",
        id="empty-targets",
    ),
    pytest.param(
        spec(keys=[{"from": "a", "to": "x"}, {"from": "b", "to": "x"}]),
        "keys[].to must be unique",
        id="duplicate-to",
    ),
    pytest.param(
        spec(keys=[{"from": "a"}, {"from": "b", "to": "a"}]),
        "keys[].to must be unique",
        id="duplicate-implicit-to",
    ),
    pytest.param(spec(keys=[{"from": "bad key"}]), "keys[0].from", id="bad-key-name"),
    pytest.param(
        spec(target__labels={"projector.nebari.dev/grant": "x"}),
        "target.labels may not use projector.nebari.dev/ keys",
        id="reserved-label",
    ),
    pytest.param(
        spec(target__annotations={"projector.nebari.dev/grant-uid": "x"}),
        "target.annotations may not use projector.nebari.dev/ keys",
        id="reserved-annotation",
    ),
    pytest.param(spec(target__namespaces=["Not_DNS"]), "target.namespaces[0]", id="bad-namespace"),
    pytest.param(spec(target__name="UPPER"), "target.name", id="bad-target-name"),
    pytest.param(spec(source__name=None), "source.name", id="no-source-name"),
    pytest.param(spec(policy={"onRevoke": "Sometimes"}), "onRevoke", id="bad-policy"),
    pytest.param(spec(source__kind="Pod"), "source.kind", id="bad-source-kind"),
    pytest.param(
        spec(target__annotations={"note": "x" * 2049}),
        "target.annotations.note",
        id="annotation-value-too-long",
    ),
]


def create(custom: client.CustomObjectsApi, s: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProjectionGrant",
        "metadata": {"name": unique_name("crd")},
        "spec": s,
    }
    obj = cast(dict[str, Any], custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body))
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, body["metadata"]["name"])
    return obj


@pytest.mark.parametrize("s", VALID)
def test_valid_specs_pass_both_with_the_same_defaults(
    custom_objects: client.CustomObjectsApi, s: dict[str, Any]
) -> None:
    stored = create(custom_objects, s)
    from_server = parse_grant(stored)
    from_raw = parse_grant({**stored, "spec": s})  # the model's own defaults
    assert from_server == from_raw
    if "policy" not in s:
        assert stored["spec"]["policy"] == {"onRevoke": "Delete", "onSourceDeleted": "Retain"}
        assert (from_server.on_revoke, from_server.on_source_deleted) == (
            OnRevoke.DELETE,
            OnSourceDeleted.RETAIN,
        )


@pytest.mark.parametrize(("s", "message"), INVALID)
def test_invalid_specs_fail_both(
    custom_objects: client.CustomObjectsApi, s: dict[str, Any], message: str
) -> None:
    with pytest.raises(client.ApiException) as err:
        create(custom_objects, s)
    assert err.value.status == 422
    assert message in json.loads(err.value.body or "{}")["message"]
    with pytest.raises(InvalidGrant):
        parse_grant({"metadata": {"name": "x"}, "spec": s})


def test_source_kind_defaults_to_secret_and_is_immutable(
    custom_objects: client.CustomObjectsApi,
) -> None:
    """Changing the kind would leave the copies of the old kind behind: the server refuses it,
    while other fields of the same grant still change."""
    name = unique_name("crd-kind")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProjectionGrant",
        "metadata": {"name": name},
        "spec": spec(),
    }
    stored = cast(
        dict[str, Any], custom_objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    )
    try:
        assert stored["spec"]["source"]["kind"] == "Secret"
        assert parse_grant(stored).kind is SourceKind.SECRET
        for kind in ("ConfigMap", "Secret"):  # to another kind, and (after) explicitly the same
            patch = {"spec": {"source": {"kind": kind}}}
            if kind == "ConfigMap":
                with pytest.raises(client.ApiException) as err:
                    custom_objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, patch)
                assert err.value.status == 422
                assert "spec.source.kind is immutable" in (err.value.body or "")
            else:
                custom_objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, patch)
        renamed = {"spec": {"target": {"name": "other"}}}
        custom_objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, renamed)
    finally:
        custom_objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def test_printer_columns_and_short_name(
    custom_objects: client.CustomObjectsApi, admin_client: client.ApiClient
) -> None:
    ext = client.ApiextensionsV1Api(admin_client)
    crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    version = crd.spec.versions[0]
    assert [c.name for c in version.additional_printer_columns] == [
        "Source",
        "Source-NS",
        "Targets",
        "Projected",
        "Ready",
        "Reason",
        "Age",
    ]
    assert "pgrant" in (crd.spec.names.short_names or [])
    assert crd.spec.scope == "Cluster"
    assert version.subresources.status is not None


def test_kubectl_explain_has_a_line_for_every_field(admin_client: client.ApiClient) -> None:
    """What `kubectl explain projectiongrant.spec...` prints: the API server's OpenAPI v3 for
    the group carries a description for every field of the schema."""
    method, url, headers, body, _ = admin_client.param_serialize(
        "GET", f"/openapi/v3/apis/{GROUP}/{VERSION}", auth_settings=["BearerToken"]
    )

    def published() -> dict[str, Any]:  # the server publishes a new CRD's OpenAPI a bit later
        resp = admin_client.call_api(method, url, headers, body)
        assert resp.status == 200, resp.status
        found = json.loads(resp.read())["components"]["schemas"]
        assert any(k.endswith(".ProjectionGrant") for k in found), sorted(found)
        return cast(dict[str, Any], found)

    schemas = eventually(published)
    (name,) = (k for k in schemas if k.endswith(".ProjectionGrant"))
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            where = f"{path}.{key}"
            if not sub.get("description") and not sub.get("allOf"):
                missing.append(where)
            for inner in [sub, *(sub.get("allOf") or [])]:
                if "$ref" in inner:
                    continue
                walk(inner, where)
                if isinstance(inner.get("items"), dict):
                    walk(inner["items"], where + "[]")

    walk(schemas[name], "projectiongrant")
    assert len(schemas[name]["properties"]) >= 5
    assert missing == [], missing
