"""The node tier's fixtures: one real node (containerd + kubelet + runc) per session.

The node joins the session's control plane (tests/conftest.py) with its own identity. It needs
root and Debian's runc and CNI plugins (``make node-packages``); where they are missing every
node test skips, naming what is missing. Only one node can run on a machine at a time: a node of
``make node-up`` makes the session fail with that reason instead of fighting over the cgroups.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.bed.controlplane.plane import REPO_ROOT, ControlPlane
from tests.bed.helm import chart
from tests.bed.kube import api_client
from tests.bed.node.images import import_busybox_image
from tests.bed.node.node import (
    HostSnapshot,
    Node,
    ensure_node_binaries,
    missing_prerequisites,
    running_node,
)
from tests.bed.registry import Registry, containerd_hosts
from tests.bed.release import Published, checkout, previous, publish, shallow
from tests.node.consumers import Consumers
from tests.node.release import Release
from tests.support import Cluster, NamespaceFactory

BEFORE = pytest.StashKey[HostSnapshot]()


@pytest.fixture(scope="session")
def node_binaries() -> Path:
    """containerd, its shim, ctr and the pause binary (built once, cached)."""
    reason = missing_prerequisites()
    if reason is not None:
        pytest.skip(reason)
    return ensure_node_binaries()


@pytest.fixture(scope="session")
def node(
    control_plane: ControlPlane,
    binaries: Path,
    node_binaries: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[Node]:
    """A Ready node for the session; the host as it was before is in pytestconfig.stash."""
    root = tmp_path_factory.mktemp("node")
    node = Node(root, control_plane, binaries, node_binaries, die_with_parent=True)
    node.claim()
    pytestconfig.stash[BEFORE] = HostSnapshot.take(root)
    with running_node(node):
        yield node


@pytest.fixture(scope="session")
def host_before(node: Node, pytestconfig: pytest.Config) -> HostSnapshot:
    """The host's state taken before the session's node started."""
    return pytestconfig.stash[BEFORE]


@pytest.fixture(scope="session")
def busybox(node: Node) -> str:
    """The name of a busybox image imported into the node."""
    return import_busybox_image(node)


@pytest.fixture(scope="session")
def apps_v1(admin_client: client.ApiClient) -> client.AppsV1Api:
    """Admin AppsV1Api (Deployments)."""
    return client.AppsV1Api(admin_client)


@pytest.fixture
def consumers(
    node: Node,
    busybox: str,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    core_v1: client.CoreV1Api,
    apps_v1: client.AppsV1Api,
) -> Consumers:
    return Consumers(node, busybox, k8s, make_namespace, core_v1, apps_v1)


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """helm, built from its Go module (cached)."""
    return chart.helm_binary()


@pytest.fixture(scope="session")
def registry(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The test bed's OCI registry on loopback; the node's containerd reaches it over plain
    HTTP by its hosts.toml."""
    reg = Registry(tmp_path_factory.mktemp("registry"), die_with_parent=True)
    reg.start()
    containerd_hosts(node.certs_dir, reg.host)
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def published(
    registry: Registry, helm_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Published:
    """`make release` of the checkout into the session's registry: the image (buildah, from the
    Dockerfile), its SBOM and the chart pinned to the image's digest."""
    return publish(REPO_ROOT, registry.host, helm_bin, tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="session")
def previous_published(
    registry: Registry, helm_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Published:
    """The previous release (its tag, or the last commit before this version), exported from
    git and published as `make release` publishes the checkout."""
    if shallow():
        pytest.skip("a shallow clone: no history of the previous release to build it from")
    version, commit = previous()
    tree = checkout(commit, tmp_path_factory.mktemp(f"projector-{version}") / "tree")
    (tree / ".release-revision").write_text(commit)
    return publish(tree, registry.host, helm_bin, tmp_path_factory.mktemp("release-previous"))


@pytest.fixture(scope="session")
def release(
    node: Node, published: Published, helm_bin: Path, control_plane: ControlPlane
) -> Iterator[Release]:
    """The chart installed from the registry as the docs say, with ci/node-values.yaml, both
    replicas Ready (the kubelet pulled the image by digest)."""
    rel = Release(
        helm_bin, control_plane.kubeconfig, api_client(control_plane.kubeconfig), published
    )
    rel.install()
    try:
        yield rel
    finally:
        rel.uninstall()
        rel.api.close()
