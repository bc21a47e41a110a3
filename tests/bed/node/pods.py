"""Pods on the bed's node: run one, read its log through the API, delete it, and the pod spec of
a consumer of a copy (the demo, the node tests and the rotation-to-pod benchmark share it)."""

from __future__ import annotations

from collections.abc import Sequence

from kubernetes import client

from tests.bed.kube import eventually, unique_name


def run_pod(
    core: client.CoreV1Api,
    namespace: str,
    image: str,
    command: Sequence[str],
    *,
    name: str | None = None,
    host_network: bool = False,
) -> str:
    """Create a one-container pod that never restarts; its name."""
    name = name or unique_name("pod")
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            host_network=host_network,
            termination_grace_period_seconds=0,
            containers=[
                client.V1Container(
                    name="main", image=image, image_pull_policy="Never", command=list(command)
                )
            ],
        ),
    )
    core.create_namespaced_pod(namespace, body)
    return name


def pod_log(core: client.CoreV1Api, namespace: str, name: str, container: str | None = None) -> str:
    """The container's log, read through the API server (pods/log -> the kubelet)."""
    if container is None:
        return str(core.read_namespaced_pod_log(name, namespace))
    return str(core.read_namespaced_pod_log(name, namespace, container=container))


def delete_pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Delete now, and wait until it is gone (its containers stopped)."""
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except client.ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    eventually(gone, 60, message=f"pod {namespace}/{name} still there")


def consumer_spec(
    image: str,
    command: Sequence[str],
    secret: str,
    mount: str,
    *,
    container: str = "reader",
    env: tuple[str, str] | None = None,
    read_only: bool = False,
) -> client.V1PodSpec:
    """A consumer of a copy, as a pack's pod is: `secret` as a volume at `mount` and, with
    `env` (variable, key), one key of it as an environment variable (secretKeyRef)."""
    env_vars = None
    if env is not None:
        ref = client.V1SecretKeySelector(name=secret, key=env[1])
        env_vars = [
            client.V1EnvVar(name=env[0], value_from=client.V1EnvVarSource(secret_key_ref=ref))
        ]
    mount_as = client.V1VolumeMount(name="copy", mount_path=mount, read_only=read_only or None)
    return client.V1PodSpec(
        termination_grace_period_seconds=0,
        containers=[
            client.V1Container(
                name=container,
                image=image,
                image_pull_policy="Never",
                command=list(command),
                env=env_vars,
                volume_mounts=[mount_as],
            )
        ],
        volumes=[
            client.V1Volume(name="copy", secret=client.V1SecretVolumeSource(secret_name=secret))
        ],
    )
