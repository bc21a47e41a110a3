"""A release as users receive it: the image and the chart in an OCI registry, pinned by digest.

`publish(tree, registry)` does what `make release` does, for any source tree (the checkout, or
an earlier release exported from git by `checkout`, which the upgrade test installs first):

1. the version is the tree's ``pyproject.toml`` version, its notes the matching section of the
   checkout's ``CHANGELOG.md`` (no section, no release);
2. the image is built from the tree's Dockerfile (buildah, as `make image`), labelled and
   annotated with its source, revision, version, creation time and base, and pushed as
   ``REGISTRY/projector:VERSION``; the registry's digest is the one the chart pins;
3. its SBOM (CycloneDX, ``uv export`` of the tree's lock file, runtime packages only) is pushed
   as an OCI artifact whose ``subject`` is the image (found by the registry's referrers API);
4. the chart is packaged with ``version`` and ``appVersion`` = the version and its default image
   ``REGISTRY/projector@sha256:...``, and pushed (``helm push`` to ``oci://REGISTRY/charts``).

A record of what was published goes to ``.local/release/VERSION.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tomllib
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.bed.controlplane.plane import REPO_ROOT
from tests.bed.helm import chart
from tests.bed.node.images import PYTHON_BASE, bud, build_python_base, buildah, image_digest
from tests.bed.registry import OCI_MANIFEST

LOCAL = REPO_ROOT / ".local" / "release"
UV = REPO_ROOT / ".local" / "tools" / "bin" / "uv"
SOURCE = "https://github.com/nebari-dev/projector"
IMAGE_REPOSITORY = "projector"
CHART_REPOSITORY = "charts"
SBOM_TYPE = "application/vnd.cyclonedx+json"


class ReleaseError(RuntimeError):
    """A release cannot be made as asked (no notes for its version, a failed build or push)."""


@dataclass(frozen=True)
class Published:
    """What one `publish` put in the registry."""

    version: str
    revision: str
    image: str
    """``REGISTRY/projector@sha256:...``: what the chart's default pins."""
    chart: str
    """``oci://REGISTRY/charts/projector``, to install with ``--version``."""
    chart_digest: str
    sbom_digest: str
    base: str
    """The base image the build used, by name and digest."""
    build_seconds: float


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """A command's stdout, or ReleaseError with its stderr."""
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, check=False
    )
    if result.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, args))}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def project(tree: Path) -> dict[str, Any]:
    """The ``[project]`` table of the tree's pyproject.toml."""
    return dict(tomllib.loads((tree / "pyproject.toml").read_text())["project"])


def version_of(tree: Path) -> str:
    """The project's version: ``pyproject.toml``'s, its one place."""
    return str(project(tree)["version"])


CHANGELOG = REPO_ROOT / "CHANGELOG.md"


def notes(version: str, changelog: Path = CHANGELOG) -> str:
    """The CHANGELOG section of ``version`` (Keep a Changelog), without its heading: the
    checkout's changelog describes every release, those made before it was written too."""
    text = changelog.read_text()
    match = re.search(
        rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## |^\[|\Z)", text, re.S | re.M
    )
    if match is None:
        raise ReleaseError(f"CHANGELOG.md has no section for {version}: write its notes first")
    return match.group(1).strip()


def previous(repo: Path = REPO_ROOT) -> tuple[str, str]:
    """The release before the checkout's version, as (version, git commit).

    Its tag ``vX.Y.Z`` where the clone has tags; else the commit just before the one that set
    the checkout's version in pyproject.toml (the last commit of the previous release).
    """
    current = version_of(repo)
    bumps = run(
        "git",
        "log",
        "--format=%H",
        "-S",
        f'version = "{current}"',
        "--",
        "pyproject.toml",
        cwd=repo,
    ).split()
    if bumps:
        before = f"{bumps[-1]}^"
    elif version_of_ref(repo, "HEAD") != current:
        before = "HEAD"  # the version is set in the working tree, not committed yet
    else:
        raise ReleaseError(f"no commit sets version {current} in pyproject.toml")
    version = version_of_ref(repo, before)
    tag = f"v{version}"
    if (
        subprocess.run(
            ["git", "rev-parse", "-q", "--verify", f"refs/tags/{tag}"],
            cwd=repo,
            capture_output=True,
            check=False,
        ).returncode
        == 0
    ):
        before = tag
    return version, run("git", "rev-parse", f"{before}^{{commit}}", cwd=repo).strip()


