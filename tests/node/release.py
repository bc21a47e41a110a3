"""The chart's release on the test node: install from the registry, wait for Ready pods, find
the leader."""

from __future__ import annotations

import time
from pathlib import Path

from kubernetes import client

from tests.bed.helm import chart
from tests.bed.kube import eventually
from tests.bed.release import Published, helm_env

# The docs' install is `helm install projector ... -n projector-system` (what `make node-up`
# users type, on a fresh cluster). The node tier shares the session's control plane with the
# integration tier, whose fixtures install deploy/rbac (ServiceAccount, ClusterRole, ... all
# named `projector`), so the chart here is its own release, under names that cannot collide.
NAMESPACE = "projector-node"
RELEASE = "projector-node"
NODE_VALUES = chart.CHART / "ci" / "node-values.yaml"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
LEASE = "projector-leader"


class Release:
    """``helm install RELEASE oci://REGISTRY/charts/projector --version V -n NAMESPACE
    --create-namespace -f deploy/helm/projector/ci/node-values.yaml`` (the chart and the image
    as `make release` published them), and what tests ask of it."""

    def __init__(
        self, helm_bin: Path, kubeconfig: Path, api: client.ApiClient, published: Published
    ) -> None:
        self.helm_bin = helm_bin
        self.published = published
        self.kubeconfig = kubeconfig
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.install_seconds = 0.0  # helm install -> both replicas Ready, the last install

    def helm(self, *args: str) -> str:
        """helm against the plane, with its caches (and client-go's discovery cache, under
        $HOME/.kube) beside the plane's kubeconfig, never in the checkout or the real home."""
        env = {
            **helm_env(self.kubeconfig.parent / "helm-home"),
            "KUBECONFIG": str(self.kubeconfig),
        }
        return chart.helm(self.helm_bin, *args, env=env)

    def chart(self, published: Published | None = None) -> list[str]:
        """helm's arguments naming a published chart (this release's by default)."""
        p = published or self.published
        return [p.chart, "--version", p.version, "--plain-http"]

    def install(
        self, *extra: str, published: Published | None = None, timeout: float = 180
    ) -> None:
        """Install (or upgrade to ``published``) and return once every replica is Ready by the
        kubelet's probes."""
        started = time.monotonic()
        self.helm(
            "upgrade",
            "--install",
            RELEASE,
            *self.chart(published),
            "-n",
            NAMESPACE,
            "--create-namespace",
            "-f",
            str(NODE_VALUES),
            *extra,
        )
        self.wait_rolled_out(timeout)
        self.install_seconds = time.monotonic() - started

    def uninstall(self) -> None:
        """helm uninstall, if installed."""
        if RELEASE in self.helm("list", "-q", "-n", NAMESPACE).split():
            self.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait")

    def pods(self) -> list[client.V1Pod]:
        """The release's pods that are not being deleted."""
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    @staticmethod
    def is_ready(pod: client.V1Pod) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

    def ready_pods(self) -> list[client.V1Pod]:
        return [p for p in self.pods() if self.is_ready(p)]

    def wait_rolled_out(self, timeout: float = 180) -> None:
        """The Deployment's every replica updated, available and Ready."""

        def done() -> bool:
            d = self.apps.read_namespaced_deployment(RELEASE, NAMESPACE)
            s = d.status
            want = d.spec.replicas
            return bool(
                s.observed_generation == d.metadata.generation
                and s.updated_replicas == want
                and s.ready_replicas == want
                and s.available_replicas == want
                and (s.replicas or 0) == want
                and len(self.ready_pods()) == want
            )

        eventually(done, timeout, interval=0.1, message="the chart's replicas Ready")

    def leader(self) -> str | None:
        """The Lease holder (a pod name), or None."""
        try:
            lease = self.coordination.read_namespaced_lease(LEASE, NAMESPACE)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return lease.spec.holder_identity or None

    def logs(self) -> str:
        """Every current pod's log, read through the API (pods/log)."""
        return "\n".join(
            str(self.core.read_namespaced_pod_log(str(p.metadata.name), NAMESPACE))
            for p in self.pods()
        )
