"""The controller's image, built here from the repository's Dockerfile, run on the real node.

``make release``'s recipe (tests/bed/release: buildah ``--isolation chroot`` with the local
debootstrap base as PYTHON_IMAGE, pushed to the test bed's registry), pulled by digest by the
node's containerd, run as a pod with the chart's own security contexts (values.yaml): it runs as
65532:65532, starts with a read-only root filesystem, holds no pip, uv or compiler, and its CLI
works. Its size is printed (and stated in docs/node.md). The release also carries its OCI
labels and annotations, and its SBOM as a referrer that names what uv.lock pins.

Found here: the image's ``USER 65532:65532`` alone gives uid 65532 but gid 0 on this kubelet +
containerd (the kubelet passes the image's uid as runAsUser, the group then comes from the
image's /etc/passwd, which has no such user): the chart's ``runAsGroup: 65532`` is what makes the
group right, so it must stay.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from typing import Any

import yaml
from kubernetes import client

from tests.bed.controlplane.plane import REPO_ROOT
from tests.bed.helm import chart
from tests.bed.kube import eventually
from tests.bed.node.images import buildah
from tests.bed.node.node import Node
from tests.bed.registry import Registry, get
from tests.bed.release import IMAGE_REPOSITORY, SBOM_TYPE, Published

IMAGE = "localhost/projector:dev"
PROBE = """
import importlib.util, json, os, shutil, subprocess
try:
    open("/probe", "w")
    root = "writable"
except OSError as exc:
    root = exc.strerror
tools = ["pip", "pip3", "uv", "gcc", "cc", "x86_64-linux-gnu-gcc", "make"]
print("PROBE " + json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "root": root,
    "pip_module": importlib.util.find_spec("pip") is not None,
    "on_path": [t for t in tools if shutil.which(t)],
    "help": subprocess.run(["projector", "--help"], capture_output=True, text=True).stdout[:200],
}))
"""


def test_the_image_runs_as_65532_on_a_read_only_root_without_installers(
    node: Node, published: Published, core_v1: client.CoreV1Api, namespace: str
) -> None:
    tag = f"{published.image.partition('@')[0]}:{published.version}"
    size = json.loads(buildah("images", "--json", tag))[0]["size"]
    print(f"\n{published.image}: {size} unpacked, built in {published.build_seconds:.0f}s")
    config = json.loads(buildah("inspect", "--type", "image", tag))
    assert config["OCIv1"]["config"]["User"] == "65532:65532"
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "image-probe"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": values["podSecurityContext"],
            "containers": [
                {
                    "name": "probe",
                    "image": published.image,  # by digest, pulled from the registry
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", PROBE],
                    "securityContext": values["securityContext"],
                }
            ],
        },
    }
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    core_v1.create_namespaced_pod(namespace, pod)  # type: ignore[arg-type]  # a manifest dict

    def probe() -> dict[str, object]:
        assert core_v1.read_namespaced_pod("image-probe", namespace).status.phase == "Succeeded"
        log = str(core_v1.read_namespaced_pod_log("image-probe", namespace))
        line = next(x for x in log.splitlines() if x.startswith("PROBE "))
        return dict(json.loads(line.removeprefix("PROBE ")))

    got = eventually(probe, 90, message="the image's probe pod")
    assert (got["uid"], got["gid"]) == (65532, 65532)
    assert got["root"] == "Read-only file system"
    assert got["pip_module"] is False and got["on_path"] == []
    assert "usage: projector" in str(got["help"])
    number, unit = str(size).split()
    assert float(number) * {"MB": 1e6, "GB": 1e9}[unit] < 400e6
    # never imported: the kubelet had containerd pull it from the registry, by its digest
    status = core_v1.read_namespaced_pod("image-probe", namespace).status.container_statuses[0]
    assert status.image_id.endswith(published.image.rpartition("@")[2]), status.image_id


def test_the_release_is_labelled_and_its_sbom_is_a_referrer(
    registry: Registry, published: Published
) -> None:
    """The manifest's annotations and the config's labels name source, revision and version; the
    referrers API finds the SBOM, which lists the runtime packages uv.lock pins."""
    digest = published.image.rpartition("@")[2]
    manifest = json.loads(get(registry.host, f"{IMAGE_REPOSITORY}/manifests/{digest}")[0])
    config_blob = manifest["config"]["digest"]
    labels = json.loads(get(registry.host, f"{IMAGE_REPOSITORY}/blobs/{config_blob}")[0])
    for marks in (manifest["annotations"], labels["config"]["Labels"]):
        assert marks["org.opencontainers.image.version"] == published.version
        assert marks["org.opencontainers.image.revision"].startswith(published.revision[:40])
        assert marks["org.opencontainers.image.source"].startswith("https://")
        assert marks["org.opencontainers.image.base.digest"].startswith("sha256:")
    index = json.loads(get(registry.host, f"{IMAGE_REPOSITORY}/referrers/{digest}")[0])
    (sbom_ref,) = [m for m in index["manifests"] if m["digest"] == published.sbom_digest]
    assert sbom_ref["artifactType"] == SBOM_TYPE
    artifact = json.loads(
        get(registry.host, f"{IMAGE_REPOSITORY}/manifests/{sbom_ref['digest']}")[0]
    )
    assert artifact["subject"]["digest"] == digest
    bom = json.loads(
        get(registry.host, f"{IMAGE_REPOSITORY}/blobs/{artifact['layers'][0]['digest']}")[0]
    )
    components = {c["name"]: c["version"] for c in bom["components"]}
    locked = {
        p["name"]: p["version"]
        for p in tomllib.loads((REPO_ROOT / "uv.lock").read_text())["package"]
    }
    for runtime in (
        "kr8s",
        "structlog",
        "tenacity",
        "prometheus-client",
        "opentelemetry-sdk",
    ):
        assert components[runtime] == locked[runtime], runtime
    # runtime packages only: no test, lint or test-client package
    assert not {"pytest", "mypy", "kubernetes"} & set(components)


def test_make_image_builds_with_buildah_where_no_engine_runs(published: Published) -> None:
    """`make image` itself (the session's release is already built: this run reuses its
    layers), and buildah leaves nothing outside .local/ (no /var/lib/containers, no /etc/cni)."""
    outside = ("/var/lib/containers", "/etc/cni", "/var/lib/cni", "/var/tmp/buildah-cache-0")
    before = {p: os.path.lexists(p) for p in outside}
    result = subprocess.run(
        ["make", "-s", "image", f"IMAGE={IMAGE}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if "with buildah" in result.stdout:  # no Docker or Podman engine runs here
        assert f"built {IMAGE}" in result.stdout, result.stdout
    assert {p: os.path.lexists(p) for p in outside} == before
