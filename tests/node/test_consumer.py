"""Consumer pods read their copies: the users' own words, "reading projected Secrets from pods".

The chart's own pods project (the ``release`` fixture installs them). A consumer Deployment
mounts the projected Secret as a volume and takes one key as an env var; its container prints
both (as SHA-256 digests: a pod log is no place for a Secret's value) and the test reads them
from the pod's log through the API server (pods/log -> the kubelet).

After the producer rotates the source, the copy changes, the kubelet rewrites the mounted file
(within its syncFrequency, 100ms on the test node; Kubernetes' default 1m gives 60-90 s) and the
env var does not change until the container restarts (docs/node.md says what to do about it).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any, cast

import yaml
from kubernetes import client

from tests.bed.kube import eventually
from tests.bed.launcher import REPO
from tests.bed.node.pods import consumer_spec
from tests.node.consumers import Consumers
from tests.node.release import Release

READER = (
    'echo env=$(printf %s "$PASSWORD" | busybox sha256sum | busybox cut -c1-64); '
    "while true; do "
    "echo file=$(busybox sha256sum /etc/db/password | busybox cut -c1-64); sleep 0.2; "
    "done"
)


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def reader_deployment(name: str, image: str) -> client.V1Deployment:
    spec = consumer_spec(
        image, ["sh", "-c", READER], "db", "/etc/db", env=("PASSWORD", "password"), read_only=True
    )
    return deployment(name, spec)


def deployment(name: str, spec: client.V1PodSpec) -> client.V1Deployment:
    """One replica of `spec`, its pods labelled app=`name`."""
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=spec
            ),
        ),
    )


def running_pod(c: Consumers, namespace: str, app: str) -> str:
    """The name of the pod of Deployment `app`, once it runs on the node."""

    def running() -> str:
        pods = c.core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        up = [p for p in pods if p.status.phase == "Running"]
        assert up and up[0].spec.node_name == c.node.name, [p.status for p in pods]
        return str(up[0].metadata.name)

    return str(eventually(running, 90, message="the consumer pod Running on the node"))


def pod_log(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    return str(core.read_namespaced_pod_log(pod, namespace, tail_lines=400))


def last(log: str, key: str) -> str | None:
    found = re.findall(rf"^{key}=([0-9a-f]{{64}})$", log, re.M)
    return found[-1] if found else None


def test_a_consumer_pod_reads_its_copy_as_a_file_and_an_env_var_and_only_the_file_rotates(
    consumers: Consumers, release: Release
) -> None:
    c, k8s = consumers, consumers.k8s
    producer, consumer = c.make_namespace(), c.make_namespace()
    k8s.source(producer, "db", {"password": "CANARY-pod-1"}, export_to=consumer)
    k8s.grant((producer, "db"), namespaces=[consumer])
    eventually(lambda: k8s.copy_data(consumer, "db") == {"password": "CANARY-pod-1"})

    c.apps.create_namespaced_deployment(consumer, reader_deployment("reader", c.busybox))

    pod = running_pod(c, consumer, "reader")
    log = functools.partial(pod_log, c.core, consumer, pod)

    old = digest("CANARY-pod-1")
    eventually(lambda: last(log(), "env") == old and last(log(), "file") == old, 30)

    k8s.patch_secret(producer, "db", {"data": {"password": "CANARY-pod-2"}})
    new = digest("CANARY-pod-2")
    eventually(lambda: last(log(), "file") == new, 30, message="the mounted file rotated")
    assert last(log(), "env") == old  # printed once at start: the env var is the start's value
    current = c.core.read_namespaced_pod(pod, consumer)
    assert current.status.container_statuses[0].restart_count == 0


CONTRACT_READER = (
    'echo env-url=$(printf %s "$HUB_URL" | busybox sha256sum | busybox cut -c1-64); '
    "while true; do "
    "echo file-client=$(busybox sha256sum /etc/hub/oidc-client-id | busybox cut -c1-64); "
    "echo file-token=$(busybox sha256sum /etc/hub-secret/api-token | busybox cut -c1-64); "
    "sleep 0.2; done"
)


def example(path: str, kind: str, name: str) -> dict[str, Any]:
    """One document of the repository's own example files, as shipped."""
    for doc in yaml.safe_load_all((REPO / path).read_text()):
        if doc and doc["kind"] == kind and doc["metadata"]["name"] == name:
            return cast(dict[str, Any], doc)
    raise AssertionError(f"{path}: no {kind} {name}")


