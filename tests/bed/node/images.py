"""Container images without a registry: built here, imported into the node's containerd.

* ``pause`` and ``busybox``: single-layer OCI archives written by this module from one static
  binary each (the kubernetes module's ``pause.c``, Debian's ``busybox-static``): no tool, no
  mount, a second or two.
* a local Python 3.11 base (``localhost/python:3.11-bookworm-local``): a debootstrap of Debian's
  python3 + pip + venv, committed by buildah. Two fixes, both in the base, none in the
  Dockerfile: PEP 668's EXTERNALLY-MANAGED marker removed (the official python images have none),
  and the host's CA bundle as SSL_CERT_FILE (pip and uv in the build go through the same
  TLS-intercepting network as the host). Such a base is for local builds only.
* the controller (``localhost/projector:dev``): the repository's Dockerfile, unchanged, built by
  buildah with ``--isolation chroot`` (changes nothing on the host: no CNI bridge, no iptables),
  with that base as its ``PYTHON_IMAGE`` build argument.

buildah's storage and configuration live under ``.local/buildah`` (else it writes to
``/var/lib/containers`` and ``/etc/cni``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.bed.controlplane.plane import REPO_ROOT

if TYPE_CHECKING:
    from tests.bed.node.node import Node

LOCAL = REPO_ROOT / ".local"
IMAGES_DIR = LOCAL / "images"
BUILDAH_DIR = LOCAL / "buildah"
PROJECTOR_IMAGE = os.environ.get("IMAGE", "localhost/projector:dev")
PYTHON_BASE = "localhost/python:3.11-bookworm-local"
BUSYBOX_IMAGE = "localhost/busybox:local"
BUSYBOX = Path("/bin/busybox")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SYSTEM_CONTAINERS_DIR = Path("/var/lib/containers")
DEBIAN_SUITE = "bookworm"
# Debian's python3-pip would be a dpkg-owned pip that `pip uninstall` refuses to remove (no
# RECORD), so the Dockerfile's final-stage uninstall would silently keep it: the base gets pip
# from Debian's pip wheel, installed *by pip* (as in the official python images), instead.
BASE_PACKAGES = "python3,python3-pip-whl,python-is-python3,ca-certificates"
EXTERNALLY_MANAGED = "usr/lib/python3.11/EXTERNALLY-MANAGED"
BUSYBOX_APPLETS = ("sh", "cat", "sleep", "echo", "ls", "date", "env", "test", "touch", "id")


class ImageError(RuntimeError):
    """An image could not be built or imported."""


# --- single-layer images, written directly --------------------------------------------------------


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_oci_archive(
    dest: Path,
    name: str,
    files: Mapping[str, Path],
    *,
    symlinks: Mapping[str, str] | None = None,
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = (),
) -> Path:
    """An OCI image layout in a tar (what ``ctr images import`` reads), named ``name``.

    ``files`` maps a path in the image to a host file; the layer is reproducible (fixed mtimes).
    """
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        dirs = sorted({str(Path(p).parent) for p in [*files, *(symlinks or {})]} - {"/", "."})
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            layer.addfile(info)
        for path, source in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            data = source.read_bytes()
            info.size, info.mode = len(data), 0o755
            layer.addfile(info, io.BytesIO(data))
        for path, target in sorted((symlinks or {}).items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            layer.addfile(info)
    diff = layer_buf.getvalue()
    blob = gzip.compress(diff, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint) or None, "Cmd": list(cmd) or None},
            "rootfs": {"type": "layers", "diff_ids": [_digest(diff)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _digest(blob),
                    "size": len(blob),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name,
                    },
                }
            ],
        }
    ).encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as archive:
        entries = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": index,
        }
        for data in (config, manifest, blob):
            entries[f"blobs/sha256/{_digest(data).removeprefix('sha256:')}"] = data
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    tmp.replace(dest)
    return dest


def import_archive(node: Node, archive: Path) -> None:
    """``ctr images import`` into the node's CRI namespace (what the kubelet's pods use)."""
    node.ctr("images", "import", "--no-unpack=false", str(archive))


def import_pause_image(node: Node) -> None:
    """The sandbox image containerd is pinned to, from the cached static pause binary."""
    from tests.bed.node.node import KUBE_VERSION, PAUSE_IMAGE

    archive = IMAGES_DIR / f"pause-{KUBE_VERSION}.tar"
    if not archive.exists():
        write_oci_archive(
            archive, PAUSE_IMAGE, {"/pause": node.node_binaries / "pause"}, entrypoint=["/pause"]
        )
    node.ctr("images", "import", str(archive))


def import_busybox_image(node: Node) -> str:
    """``localhost/busybox:local`` (Debian's static busybox and a few applet links) -> its name."""
    archive = IMAGES_DIR / "busybox.tar"
    if not archive.exists():
        if not BUSYBOX.exists():
            raise ImageError(f"{BUSYBOX} missing: run `make node-packages` (busybox-static)")
        links = {f"/bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS}
        write_oci_archive(archive, BUSYBOX_IMAGE, {"/bin/busybox": BUSYBOX}, symlinks=links)
    node.ctr("images", "import", str(archive))
    return BUSYBOX_IMAGE


# --- buildah ------------------------------------------------------------------------------------


def buildah_env() -> dict[str, str]:
    """Environment for buildah with storage, config and temp files under .local/buildah."""
    storage = BUILDAH_DIR / "storage.conf"
    containers = BUILDAH_DIR / "containers.conf"
    tmp = BUILDAH_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    storage.write_text(
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{BUILDAH_DIR / "storage"}"\n'
        f'runroot = "{BUILDAH_DIR / "run"}"\n'
    )
    containers.write_text(
        "[network]\n"
        f'network_config_dir = "{BUILDAH_DIR / "cni"}"\n'
        f'cni_plugin_dirs = ["/usr/lib/cni"]\n'
        "[engine]\n"
        f'tmp_dir = "{tmp}"\n'
    )
    return {
        **os.environ,
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_CONF": str(containers),
        "TMPDIR": str(tmp),
        "BUILDAH_ISOLATION": "chroot",
    }


def buildah(*args: str, timeout: float = 900) -> str:
    """Run buildah with the project's storage; its stdout, or ImageError with its stderr."""
    if shutil.which("buildah") is None:
        raise ImageError("buildah missing: run `make node-packages`")
    # As root, containers/image keeps a blob-info cache in /var/lib/containers/cache whatever the
    # storage configuration says (no flag moves it in this buildah): remove what a call created.
    created = not SYSTEM_CONTAINERS_DIR.exists()
    try:
        return _buildah(args, timeout)
    finally:
        if created:
            shutil.rmtree(SYSTEM_CONTAINERS_DIR, ignore_errors=True)


def _buildah(args: Sequence[str], timeout: float) -> str:
    result = subprocess.run(
        ["buildah", *args],
        capture_output=True,
        text=True,
        env=buildah_env(),
        check=False,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise ImageError(
            f"buildah {' '.join(args)}: exit {result.returncode}: {result.stderr[-2000:]}"
        )
    return result.stdout


def has_image(name: str) -> bool:
    """True if buildah's store under .local has the image."""
    try:
        buildah("inspect", "--type", "image", name)
    except ImageError:
        return False
    return True


def debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (the first ``URIs:`` of a deb822 source, or
    the first ``deb`` line), so debootstrap fetches from where apt-get does."""
    for path in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and not line.rstrip().endswith("-security"):
                return line.split()[1]
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt").glob("sources.list.d/*.list")]:
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if parts[:1] == ["deb"]:
                    return next(p for p in parts[1:] if not p.startswith("["))
    raise ImageError("no Debian mirror configured for apt on this machine")


def build_python_base(force: bool = False) -> str:
    """``localhost/python:3.11-bookworm-local`` from debootstrap, unless buildah has it."""
    if not force and has_image(PYTHON_BASE):
        return PYTHON_BASE
    rootfs = LOCAL / "python-base-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    result = subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={BASE_PACKAGES}",
            DEBIAN_SUITE,
            str(rootfs),
            debian_mirror(),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    if result.returncode != 0:
        raise ImageError(
            f"debootstrap: exit {result.returncode}: {result.stdout[-1500:]}{result.stderr[-1500:]}"
        )
    try:
        (rootfs / EXTERNALLY_MANAGED).unlink(missing_ok=True)
        wheels = sorted((rootfs / "usr/share/python-wheels").glob("pip-*.whl"))
        if not wheels:
            raise ImageError("debootstrap's rootfs has no pip wheel (python3-pip-whl)")
        wheel = f"/usr/share/python-wheels/{wheels[-1].name}"
        pip = subprocess.run(
            [
                "chroot",
                str(rootfs),
                "python3",
                f"{wheel}/pip",
                "install",
                "--no-index",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "-q",
                wheel,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if pip.returncode != 0:
            raise ImageError(f"installing pip into the base: {pip.stderr[-1500:]}")
        shutil.rmtree(rootfs / "usr/share/python-wheels", ignore_errors=True)
        shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
        for trim in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / trim, ignore_errors=True)
        container = buildah("from", "scratch").strip()
        try:
            buildah("copy", container, f"{rootfs}/", "/")
            buildah(
                "config",
                "--env",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                "--env",
                "PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "python3",
                container,
            )
            buildah("commit", "--rm", container, PYTHON_BASE)
        except ImageError:
            buildah("rm", container)
            raise
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return PYTHON_BASE


@dataclass(frozen=True)
class BuiltImage:
    """An image buildah built, its OCI archive and the numbers the README states."""

    name: str
    archive: Path
    seconds: float
    size_bytes: int  # uncompressed, as buildah reports it
    archive_bytes: int  # the OCI archive (compressed layers) imported into containerd


def build_projector_image(name: str = PROJECTOR_IMAGE) -> BuiltImage:
    """The repository's Dockerfile, with the local base, by buildah; plus its OCI archive."""
    seconds = bud(name, REPO_ROOT)
    archive = IMAGES_DIR / (name.replace("/", "_").replace(":", "_") + ".tar")
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    buildah("push", name, f"oci-archive:{archive}:{name}")
    return BuiltImage(name, archive, seconds, _image_size(name), archive.stat().st_size)


def bud(name: str, context: Path, labels: Mapping[str, str] | None = None) -> float:
    """Build ``context``'s Dockerfile on the local base as ``name``, each of ``labels`` both an
    image label and a manifest annotation; the seconds it took."""
    base = build_python_base()
    marks = [
        arg
        for k, v in (labels or {}).items()
        for arg in ("--label", f"{k}={v}", "--annotation", f"{k}={v}")
    ]
    started = time.monotonic()
    buildah(
        "bud",
        "--isolation",
        "chroot",
        "--pull=never",
        "--layers",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        *marks,
        "-t",
        name,
        "-f",
        str(context / "Dockerfile"),
        str(context),
    )
    return time.monotonic() - started


def image_digest(name: str) -> str:
    """The digest buildah's store gives an image (its manifest's, as a registry would)."""
    return buildah("inspect", "--type", "image", "--format", "{{.FromImageDigest}}", name).strip()


UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def _image_size(name: str) -> int:
    """The unpacked size buildah reports ("308 MB": decimal units), in bytes."""
    images = json.loads(buildah("images", "--json", name))
    number, _, unit = str(images[0]["size"]).partition(" ")
    return int(float(number) * UNITS[unit])
