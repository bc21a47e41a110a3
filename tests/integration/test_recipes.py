"""The recipes of grants/recipes/ (docs/recipes.md), each applied as written on the real API server.

Each recipe's ProjectionExport and ProjectionGrant are read from its folder and created as they
are (strict field validation, their own names and namespaces), beside stand-ins for what the
third-party side writes: the Secret a chart or operator renders, and for the dask-gateway
recipe the gateway's Deployment. The stand-ins are this project's own fixtures, written from
the charts' and the operator's templates as read (the module's constants say which), rendered
from the recipe's own values files where the recipe has them, so a change of those values
reaches the test. Then each test asserts the recipe's outcome: what lands where, what never
leaves, and that a rotation (or a new namespace) is followed.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from tests.bed.kube import RBAC, apply_manifests, decode, eventually
from tests.bed.launcher import ControllerProcess
from tests.support import EXPORTS, GROUP, PLURAL, VERSION, Cluster, NamespaceFactory
from tests.workloads import ROLLOUT_ON, copy_hash, revision, stamp

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "grants" / "recipes"

# -- the recipes as written ----------------------------------------------------------------------


def recipe_file(recipe: str, name: str) -> dict[str, Any]:
    """One YAML document of grants/recipes/<recipe>/<name>."""
    return cast(dict[str, Any], yaml.safe_load((RECIPES / recipe / name).read_text()))


def apply_recipe(k8s: Cluster, recipe: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create the recipe's export (in its own namespace) and grant, as written: (export, grant).

    The grant is the test's: the `k8s` fixture scans its status and Events and deletes it after.
    """
    export, grant = recipe_file(recipe, "export.yaml"), recipe_file(recipe, "grant.yaml")
    k8s.custom.create_namespaced_custom_object(
        GROUP, VERSION, export["metadata"]["namespace"], EXPORTS, export, field_validation="Strict"
    )
    k8s.custom.create_cluster_custom_object(
        GROUP, VERSION, PLURAL, grant, field_validation="Strict"
    )
    k8s.grants.append(grant["metadata"]["name"])
    return export, grant


def namespaces_of(export: Mapping[str, Any], grant: Mapping[str, Any]) -> tuple[str, list[str]]:
    """(the source's namespace, the namespaces the grant lists), as the recipe writes them."""
    source = grant["spec"]["source"]["namespace"]
    assert export["metadata"]["namespace"] == source
    return source, list(grant["spec"]["target"].get("namespaces") or [])


def export_status(k8s: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The export's status once projector has written one that counts a copy."""
    obj = k8s.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, EXPORTS, name)
    status = cast(dict[str, Any], obj).get("status") or {}
    return status if status.get("copies") else None


def failures(k8s: Cluster, grant: str) -> dict[str, str]:
    return {f["namespace"]: f["reason"] for f in k8s.status(grant).get("failures") or ()}


def untouched_by_projector(k8s: Cluster, namespace: str, name: str) -> bool:
    """No field of the producer's Secret was ever written by a manager of projector's."""
    obj = k8s.core.read_namespaced_secret(name, namespace)
    return not any((m.manager or "").startswith("projector") for m in obj.metadata.managed_fields)


def values_anywhere(k8s: Cluster, namespace: str) -> set[str]:
    """Every value of every Secret of `namespace` (decoded)."""
    found: set[str] = set()
    for s in k8s.core.list_namespaced_secret(namespace).items:
        found |= set(decode(s.data or {}).values())
    return found


def strings(secret: client.V1Secret) -> dict[str, str]:
    """The `stringData` of a Secret this test writes; each value is a canary."""
    return dict(secret.string_data or {})


def create(k8s: Cluster, namespace: str, secret: client.V1Secret) -> dict[str, str]:
    """Create a producer's Secret as its author writes it (no label of projector's); its data."""
    data = strings(secret)
    for v in data.values():
        k8s.canaries.add(v)
    k8s.core.create_namespaced_secret(namespace, secret)
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of values over a chart's defaults (maps merge, the rest replaces)."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# -- (a) JupyterHub's hub token to dask-gateway ---------------------------------------------------

HUB = "jupyterhub-dask-gateway"
"""The recipe's folder."""


def token(name: str) -> str:
    """A generated secret as z2jh makes one (64 hex digits), marked as a canary."""
    return f"CANARY-{name}-{secrets.token_hex(32)}"


