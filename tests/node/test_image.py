"""The controller's image, built here from the repository's Dockerfile, run on the real node.

``make image``'s recipe (tests/bed/node/images.py: buildah ``--isolation chroot`` with the local
debootstrap base as PYTHON_IMAGE), imported into the node's containerd, run as a pod with the
chart's own security contexts (values.yaml): it runs as 65532:65532, starts with a read-only root
filesystem, holds no pip, uv or compiler, and its CLI works. Its size is printed (and stated in
docs/node.md).

Found here: the image's ``USER 65532:65532`` alone gives uid 65532 but gid 0 on this kubelet +
containerd (the kubelet passes the image's uid as runAsUser, the group then comes from the
image's /etc/passwd, which has no such user): the chart's ``runAsGroup: 65532`` is what makes the
group right, so it must stay.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import yaml
from kubernetes import client

from tests.bed.controlplane.plane import REPO_ROOT
from tests.bed.helm import chart
from tests.bed.kube import eventually
from tests.bed.node.images import BuiltImage, buildah
from tests.bed.node.node import Node

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
    node: Node, projector_image: BuiltImage, core_v1: client.CoreV1Api, namespace: str
) -> None:
    print(
        f"\n{projector_image.name}: {projector_image.size_bytes / 1e6:.0f} MB unpacked, "
        f"{projector_image.archive_bytes / 2**20:.0f} MiB OCI archive, "
        f"built in {projector_image.seconds:.0f}s"
    )
    config = json.loads(buildah("inspect", "--type", "image", projector_image.name))
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
                    "image": projector_image.name,
                    "imagePullPolicy": "Never",
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
    assert projector_image.size_bytes < 400e6


def test_make_image_builds_with_buildah_where_no_engine_runs(projector_image: BuiltImage) -> None:
    """`make image` itself (the session's image is already built: this run reuses its layers),
    and buildah leaves nothing outside .local/ (no /var/lib/containers, no /etc/cni)."""
    outside = ("/var/lib/containers", "/etc/cni", "/var/lib/cni", "/var/tmp/buildah-cache-0")
    before = {p: os.path.lexists(p) for p in outside}
    result = subprocess.run(
        ["make", "-s", "image", f"IMAGE={projector_image.name}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if "with buildah" in result.stdout:  # no Docker or Podman engine runs here
        assert f"built {projector_image.name}" in result.stdout, result.stdout
    assert {p: os.path.lexists(p) for p in outside} == before
