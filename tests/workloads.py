"""Consumer workloads of the rollout tests (integration and node tiers), read as admin."""

from __future__ import annotations

import hashlib

from kubernetes import client

ROLLOUT_ON = "projector.nebari.dev/rollout-on"
REVISION = "deployment.kubernetes.io/revision"


def consumer(
    name: str,
    image: str,
    *,
    replicas: int = 0,
    rollout_on: str | None = None,
    secret: str = "db",
    command: list[str] | None = None,
) -> client.V1Deployment:
    """A Deployment whose container reads `secret`'s key `password` as the env var PASSWORD."""
    labels = {"app": name}
    container = client.V1Container(
        name="reader",
        image=image,
        image_pull_policy="Never",
        command=command or ["sh", "-c", "sleep 3600"],
        env=[
            client.V1EnvVar(
                name="PASSWORD",
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(name=secret, key="password")
                ),
            )
        ],
    )
    notes = {ROLLOUT_ON: rollout_on} if rollout_on is not None else None
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, annotations=notes),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(termination_grace_period_seconds=0, containers=[container]),
            ),
        ),
    )


def revision(apps: client.AppsV1Api, namespace: str, name: str) -> int:
    """The Deployment's revision: 1 when created, one more per rollout of its pod template."""
    d = apps.read_namespaced_deployment(name, namespace)
    return int((d.metadata.annotations or {}).get(REVISION, "0"))


def stamp(apps: client.AppsV1Api, namespace: str, name: str, copy: str = "db") -> str | None:
    """The pod-template annotation projector sets for `copy`, if any."""
    d = apps.read_namespaced_deployment(name, namespace)
    notes = d.spec.template.metadata.annotations or {}
    return notes.get(f"projector.nebari.dev/rollout-{copy}")


def copy_hash(core: client.CoreV1Api, namespace: str, name: str = "db") -> str:
    """The stamp a rollout of `name`'s current content puts on the template (read as admin)."""
    s = core.read_namespaced_secret(name, namespace)
    content = str(s.metadata.annotations["projector.nebari.dev/content-hash"])
    return hashlib.sha256(f"{content}/{s.metadata.uid}".encode()).hexdigest()[:16]
