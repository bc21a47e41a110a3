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

import hashlib
import re

from kubernetes import client

from tests.node.node import Node
from tests.node.pods import consumer_spec
from tests.node.release import Release
from tests.support import Cluster, NamespaceFactory, eventually

READER = (
    'echo env=$(printf %s "$PASSWORD" | busybox sha256sum | busybox cut -c1-64); '
    "while true; do "
    "echo file=$(busybox sha256sum /etc/db/password | busybox cut -c1-64); sleep 0.2; "
    "done"
)


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def reader_deployment(name: str, image: str) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=consumer_spec(
                    image,
                    ["sh", "-c", READER],
                    "db",
                    "/etc/db",
                    env=("PASSWORD", "password"),
                    read_only=True,
                ),
            ),
        ),
    )


def last(log: str, key: str) -> str | None:
    found = re.findall(rf"^{key}=([0-9a-f]{{64}})$", log, re.M)
    return found[-1] if found else None


def test_a_consumer_pod_reads_its_copy_as_a_file_and_an_env_var_and_only_the_file_rotates(
    node: Node,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    release: Release,
    core_v1: client.CoreV1Api,
    apps_v1: client.AppsV1Api,
    busybox: str,
) -> None:
    producer, consumer = make_namespace(), make_namespace()
    k8s.source(producer, "db", {"password": "CANARY-pod-1"}, export_to=consumer)
    k8s.grant((producer, "db"), namespaces=[consumer])
    eventually(lambda: k8s.copy_data(consumer, "db") == {"password": "CANARY-pod-1"})

    apps_v1.create_namespaced_deployment(consumer, reader_deployment("reader", busybox))

    def running_pod() -> str:
        pods = core_v1.list_namespaced_pod(consumer, label_selector="app=reader").items
        running = [p for p in pods if p.status.phase == "Running"]
        assert running and running[0].spec.node_name == node.name, [p.status for p in pods]
        return str(running[0].metadata.name)

    pod = eventually(running_pod, 90, message="the consumer pod Running on the node")

    def log() -> str:
        return str(core_v1.read_namespaced_pod_log(pod, consumer, tail_lines=400))

    old = digest("CANARY-pod-1")
    eventually(lambda: last(log(), "env") == old and last(log(), "file") == old, 30)

    k8s.patch_secret(producer, "db", {"data": {"password": "CANARY-pod-2"}})
    new = digest("CANARY-pod-2")
    eventually(lambda: last(log(), "file") == new, 30, message="the mounted file rotated")
    assert last(log(), "env") == old  # printed once at start: the env var is the start's value
    current = core_v1.read_namespaced_pod(pod, consumer)
    assert current.status.container_statuses[0].restart_count == 0
