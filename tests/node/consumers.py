"""What the node tier's tests of consumer pods are handed (the `consumers` fixture)."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client

from tests.bed.node.node import Node
from tests.support import Cluster, NamespaceFactory


@dataclass(frozen=True)
class Consumers:
    """What a test of consumer pods uses: the node they run on, the busybox image they run,
    the cluster's helpers (namespaces, sources, grants) and the admin API for pods and
    Deployments."""

    node: Node
    busybox: str
    k8s: Cluster
    make_namespace: NamespaceFactory
    core: client.CoreV1Api
    apps: client.AppsV1Api