def shallow(repo: Path = REPO_ROOT) -> bool:
    """True in a shallow clone, whose history may not reach the previous release."""
    return run("git", "rev-parse", "--is-shallow-repository", cwd=repo).strip() == "true"


def version_of_ref(repo: Path, ref: str) -> str:
    """The pyproject.toml version at a git ref."""
    text = run("git", "show", f"{ref}:pyproject.toml", cwd=repo)
    return str(tomllib.loads(text)["project"]["version"])


def checkout(commit: str, dest: Path, repo: Path = REPO_ROOT) -> Path:
    """The tree of ``commit`` exported into ``dest`` (``git archive``: no .git, no worktree)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=repo, capture_output=True, check=False)
    if archive.returncode != 0:
        raise ReleaseError(f"git archive {commit}: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def revision(tree: Path, repo: Path = REPO_ROOT) -> tuple[str, str]:
    """(commit, its ISO time) for the checkout (``-dirty`` if it has changes) or an export of
    one (``.release-revision``, written by `publish`'s caller)."""
    marker = tree / ".release-revision"
    commit = (
        marker.read_text().strip()
        if marker.exists()
        else run("git", "rev-parse", "HEAD", cwd=repo).strip()
    )
    created = run("git", "show", "-s", "--format=%cI", commit, cwd=repo).strip()
    if not marker.exists() and run(
        "git", "status", "--porcelain", "--untracked-files=no", cwd=repo
    ):
        commit += "-dirty"
    return commit, created


def sbom(tree: Path) -> bytes:
    """CycloneDX 1.5 of the runtime packages in the tree's lock file (what the image holds)."""
    return run(
        UV,
        "export",
        "--format",
        "cyclonedx1.5",
        "--no-dev",
        "--frozen",
        "--quiet",
        "--project",
        tree,
        "--preview-features",
        "sbom-export",
        cwd=tree,
    ).encode()


def _push_blob(registry: str, repository: str, data: bytes) -> dict[str, object]:
    """A monolithic blob upload (POST then PUT); its descriptor's digest and size."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = urllib.request.Request(
        f"http://{registry}/v2/{repository}/blobs/uploads/", method="POST"
    )
    with urllib.request.urlopen(start, timeout=30) as response:
        location = response.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    sep = "&" if "?" in location else "?"
    put = urllib.request.Request(
        f"{location}{sep}digest={digest}",
        data=data,
        method="PUT",
        headers={"Content-Type": "application/octet-stream"},
    )
    with urllib.request.urlopen(put, timeout=30):
        pass
    return {"digest": digest, "size": len(data)}


def push_referrer(
    registry: str, repository: str, subject: str, data: bytes, artifact_type: str
) -> str:
    """Push ``data`` as an OCI artifact that refers to the manifest ``subject`` (a digest in
    ``repository``), as ``oras attach`` does; the artifact manifest's digest."""
    with urllib.request.urlopen(
        urllib.request.Request(
            f"http://{registry}/v2/{repository}/manifests/{subject}",
            method="HEAD",
            headers={"Accept": OCI_MANIFEST},
        ),
        timeout=30,
    ) as response:
        subject_size = int(response.headers["Content-Length"])
        subject_type = response.headers["Content-Type"]
    # The config's media type is the artifact's too: registries list a referrer by it (this one,
    # go-containerregistry's, ignores the manifest's artifactType).
    config = {**_push_blob(registry, repository, b"{}"), "mediaType": artifact_type}
    layer = {**_push_blob(registry, repository, data), "mediaType": artifact_type}
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": config,
            "layers": [layer],
            "subject": {"mediaType": subject_type, "digest": subject, "size": subject_size},
        }
    ).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    put = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{digest}",
        data=manifest,
        method="PUT",
        headers={"Content-Type": OCI_MANIFEST},
    )
    with urllib.request.urlopen(put, timeout=30):
        pass
    return digest