def z2jh_hub_secret(values: Mapping[str, Any], release: str = "jupyterhub") -> client.V1Secret:
    """Secret `hub` as zero-to-jupyterhub's templates/hub/secret.yaml renders it for `values`.

    Its name is `hub` (fullnameOverride "" by default); its labels are the chart's own
    (`jupyterhub.labels`), which no value can extend: no projector label, no annotation. Its
    data: `values.yaml` (the whole configuration), one `hub.services.<name>.apiToken` per
    service of `hub.services` (generated unless the values set one), and the generated proxy
    token, cookie secret and CryptKeeper keys.
    """
    services = (values.get("hub") or {}).get("services") or {}
    data = {"values.yaml": token("values.yaml") + "\n" + yaml.safe_dump(dict(values))}
    for name, service in services.items():
        data[f"hub.services.{name}.apiToken"] = (service or {}).get("apiToken") or token(name)
    for key in (
        "hub.config.ConfigurableHTTPProxy.auth_token",
        "hub.config.JupyterHub.cookie_secret",
        "hub.config.CryptKeeper.keys",
    ):
        data[key] = token(key.rsplit(".", 1)[-1])
    labels = {
        "app.kubernetes.io/name": "jupyterhub",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/component": "hub",
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": "jupyterhub-4.2.0",
    }
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name="hub", labels=labels),
        type="Opaque",
        string_data=data,
    )


