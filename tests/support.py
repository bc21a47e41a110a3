"""Helpers shared by the tests: waiting, naming, ServiceAccount tokens, Docker detection.

``eventually`` is the only way tests wait: the API server is eventually consistent (RBAC caches,
watches, controllers), and fixed sleeps are both slow and flaky.
"""

from __future__ import annotations

import contextlib
import functools
import re
import secrets
import string
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar, cast

import yaml
from kubernetes import client, config, utils

from tests.controlplane.plane import ControlPlane, kubeconfig_dict, write_kubeconfig

T = TypeVar("T")

_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
_NOT_DNS = re.compile(r"[^a-z0-9]+")


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


def write_token_kubeconfig(
    path: Path, plane: ControlPlane, token: str, *, user: str, namespace: str | None = None
) -> Path:
    """A kubeconfig for ``plane`` that authenticates with a bearer token."""
    config_doc = kubeconfig_dict(
        plane.server, plane.ca_file.read_bytes(), user=user, token=token, namespace=namespace
    )
    return write_kubeconfig(path, config_doc)


def status_of(call: Callable[[], object]) -> int:
    """The HTTP status of an API call: 200 if it returned, else the ApiException's status."""
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


@functools.cache
def docker_unavailable_reason() -> str | None:
    """Why kind cannot run here (``docker info`` fails), or None if a Docker engine answers."""
    try:
        result = subprocess.run(
            ["docker", "info"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine (docker info failed: {exc})"
    if result.returncode == 0:
        return None
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    detail = lines[-1] if lines else f"exit code {result.returncode}"
    return f"no Docker engine (docker info failed: {detail})"


class NamespaceFactory(Protocol):
    """Signature of the ``make_namespace`` fixture."""

    def __call__(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
        """Create a namespace (deleted after the test) and return its name."""
        ...


class ServiceAccountKubeconfigFactory(Protocol):
    """Signature of the ``service_account_kubeconfig`` fixture."""

    def __call__(self, cluster_role: str, namespace: str) -> Path:
        """Create a ServiceAccount bound to ``cluster_role`` and return a kubeconfig for it."""
        ...


def projector_kubeconfig(api: client.ApiClient, plane: ControlPlane, dest: Path) -> Path:
    """Install deploy/rbac/ and write a kubeconfig of its ServiceAccount (never admin).

    The controller under test or in the demo then runs with exactly the shipped permissions.
    """
    namespace = "projector-system"
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    for f in sorted((Path(__file__).resolve().parents[1] / "deploy" / "rbac").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            with contextlib.suppress(utils.FailToCreateError):  # already there: idempotent
                utils.create_from_dict(api, doc)
    token = request_token(core, "projector", namespace)
    user = f"system:serviceaccount:{namespace}:projector"
    return write_token_kubeconfig(dest, plane, token, user=user, namespace=namespace)
