"""An OCI registry on loopback for the test bed: `make registry-up`, the node tier, `make release`.

go-containerregistry's registry (``main.go``, built by ``build.sh``, cached outside the
repository; the referrers API on) listens on ``127.0.0.1:PORT`` over plain HTTP, keeps blobs
under its root and manifests in memory: a registry lives as long as its process, as the control
plane does. Clients reach it as users reach theirs: buildah pushes the image, helm pushes the
chart (``--plain-http``), the node's containerd pulls by digest through a ``hosts.toml`` that
names the registry's HTTP endpoint (`containerd_hosts`).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.bed.controlplane.plane import (
    Process,
    die_with_parent_hook,
    free_port,
    proc_stat,
    stop_processes,
    tail,
)

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
STATE_FILE = "registry.json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class RegistryError(RuntimeError):
    """The registry could not be built, started or reached."""


def registry_binary() -> Path:
    """Build (or reuse) the registry; the script holds a lock while it builds."""
    out = subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def get(host: str, path: str, accept: str = "application/json") -> tuple[bytes, dict[str, str]]:
    """GET ``http://host/v2/path`` as a registry client; the body and the response headers."""
    request = urllib.request.Request(f"http://{host}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read(), dict(response.headers)


class Registry:
    """One registry process under ``root``; `host` is what image and chart references name."""

    def __init__(self, root: Path, *, die_with_parent: bool = False) -> None:
        self.root = root
        self.die_with_parent = die_with_parent
        self.port = 0
        self.process: Process | None = None

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: the registry part of every reference to it."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the server on a free loopback port; return once ``/v2/`` answers 200."""
        exe = registry_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = self.root / "registry.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [
                    str(exe),
                    "--address",
                    self.host,
                    "--disk",
                    str(self.root / "blobs"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent_hook() if self.die_with_parent else None,
            )
        stat = proc_stat(popen.pid)
        self.process = Process(
            "registry", str(exe), popen.pid, log, None if stat is None else stat.start_ticks, popen
        )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self.process.alive() or time.monotonic() > deadline:
                self.stop()
                raise RegistryError(
                    f"the registry did not answer /v2/ on {self.host}:\n{tail(log)}"
                )
            time.sleep(0.05)  # allowed-sleep: poll interval of a loop with a deadline
        (self.root / STATE_FILE).write_text(
            json.dumps(
                {
                    "port": self.port,
                    "pid": popen.pid,
                    "exe": str(exe),
                    "start_ticks": self.process.start_ticks,
                    "log": str(log),
                }
            )
        )

    def ready(self) -> bool:
        """True if ``GET /v2/`` answers 200 (the distribution API's version check)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        """True while the process runs and answers."""
        return self.process is not None and self.process.alive() and self.ready()

    def stop(self) -> None:
        """Stop the process (its blobs are kept under root until the next start)."""
        if self.process is not None:
            stop_processes([self.process])
            self.process = None
        (self.root / STATE_FILE).unlink(missing_ok=True)

    @classmethod
    def load(cls, root: Path) -> Registry | None:
        """A handle on the registry an earlier start() recorded under root (None if none)."""
        try:
            state = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        registry = cls(root)
        registry.port = int(state["port"])
        registry.process = Process(
            "registry", state["exe"], int(state["pid"]), Path(state["log"]), state["start_ticks"]
        )
        return registry


def containerd_hosts(certs_dir: Path, host: str) -> Path:
    """Tell a containerd whose registry ``config_path`` is ``certs_dir`` to reach ``host`` over
    plain HTTP (its default for a registry is HTTPS); returns the hosts.toml written."""
    path = certs_dir / host / "hosts.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'server = "http://{host}"\n\n'
        f'[host."http://{host}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )
    return path


def tag(host: str, repository: str, digest: str, name: str) -> str:
    """Tag the manifest ``digest`` of ``repository`` as ``name`` too (as ``crane tag`` does): a
    new reference to the same image; returns ``HOST/REPOSITORY:NAME``."""
    manifest, headers = get(host, f"{repository}/manifests/{digest}", OCI_MANIFEST)
    put = urllib.request.Request(
        f"http://{host}/v2/{repository}/manifests/{name}",
        data=manifest,
        method="PUT",
        headers={"Content-Type": headers.get("Content-Type", OCI_MANIFEST)},
    )
    with urllib.request.urlopen(put, timeout=30):
        pass
    return f"{host}/{repository}:{name}"