DASK_GATEWAY_DEFAULTS: dict[str, Any] = {
    "gateway": {
        "replicas": 1,
        "annotations": {},
        "env": [],
        "image": {"name": "ghcr.io/dask/dask-gateway-server", "tag": "set-by-chartpress"},
        "auth": {
            "type": "simple",
            "jupyterhub": {
                "apiToken": None,
                "apiTokenFromSecretName": "hub",
                "apiTokenFromSecretKey": "hub.services.dask-gateway.apiToken",
                "apiUrl": None,
            },
        },
        "livenessProbe": {
            "enabled": True,
            "initialDelaySeconds": 5,
            "timeoutSeconds": 2,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "readinessProbe": {
            "enabled": True,
            "initialDelaySeconds": 5,
            "timeoutSeconds": 2,
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
    },
    "rbac": {"enabled": True},
}
"""The defaults of dask-gateway's chart (resources/helm/dask-gateway/values.yaml) this test uses."""


def dask_gateway_values(*overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's values-dask-gateway.yaml over the chart's defaults, then `overrides`."""
    values = deep_merge(DASK_GATEWAY_DEFAULTS, recipe_file(HUB, "values-dask-gateway.yaml"))
    for o in overrides:
        values = deep_merge(values, o)
    return values


def gateway_deployment(
    values: Mapping[str, Any],
    *,
    release: str = "dask-gateway",
    command: list[str] | None = None,
) -> dict[str, Any]:
    """The gateway's Deployment as dask-gateway's templates/gateway/deployment.yaml renders it.

    Release `dask-gateway` makes it `api-dask-gateway`. `gateway.annotations` go on the pod
    template and nowhere else; with `gateway.auth.type: jupyterhub` and no `apiToken`, the
    container reads JUPYTERHUB_API_TOKEN from the Secret and key that
    `apiTokenFromSecretName` / `apiTokenFromSecretKey` name. The image, its tag and pull policy
    come from the values; `command` is the one thing no value sets (the chart runs the image's
    own entrypoint with `args`): a stand-in process where the real image is not here.
    """
    gw = values["gateway"]
    auth = gw["auth"]
    assert auth["type"] == "jupyterhub" and not auth["jupyterhub"]["apiToken"], auth
    name = f"api-{release}"
    chart_labels = {
        "app.kubernetes.io/name": "dask-gateway",
        "helm.sh/chart": "dask-gateway-2025.4.0",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/version": "2025.4.0",
        "app.kubernetes.io/managed-by": "Helm",
        "gateway.dask.org/instance": release,
    }
    match = {"app.kubernetes.io/name": "dask-gateway", "app.kubernetes.io/instance": release}
    checksum = hashlib.sha256(yaml.safe_dump(dict(values)).encode()).hexdigest()
    container: dict[str, Any] = {
        "name": "gateway",
        "image": f"{gw['image']['name']}:{gw['image']['tag']}",
        "args": ["dask-gateway-server", "--config", "/etc/dask-gateway/dask_gateway_config.py"],
        "volumeMounts": [{"mountPath": "/etc/dask-gateway/", "name": "configmap"}],
        "env": [
            *gw["env"],
            {
                "name": "JUPYTERHUB_API_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": auth["jupyterhub"]["apiTokenFromSecretName"],
                        "key": auth["jupyterhub"]["apiTokenFromSecretKey"],
                    }
                },
            },
        ],
        "ports": [{"containerPort": 8000, "name": "api"}],
    }
    if gw["image"].get("pullPolicy"):
        container["imagePullPolicy"] = gw["image"]["pullPolicy"]
    if command is not None:
        container["command"] = command
    for probe in ("livenessProbe", "readinessProbe"):
        p = gw[probe]
        if p["enabled"]:
            container[probe] = {
                "httpGet": {"path": "/api/health", "port": "api"},
                **{k: v for k, v in p.items() if k != "enabled"},
            }
    pod: dict[str, Any] = {
        "volumes": [{"name": "configmap", "configMap": {"name": name}}],
        "containers": [container],
    }
    if values["rbac"]["enabled"]:
        pod["serviceAccountName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": chart_labels},
        "spec": {
            "replicas": gw["replicas"],
            "selector": {"matchLabels": {**match, "app.kubernetes.io/component": "gateway"}},
            "template": {
                "metadata": {
                    "labels": {
                        **chart_labels,
                        "app.kubernetes.io/component": "gateway",
                        "hub.jupyter.org/network-access-hub": "true",
                    },
                    "annotations": {
                        "checksum/configmap": checksum,
                        "checksum/secret": checksum,
                        **gw["annotations"],
                    },
                },
                "spec": pod,
            },
        },
    }


def helm_apply(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    """Apply a rendered object as Helm 4 does: server-side, field manager `helm`, not forced."""
    body = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
    dynamic = DynamicClient(api)
    resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    dynamic.server_side_apply(resource, body=body, field_manager="helm")


@pytest.fixture(scope="module")
def rollout_rbac(admin_client: client.ApiClient, projector_kubeconfig: Any) -> Iterator[None]:
    """What the projector chart's rollouts.enabled=true adds to the shipped RBAC (the recipe
    asks for it), with the admission policy that confines workload patches; removed after."""
    assert apply_manifests(admin_client, RBAC / "rollouts") == 4
    yield
    rbac = client.RbacAuthorizationV1Api(admin_client)
    rbac.delete_cluster_role_binding("projector-rollouts")
    rbac.delete_cluster_role("projector-rollouts")
    admission = client.AdmissionregistrationV1Api(admin_client)
    admission.delete_validating_admission_policy_binding("projector-rollout-annotations-only")
    admission.delete_validating_admission_policy("projector-rollout-annotations-only")


def test_jupyterhub_token_to_dask_gateway_with_both_charts_own_values(
    rollout_rbac: None,
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    admin_client: client.ApiClient,
) -> None:
    apps = client.AppsV1Api(admin_client)
    cp: ControllerProcess = start_controller("--rollouts")
    export, grant = recipe_file(HUB, "export.yaml"), recipe_file(HUB, "grant.yaml")
    hub_ns, (gateway_ns,) = namespaces_of(export, grant)
    make_namespace(hub_ns)
    make_namespace(gateway_ns)

    # what z2jh renders with the recipe's values: many keys, one of them the gateway's token
    hub = create(k8s, hub_ns, z2jh_hub_secret(recipe_file(HUB, "values-jupyterhub.yaml")))
    key = "hub.services.dask-gateway.apiToken"
    assert key in hub and len(hub) == 5
    # what dask-gateway's chart renders with the recipe's values (no node here: zero replicas)
    values = dask_gateway_values({"gateway": {"replicas": 0}})
    deployment = gateway_deployment(values)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"][-1]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "hub", "key": key}  # its defaults
    template_notes = deployment["spec"]["template"]["metadata"]["annotations"]
    assert template_notes[ROLLOUT_ON] == "hub" and ROLLOUT_ON not in deployment["metadata"]
    helm_apply(admin_client, gateway_ns, deployment)

    _, g = apply_recipe(k8s, HUB)
    g_name = g["metadata"]["name"]

    # the copy: Secret hub in dask-gateway, that key only, the value dask-gateway's env var reads
    first = hub[key]
    assert eventually(lambda: k8s.copy_data(gateway_ns, "hub")) == {key: first}
    copy_ = k8s.copy(gateway_ns, "hub")
    assert copy_ is not None and copy_.type == "Opaque"
    eventually(lambda: k8s.status(g_name)["targets"]["projected"] == 1)  # written after the copy
    # the other keys never leave: no Secret of dask-gateway holds any of their values ...
    others = {v for k, v in hub.items() if k != key}
    assert not others & values_anywhere(k8s, gateway_ns)
    # ... even when an admin's grant asks for one: refused, nothing written, the key named
    careless = k8s.grant(
        (hub_ns, "hub"),
        namespaces=[gateway_ns],
        keys=[{"from": "hub.config.JupyterHub.cookie_secret"}],
        target_name="hub-cookie",
    )
    eventually(lambda: failures(k8s, careless).get(gateway_ns) == "KeyNotExported")
    assert k8s.copy(gateway_ns, "hub-cookie") is None
    assert not others & values_anywhere(k8s, gateway_ns)
    # the producer sees who names its Secret and where a copy is (the careless grant has none);
    # its Secret was never written by projector
    status = eventually(lambda: export_status(k8s, hub_ns, export["metadata"]["name"]))
    assert sorted(status["grants"]) == sorted([g_name, careless]) and status["copies"] == 1
    assert untouched_by_projector(k8s, hub_ns, "hub")

    # the gateway opted in on its pod template: baselined, not rolled
    name = deployment["metadata"]["name"]
    h0 = copy_hash(k8s.core, gateway_ns, "hub")
    eventually(lambda: seen(apps, gateway_ns, name) == h0, message="the gateway baselined")
    assert revision(apps, gateway_ns, name) == 1 and stamp(apps, gateway_ns, name, "hub") is None

    # a token rotation (z2jh keeps a token it finds, so this is an admin's or a re-created hub's)
    second = token("dask-gateway")
    k8s.patch_secret(hub_ns, "hub", {"data": {key: second}})
    eventually(lambda: k8s.copy_data(gateway_ns, "hub") == {key: second})
    h1 = copy_hash(k8s.core, gateway_ns, "hub")
    eventually(
        lambda: (
            stamp(apps, gateway_ns, name, "hub") == h1 and revision(apps, gateway_ns, name) == 2
        ),
        message="the gateway rolled once for the new token",
    )
    eventually(cp.idle)
    assert revision(apps, gateway_ns, name) == 2
    assert not others & values_anywhere(k8s, gateway_ns)
    assert untouched_by_projector(k8s, hub_ns, "hub")


def seen(apps: client.AppsV1Api, namespace: str, name: str, copy_name: str = "hub") -> str | None:
    """The baseline projector records on a workload it saw first (on its own metadata)."""
    d = apps.read_namespaced_deployment(name, namespace)
    return (d.metadata.annotations or {}).get(f"projector.nebari.dev/seen-{copy_name}")


# -- (b) a shared TLS Secret to every app namespace by a selector --------------------------------

TLS = "shared-tls"


def cert_manager_secret(name: str, generation: int) -> client.V1Secret:
    """A Secret as cert-manager writes it for a Certificate with `secretName: name`: type
    kubernetes.io/tls, tls.crt / tls.key / ca.crt, and cert-manager's own annotations."""
    data = {
        "tls.crt": f"-----BEGIN CERTIFICATE-----\nCANARY-wildcard-{generation}\n",
        "tls.key": f"-----BEGIN PRIVATE KEY-----\nCANARY-key-{generation}\n",
        "ca.crt": "-----BEGIN CERTIFICATE-----\nCANARY-ca\n",
    }
    notes = {
        "cert-manager.io/certificate-name": name,
        "cert-manager.io/issuer-name": "letsencrypt",
        "cert-manager.io/issuer-kind": "ClusterIssuer",
        "cert-manager.io/issuer-group": "cert-manager.io",
        "cert-manager.io/alt-names": "*.nebari.example.org",
        "cert-manager.io/common-name": "*.nebari.example.org",
    }
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, annotations=notes),
        type="kubernetes.io/tls",
        string_data=data,
    )