def contract_reader(name: str, image: str) -> client.V1Deployment:
    """dask-gateway's side: the hub URL as an env var from the ConfigMap copy, the client id
    as a file of it, and the API token as a file of the Secret copy of the same name."""
    container = client.V1Container(
        name="reader",
        image=image,
        image_pull_policy="Never",
        command=["sh", "-c", CONTRACT_READER],
        env=[
            client.V1EnvVar(
                name="HUB_URL",
                value_from=client.V1EnvVarSource(
                    config_map_key_ref=client.V1ConfigMapKeySelector(
                        name="jupyterhub-contract", key="hub-url"
                    )
                ),
            )
        ],
        volume_mounts=[
            client.V1VolumeMount(name="hub", mount_path="/etc/hub", read_only=True),
            client.V1VolumeMount(name="hub-secret", mount_path="/etc/hub-secret", read_only=True),
        ],
    )
    volumes = [
        client.V1Volume(
            name="hub",
            config_map=client.V1ConfigMapVolumeSource(name="jupyterhub-contract"),
        ),
        client.V1Volume(
            name="hub-secret",
            secret=client.V1SecretVolumeSource(secret_name="jupyterhub-contract"),
        ),
    ]
    spec = client.V1PodSpec(
        termination_grace_period_seconds=0, containers=[container], volumes=volumes
    )
    return deployment(name, spec)


def test_a_consumer_pod_reads_the_configmap_contract_next_to_the_secret_one(
    consumers: Consumers, release: Release
) -> None:
    """The Nebari example of grants/: JupyterHub publishes its URL and OIDC client id as a
    ConfigMap and its token as a Secret; dask-gateway's pod reads both copies, named alike.

    The example's own ConfigMap and grants are applied, in fresh namespaces; the ConfigMap's
    rotation reaches the mounted file.
    """
    c, k8s = consumers, consumers.k8s
    producer, consumer = c.make_namespace(), c.make_namespace()
    shipped = example("grants/examples/producers.yaml", "ConfigMap", "hub-endpoints")["data"]
    data = {k: f"CANARY-pod-{k}" for k in shipped}  # the example's keys; values to search for
    k8s.config_source(producer, "hub-endpoints", data, export_to=consumer)
    token = {"hub.services.dask-gateway.apiToken": "CANARY-pod-3"}
    k8s.source(producer, "hub", token, export_to=consumer)
    for path in (
        "grants/jupyterhub-endpoints-to-dask-gateway.yaml",
        "grants/jupyterhub-token-to-dask-gateway.yaml",
    ):
        spec = yaml.safe_load((REPO / path).read_text())["spec"]
        k8s.grant(
            (producer, spec["source"]["name"]),
            kind=spec["source"].get("kind"),
            keys=spec.get("keys"),
            target_name=spec["target"]["name"],
            namespaces=[consumer],
        )
    want = {k: data[k] for k in ("hub-url", "oidc-client-id")}
    eventually(lambda: k8s.config_data(consumer, "jupyterhub-contract") == want)
    eventually(
        lambda: k8s.copy_data(consumer, "jupyterhub-contract") == {"api-token": "CANARY-pod-3"}
    )

    c.apps.create_namespaced_deployment(consumer, contract_reader("hub-reader", c.busybox))

    pod = running_pod(c, consumer, "hub-reader")
    log = functools.partial(pod_log, c.core, consumer, pod)

    eventually(
        lambda: (
            last(log(), "env-url") == digest(data["hub-url"])
            and last(log(), "file-client") == digest(data["oidc-client-id"])
            and last(log(), "file-token") == digest("CANARY-pod-3")
        ),
        30,
    )
    k8s.patch_config_map(producer, "hub-endpoints", {"data": {"oidc-client-id": "CANARY-pod-7"}})
    eventually(
        lambda: last(log(), "file-client") == digest("CANARY-pod-7"),
        30,
        message="the mounted ConfigMap file rotated",
    )
