"""End to end on kind: a real kubelet runs a pod that reads a Secret from a volume.

This is the base the projection e2e builds on (the controller projects the Secret, the pod reads
the copy); it needs a Docker engine and is skipped, with the reason, where none runs.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kubernetes import client

from tests.bed.kube import api_client, eventually, unique_name

IMAGE = "busybox:1.36.1"


def test_pod_reads_secret_from_volume(kind_kubeconfig: Path) -> None:
    api = api_client(kind_kubeconfig)
    core = client.CoreV1Api(api)
    namespace = unique_name("kind-e2e")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        core.create_namespaced_secret(
            namespace,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="contract"), string_data={"token": "s3cr3t"}
            ),
        )
        volume = client.V1Volume(
            name="contract", secret=client.V1SecretVolumeSource(secret_name="contract")
        )
        container = client.V1Container(
            name="reader",
            image=IMAGE,
            command=["cat", "/etc/contract/token"],
            volume_mounts=[client.V1VolumeMount(name="contract", mount_path="/etc/contract")],
        )
        core.create_namespaced_pod(
            namespace,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="reader"),
                spec=client.V1PodSpec(
                    containers=[container], volumes=[volume], restart_policy="Never"
                ),
            ),
        )
        read = functools.partial(core.read_namespaced_pod, "reader", namespace)

        def finished() -> str | None:
            status = read().status
            phase = status.phase if status else None
            return phase if phase in ("Succeeded", "Failed") else None

        assert eventually(finished, timeout=300, message="pod never finished") == "Succeeded"
        assert core.read_namespaced_pod_log("reader", namespace) == "s3cr3t"
    finally:
        core.delete_namespace(namespace)
        api.close()