def tls_copy(k8s: Cluster, namespace: str, name: str) -> tuple[str, dict[str, str]] | None:
    """(type, data) of the copy in `namespace`, if any."""
    s = k8s.copy(namespace, name)
    if s is None:
        return None
    return str(s.type), decode(s.data or {})


def test_a_shared_tls_secret_reaches_every_app_namespace_by_a_selector(
    controller: ControllerProcess, k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    export, grant = recipe_file(TLS, "export.yaml"), recipe_file(TLS, "grant.yaml")
    source_ns, listed = namespaces_of(export, grant)
    assert not listed  # by the selector alone
    selector = grant["spec"]["target"]["namespaceSelector"]["matchLabels"]
    name = grant["spec"]["source"]["name"]
    make_namespace(source_ns)
    cert = create(k8s, source_ns, cert_manager_secret(name, 1))
    a, b = make_namespace(labels=selector), make_namespace(labels=selector)
    plain = make_namespace()
    _, g = apply_recipe(k8s, TLS)

    want = ("kubernetes.io/tls", cert)
    for ns in (a, b):  # the same name, the same type, every key
        assert eventually(lambda ns=ns: tls_copy(k8s, ns, name)) == want  # type: ignore[misc]
    assert k8s.copy(plain, name) is None
    late = make_namespace(labels=selector)  # an app namespace created later
    assert eventually(lambda: tls_copy(k8s, late, name)) == want

    renewed = cert_manager_secret(name, 2)  # cert-manager renews in place
    for v in strings(renewed).values():
        k8s.canaries.add(v)
    k8s.core.replace_namespaced_secret(name, source_ns, renewed)
    want = ("kubernetes.io/tls", strings(renewed))
    eventually(lambda: all(tls_copy(k8s, ns, name) == want for ns in (a, b, late)))

    # a namespace that loses the label loses the key (onRevoke: Delete)
    k8s.core.patch_namespace(b, {"metadata": {"labels": dict.fromkeys(selector)}})
    eventually(lambda: k8s.copy(b, name) is None)
    assert tls_copy(k8s, a, name) == want and k8s.copy(plain, name) is None
    # the status is written after the delete: await it, not the delete
    eventually(lambda: k8s.status(g["metadata"]["name"])["targets"]["projected"] == 2)
    assert untouched_by_projector(k8s, source_ns, name)


# -- (c) an operator-written OIDC client Secret to one pack ---------------------------------------

OIDC = "oidc-client-to-pack"


def nebari_operator_secret(name: str, app: str, client_secret: str) -> client.V1Secret:
    """The OIDC client Secret nebari-operator writes for NebariApp `app` (its keycloak
    provider's storeClientSecret): `<app>-oidc-client`, Opaque, its own labels, client-id,
    client-secret, issuer-url, and spa-client-id / device-client-id when those flows are on."""
    assert name == f"{app}-oidc-client"
    labels = {
        "app.kubernetes.io/name": "nebariapp",
        "app.kubernetes.io/instance": app,
        "app.kubernetes.io/managed-by": "nebari-operator",
    }
    data = {
        "client-id": f"CANARY-client-id-{app}",
        "client-secret": client_secret,
        "issuer-url": "https://keycloak.nebari.example.org/realms/CANARY-nebari",
        "spa-client-id": f"CANARY-spa-{app}",
        "device-client-id": f"CANARY-device-{app}",
    }
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels=labels), type="Opaque", string_data=data
    )