def pin_image(values: Path, repository: str, digest: str) -> None:
    """Set the chart's default ``image.repository`` and ``image.digest`` in its values.yaml,
    keeping every comment (the lines under ``image:`` are rewritten in place)."""
    text = values.read_text()
    block = re.search(r"^image:\n((?:[ #].*\n|\n)*)", text, re.M)
    if block is None:
        raise ReleaseError(f"{values} has no image: block")
    body = block.group(1)
    for key, value in (("repository", repository), ("digest", digest)):
        body, n = re.subn(rf"^(  {key}:).*$", rf"\1 {value}", body, count=1, flags=re.M)
        if n != 1:
            raise ReleaseError(f"{values}: image.{key} not found")
    values.write_text(text[: block.start(1)] + body + text[block.end(1) :])


def helm_env(home: Path) -> dict[str, str]:
    """helm's config, cache and registry credentials under ``home``, never in the real home."""
    return {
        **os.environ,
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def publish(tree: Path, registry: str, helm_bin: Path, workdir: Path = LOCAL) -> Published:
    """Build and push the image, its SBOM and the chart of ``tree`` to ``registry``."""
    version = version_of(tree)
    notes(version)  # a release names what it changes, or is not made
    commit, created = revision(tree)
    base = f"{PYTHON_BASE}@{image_digest(build_python_base())}"  # built first on a fresh clone
    tag = f"{registry}/{IMAGE_REPOSITORY}:{version}"
    labels = {
        "org.opencontainers.image.source": SOURCE,
        "org.opencontainers.image.revision": commit,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.title": "projector",
        "org.opencontainers.image.licenses": project(tree)["license"],
        "org.opencontainers.image.base.name": PYTHON_BASE,
        "org.opencontainers.image.base.digest": base.rpartition("@")[2],
    }
    seconds = bud(tag, tree, labels)
    work = workdir / version
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    digest_file = work / "image.digest"
    buildah("push", "--tls-verify=false", "--digestfile", str(digest_file), tag, f"docker://{tag}")
    digest = digest_file.read_text().strip()
    document = sbom(tree)
    (work / "sbom.cdx.json").write_bytes(document)
    sbom_digest = push_referrer(registry, IMAGE_REPOSITORY, digest, document, SBOM_TYPE)

    chart_dir = work / "chart" / "projector"
    shutil.copytree(tree / "deploy" / "helm" / "projector", chart_dir)
    pin_image(chart_dir / "values.yaml", f"{registry}/{IMAGE_REPOSITORY}", digest)
    env = helm_env(work / "helm-home")
    chart.helm(
        helm_bin,
        "package",
        str(chart_dir),
        "--version",
        version,
        "--app-version",
        version,
        "-d",
        str(work),
        env=env,
    )
    package = work / f"projector-{version}.tgz"
    pushed = subprocess.run(
        [
            str(helm_bin),
            "push",
            str(package),
            f"oci://{registry}/{CHART_REPOSITORY}",
            "--plain-http",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if pushed.returncode != 0:
        raise ReleaseError(f"helm push {package}: {pushed.stderr.strip()}")
    chart_digest = re.search(r"Digest: (sha256:[0-9a-f]{64})", pushed.stdout + pushed.stderr)
    published = Published(
        version=version,
        revision=commit,
        image=f"{registry}/{IMAGE_REPOSITORY}@{digest}",
        chart=f"oci://{registry}/{CHART_REPOSITORY}/projector",
        chart_digest=chart_digest.group(1) if chart_digest else "",
        sbom_digest=sbom_digest,
        base=base,
        build_seconds=round(seconds, 1),
    )
    (workdir / f"{version}.json").write_text(json.dumps(asdict(published), indent=2) + "\n")
    return published
