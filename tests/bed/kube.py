"""The official client as the bed uses it: waiting, names, clients, the shipped RBAC.

``eventually`` is the only way the bed and the tests wait: the API server is eventually
consistent (RBAC caches, watches, controllers), and fixed sleeps are both slow and flaky.
``projector_kubeconfig`` installs the shipped RBAC and writes a kubeconfig of its
ServiceAccount, so the controller runs with exactly the shipped permissions in the tests, the
demo and the benchmarks alike.
"""

from __future__ import annotations

import base64
import re
import secrets
import string
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar, cast

import yaml
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from tests.bed.controlplane.plane import kubeconfig_dict, write_kubeconfig

T = TypeVar("T")

_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
_NOT_DNS = re.compile(r"[^a-z0-9]+")

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac"
"""The shipped RBAC manifests (rendered from the chart by `make manifests`)."""


def eventually(
    condition: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition was not met",
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Exceptions raised by ``condition`` (e.g. a 404 before an object exists, or a failed ``assert``)
    count as "not yet". On timeout, raise AssertionError with ``message`` and the last exception
    or falsy value, so the failure says what was last seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception as exc:
            last: str = f"last exception: {exc!r}"
            cause: BaseException | None = exc
        else:
            if value:
                return value
            last, cause = f"last value: {value!r}", None
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (within {timeout:g}s; {last})") from cause
        time.sleep(interval)


def unique_name(base: str, max_len: int = 63) -> str:
    """A DNS-1123 label derived from ``base`` (e.g. a test name) plus a random suffix."""
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    slug = _NOT_DNS.sub("-", base.lower()).strip("-").removeprefix("test-")
    if not slug or not slug[0].isalpha():
        slug = f"t-{slug}".rstrip("-")
    slug = slug[: max_len - len(suffix) - 1].rstrip("-")
    return f"{slug}-{suffix}"


def api_client(kubeconfig: Path) -> client.ApiClient:
    """An official-client ApiClient for one kubeconfig, without touching global configuration."""
    api = config.new_client_from_config(config_file=str(kubeconfig), persist_config=False)
    return cast(client.ApiClient, api)


def request_token(
    core_v1: client.CoreV1Api, service_account: str, namespace: str, expiration_seconds: int = 86400
) -> str:
    """A bound ServiceAccount token from TokenRequest, what a pod's projected volume would get."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
    )
    response = core_v1.create_namespaced_service_account_token(
        service_account, namespace, body=request
    )
    if response.status is None or not response.status.token:
        raise AssertionError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return response.status.token


def bind_service_account(
    rbac_v1: client.RbacAuthorizationV1Api,
    binding: str,
    cluster_role: str,
    service_account: str,
    namespace: str,
) -> None:
    """Bind a ClusterRole to a ServiceAccount cluster-wide, the way the chart binds projector's."""
    rbac_v1.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=binding),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role
            ),
            subjects=[
                client.RbacV1Subject(
                    kind="ServiceAccount", name=service_account, namespace=namespace
                )
            ],
        )
    )


def token_kubeconfig(
    path: Path, api: client.ApiClient, service_account: str, namespace: str
) -> Path:
    """A kubeconfig for `api`'s server as ServiceAccount `namespace/service_account`, with a
    fresh bound token: the identity one of its pods would have."""
    token = request_token(client.CoreV1Api(api), service_account, namespace)
    user = f"system:serviceaccount:{namespace}:{service_account}"
    ca = Path(api.configuration.ssl_ca_cert).read_bytes()
    doc = kubeconfig_dict(api.configuration.host, ca, user=user, token=token, namespace=namespace)
    return write_kubeconfig(path, doc)


PF_LEVEL = "X-Kubernetes-PF-PriorityLevel-UID"
"""The response header in which API Priority and Fairness names the level that served it."""


def priority_levels(api: client.ApiClient) -> dict[str, str]:
    """Every PriorityLevelConfiguration's uid (what `PF_LEVEL` carries), by name."""
    res = DynamicClient(api).resources.get(
        api_version="flowcontrol.apiserver.k8s.io/v1", kind="PriorityLevelConfiguration"
    )
    return {i.metadata.name: i.metadata.uid for i in res.get().items}


def apply_manifests(api: client.ApiClient, directory: Path) -> int:
    """Server-side apply every document of `directory/*.yaml`; return how many were applied.

    Idempotent (an object already there is applied again, so a session reusing a plane still
    has its content checked by the server), and nothing is suppressed: a manifest the API
    server refuses, or one of a kind it does not know, fails the run.
    """
    dynamic = DynamicClient(api)
    applied = 0
    for f in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc:
                continue
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            dynamic.server_side_apply(
                resource, body=doc, field_manager="projector-tests", force_conflicts=True
            )
            applied += 1
    return applied


def install_rbac(api: client.ApiClient, rbac: Path = RBAC) -> str:
    """Create projector's namespace and apply the shipped RBAC (`rbac`); return the namespace.

    Idempotent: a session reusing a plane has it applied again.
    """
    namespace = "projector-system"
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as e:
        if e.status != 409:  # only "already exists" is fine
            raise
    if not apply_manifests(api, rbac):
        raise AssertionError(f"no manifest in {rbac}")
    return namespace


def projector_kubeconfig(api: client.ApiClient, dest: Path, rbac: Path = RBAC) -> Path:
    """Install the shipped RBAC (`rbac`) and write a kubeconfig of its ServiceAccount (never
    admin).

    The controller under test or in the demo then runs with exactly the shipped permissions.
    """
    return token_kubeconfig(dest, api, "projector", install_rbac(api, rbac))


def b64(v: str) -> str:
    """Encode text as the API carries Secret data."""
    return base64.b64encode(v.encode()).decode()


def encode(data: Mapping[str, str]) -> dict[str, bytes | str]:
    return {k: b64(v) for k, v in data.items()}


def decode(data: Mapping[str, bytes | str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in data.items()}