def test_an_operator_written_oidc_client_reaches_one_pack_with_its_keys_limited_and_renamed(
    controller: ControllerProcess, k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    export, grant = recipe_file(OIDC, "export.yaml"), recipe_file(OIDC, "grant.yaml")
    source_ns, (pack,) = namespaces_of(export, grant)
    name, target = grant["spec"]["source"]["name"], grant["spec"]["target"]["name"]
    assert target != name
    make_namespace(source_ns)
    make_namespace(pack)
    elsewhere = make_namespace()
    written = create(k8s, source_ns, nebari_operator_secret(name, source_ns, "CANARY-secret-1"))
    _, g = apply_recipe(k8s, OIDC)

    three = ("client-id", "client-secret", "issuer-url")
    want = {k: written[k] for k in three}
    assert eventually(lambda: k8s.copy_data(pack, target)) == want
    copy_ = k8s.copy(pack, target)
    assert copy_ is not None and copy_.type == "Opaque"
    assert k8s.copy(pack, name) is None  # under the pack's name only
    left_home = {written["spa-client-id"], written["device-client-id"]}
    assert not left_home & values_anywhere(k8s, pack)

    # the operator rotates the client secret (it rewrites the whole data): the copy follows
    rotated = nebari_operator_secret(name, source_ns, "CANARY-secret-2")
    k8s.canaries.add("CANARY-secret-2")
    k8s.core.replace_namespaced_secret(name, source_ns, rotated)
    eventually(lambda: k8s.copy_data(pack, target) == {**want, "client-secret": "CANARY-secret-2"})

    # exported to that one pack: an admin's grant to another namespace is denied there
    wider = k8s.grant((source_ns, name), namespaces=[elsewhere], keys=[{"from": "client-id"}])
    eventually(lambda: k8s.status(wider).get("targets", {}).get("denied") == 1)
    assert k8s.copy(elsewhere, name) is None
    assert k8s.status(g["metadata"]["name"])["targets"]["projected"] == 1
    assert untouched_by_projector(k8s, source_ns, name)
