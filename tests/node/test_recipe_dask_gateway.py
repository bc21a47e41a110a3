"""The JupyterHub -> dask-gateway recipe (grants/recipes/jupyterhub-dask-gateway/) on the real node.

The chart's release projects, with `rollouts.enabled=true`. The recipe's export and grant are
applied as written beside Secret `hub` as zero-to-jupyterhub renders it, and the gateway runs
as dask-gateway's chart renders its Deployment with the recipe's values: `api-dask-gateway`,
its ServiceAccount and ConfigMap volume, the env var JUPYTERHUB_API_TOKEN from a
`secretKeyRef` to Secret `hub` key `hub.services.dask-gateway.apiToken` (the chart's
defaults), its liveness and readiness probes on /api/health, and `gateway.annotations` on the
pod template only. The image is this project's own (as released to the test bed's registry,
set through the chart's `gateway.image` values); the one thing no value sets is the command: a
stand-in for dask-gateway-server that prints the token's SHA-256 (a pod log is no place for the
value) and answers the probes. A token rotation must reach a new gateway pod through one rollout.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.bed.kube import eventually
from tests.integration.test_recipes import (
    HUB,
    apply_recipe,
    create,
    dask_gateway_values,
    gateway_deployment,
    helm_apply,
    namespaces_of,
    recipe_file,
    token,
    values_anywhere,
    z2jh_hub_secret,
)
from tests.node.consumers import Consumers
from tests.node.release import NAMESPACE, Release
from tests.workloads import revision

KEY = "hub.services.dask-gateway.apiToken"
GATEWAY = """\
import hashlib, http.server, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
assert os.path.isfile(sys.argv[sys.argv.index("--config") + 1])  # the chart's ConfigMap
value = os.environ["JUPYTERHUB_API_TOKEN"].encode()
print("token=" + hashlib.sha256(value).hexdigest(), flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("", 8000), Health).serve_forever()
"""
"""dask-gateway-server's stand-in, run by the image's python with the chart's args after it."""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture(scope="module")
def rollout_release(release: Release) -> Iterator[Release]:
    """The release upgraded with rollouts on (the recipe asks for it); put back afterwards."""
    release.install("--set=rollouts.enabled=true", "--set=controller.logLevel=debug")
    try:
        yield release
    finally:
        release.install()


class Gateway:
    """The gateway Deployment's pods, as the test sees them through the API."""

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str) -> None:
        self.core, self.namespace, self.name = core, namespace, name

    def ready(self) -> tuple[str, str] | None:
        """(pod, token digest it printed) of the one pod, once it is the only pod and Ready."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector="app.kubernetes.io/component=gateway"
        ).items
        pods = [p for p in pods if p.metadata.deletion_timestamp is None]
        if len(pods) != 1 or not any(
            c.type == "Ready" and c.status == "True" for c in pods[0].status.conditions or []
        ):
            return None
        name = str(pods[0].metadata.name)
        log = str(self.core.read_namespaced_pod_log(name, self.namespace))
        found = re.findall(r"^token=([0-9a-f]{64})$", log, re.M)
        return (name, found[-1]) if found else None

    def showing(self, value: str) -> tuple[str, str] | None:
        shown = self.ready()
        return shown if shown is not None and shown[1] == digest(value) else None


def decided(release: Release, workload: str) -> bool:
    """The leader logged a decision about `workload` (deployments/<ns>/<name>)."""
    leader = release.leader()
    if leader is None:
        return False
    log = str(release.core.read_namespaced_pod_log(leader, NAMESPACE))
    return any(
        json.loads(line).get("workload") == workload
        for line in log.splitlines()
        if '"rollout checked"' in line
    )


def test_the_gateway_reads_the_projected_token_as_its_env_var_and_is_rolled_when_it_rotates(
    consumers: Consumers, rollout_release: Release
) -> None:
    c, k8s = consumers, consumers.k8s
    export, grant = recipe_file(HUB, "export.yaml"), recipe_file(HUB, "grant.yaml")
    hub_ns, (gateway_ns,) = namespaces_of(export, grant)
    c.make_namespace(hub_ns)
    c.make_namespace(gateway_ns)
    hub = create(k8s, hub_ns, z2jh_hub_secret(recipe_file(HUB, "values-jupyterhub.yaml")))
    apply_recipe(k8s, HUB)
    eventually(lambda: k8s.copy_data(gateway_ns, "hub") == {KEY: hub[KEY]})

    # dask-gateway's chart, with the recipe's values and the image of this project
    image = rollout_release.published.image.partition("@")[0]
    tag = rollout_release.published.version
    values = dask_gateway_values(
        {"gateway": {"image": {"name": image, "tag": tag, "pullPolicy": "IfNotPresent"}}}
    )
    deployment = gateway_deployment(values, command=["python", "-c", GATEWAY])
    name = deployment["metadata"]["name"]
    c.core.create_namespaced_service_account(
        gateway_ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    config = {"dask_gateway_config.py": "# the chart's configuration (not read by the stand-in)\n"}
    c.core.create_namespaced_config_map(
        gateway_ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=config)
    )
    helm_apply(c.apps.api_client, gateway_ns, deployment)
    gateway = Gateway(c.core, gateway_ns, name)
    first = eventually(lambda: gateway.showing(hub[KEY]), 120, message="the gateway Ready")
    eventually(
        lambda: decided(rollout_release, f"deployments/{gateway_ns}/{name}"),
        30,
        message="projector saw the gateway",
    )
    assert revision(c.apps, gateway_ns, name) == 1  # opting in rolled nothing

    second = token("dask-gateway")
    k8s.patch_secret(hub_ns, "hub", {"data": {KEY: second}})
    rolled = eventually(
        lambda: gateway.showing(second), 120, message="a new gateway pod with the new token"
    )
    assert rolled[0] != first[0] and revision(c.apps, gateway_ns, name) == 2  # one rollout
    others = {v for k, v in hub.items() if k != KEY}
    assert not others & values_anywhere(k8s, gateway_ns)  # nothing else left jupyterhub
    k8s.canaries.assert_absent("the chart's pod logs", rollout_release.logs())
    k8s.canaries.assert_absent(
        "the gateway's log", str(c.core.read_namespaced_pod_log(rolled[0], gateway_ns))
    )
