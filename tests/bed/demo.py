"""`make demo`: the two Nebari wirings of grants/, projected live on a local control plane.

Starts (or reuses) the local control plane, runs `projector run` with the shipped RBAC, applies
the producers of grants/examples/ and the grants of grants/, and narrates what it observes:
the copies appearing, a token rotation landing in the copy, a new pack namespace served on
creation, and a key that never leaves its producer. Where a node can start here (tests/bed/node:
root, Debian's runc and CNI plugins), a pod in dask-gateway then reads its copy as a file and an
env var, and a rotation reaches the file but not the env var; where it cannot, the demo says
exactly why and goes on. Every step is observed through the API,
not assumed; the exit code is 0 only if every step was seen. Colour only on a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, utils

from tests.bed.controlplane.plane import ControlPlane, ControlPlaneError, ensure_binaries
from tests.bed.kube import api_client, decode, eventually, projector_kubeconfig
from tests.bed.launcher import REPO, ControllerProcess, launch
from tests.bed.node.images import ImageError, import_busybox_image
from tests.bed.node.node import Node, NodeError, ensure_node_binaries, missing_prerequisites
from tests.bed.node.pods import consumer_spec

T = TypeVar("T")
GROUP, VERSION, PLURAL = "projector.nebari.dev", "v1alpha1", "projectiongrants"
TTY = sys.stdout.isatty()


def paint(text: str, code: str) -> str:
    return f"\033[{code}m{text}\033[0m" if TTY else text


class Story:
    """Numbered steps; each waits for what it claims, with a deadline."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.n = 0

    def say(self, text: str) -> None:
        print(paint("  " + text, "2"))

    def step(self, title: str, check: Callable[[], T], timeout: float = 30.0) -> T | None:
        self.n += 1
        print(paint(f"[{self.n}] ", "1;36") + title)
        start = time.monotonic()
        try:
            value = eventually(check, timeout=timeout, interval=0.02)
        except AssertionError as e:
            print(paint(f"    ✗ {e}", "31"))
            self.failed.append(title)
            return None
        print(paint(f"    ✓ observed in {(time.monotonic() - start) * 1000:.0f} ms", "32"))
        return value


def apply(api: client.ApiClient, path: Path) -> None:
    """Create each object, or replace it if it exists (so the demo can run again)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        meta = doc["metadata"]
        try:
            if doc["kind"] == "ProjectionGrant":
                custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, doc)
            else:
                utils.create_from_dict(api, doc)
        except (client.ApiException, utils.FailToCreateError) as e:
            codes = [x.status for x in getattr(e, "api_exceptions", [e])]
            if any(c != 409 for c in codes):
                raise
            if doc["kind"] == "Secret":
                core.replace_namespaced_secret(meta["name"], meta["namespace"], doc)
            elif doc["kind"] == "ProjectionGrant":
                old = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, meta["name"])
                meta["resourceVersion"] = old["metadata"]["resourceVersion"]
                custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, meta["name"], doc)


def secret_data(core: client.CoreV1Api, ns: str, name: str) -> dict[str, str] | None:
    try:
        s = core.read_namespaced_secret(name, ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return decode(s.data or {})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make demo")
    p.add_argument(
        "--root",
        default=str(REPO / ".local" / "cluster"),
        help="control plane directory (started with `make cluster-up` if needed)",
    )
    p.add_argument(
        "--kubeconfig",
        default=str(REPO / ".local" / "kubeconfig"),
        help="where the admin kubeconfig is written",
    )
    a = p.parse_args(argv)
    root, admin = Path(a.root), Path(a.kubeconfig)
    print(
        paint("projector demo", "1") + ": cross-namespace contract Secrets, only where "
        "an admin grant and the producer's opt-in agree\n"
    )
    up = ["up", "--root", str(root), "--kubeconfig", str(admin)]
    if subprocess.run([sys.executable, "-m", "tests.bed.controlplane", *up], cwd=REPO).returncode:
        print(paint("could not start the local control plane", "31"))
        return 1
    plane = ControlPlane.load(root)
    assert plane is not None
    api = api_client(plane.kubeconfig)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    story = Story()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = projector_kubeconfig(api, Path(tmp) / "kubeconfig")
        ctl = launch(kubeconfig, Path(tmp) / "controller.log")
        try:
            token = run_story(story, core, custom, api, ctl)
            pod_story(story, core, plane, Path(tmp), token)
        finally:
            code = ctl.stop(signal.SIGINT)
            if code != 0:
                story.failed.append(f"controller exit code {code}")
            if story.failed:
                print(ctl.logs()[-4000:])
    print()
    if story.failed:
        print(paint(f"{len(story.failed)} step(s) not observed: {story.failed}", "1;31"))
        return 1
    print(
        paint(f"all {story.n} steps observed.", "1;32")
        + f" The control plane is still up: KUBECONFIG={admin}; stop it with "
        "`make cluster-down`."
    )
    return 0


def run_story(
    story: Story,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    api: client.ApiClient,
    ctl: ControllerProcess,
) -> str:
    """The control-plane steps; the token the copy holds at the end."""
    story.step(
        "projector runs as its ServiceAccount (deploy/rbac) and its caches sync",
        ctl.ready,
    )
    story.say(
        "producers opt in: label projector.nebari.dev/export=true, "
        "annotation projector.nebari.dev/export-to"
    )
    apply(api, REPO / "grants" / "examples" / "namespaces.yaml")
    apply(api, REPO / "grants" / "examples" / "producers.yaml")
    story.say("the admin applies grants/ (GitOps): two ProjectionGrants")
    apply(api, REPO / "grants" / "jupyterhub-token-to-dask-gateway.yaml")
    apply(api, REPO / "grants" / "oidc-client-to-packs.yaml")

    want = {"api-token": "demo-token-v1"}
    story.step(
        "dask-gateway/jupyterhub-contract holds JupyterHub's token as `api-token`",
        lambda: secret_data(core, "dask-gateway", "jupyterhub-contract") == want,
    )
    story.step(
        "the hub's cookie secret never left jupyterhub (only granted keys travel)",
        lambda: (
            "hub.config.JupyterHub.cookie_secret"
            not in (secret_data(core, "dask-gateway", "jupyterhub-contract") or {"x": ""})
        ),
    )
    story.step(
        "grafana/oidc-client holds the OIDC client nebari-operator wrote",
        lambda: (secret_data(core, "grafana", "oidc-client") or {}).get("client-id") == "grafana",
    )

    def ready(name: str) -> Any:
        g: dict[str, Any] = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)  # type: ignore[assignment]
        st = g.get("status") or {}
        conds = {c["type"]: c for c in st.get("conditions") or ()}
        ok = conds.get("Ready", {}).get("status") == "True"
        return ok and f"Ready, {st['targets']['projected']} projected"

    for name in ("jupyterhub-token-to-dask-gateway", "grafana-oidc-client-to-packs"):
        r = story.step(f"grant {name} reports Ready in its status", lambda n=name: ready(n))  # type: ignore[misc]
        if r:
            story.say(str(r))

    story.say("JupyterHub rotates the token ...")
    token = f"demo-token-{int(time.time())}"
    _rotate(core, token)
    story.step(
        "the rotated token lands in dask-gateway's copy",
        lambda: secret_data(core, "dask-gateway", "jupyterhub-contract") == {"api-token": token},
    )

    pack = f"grafana-{int(time.time()) % 100000}"
    story.say(f"a new pack namespace {pack} is created with label nebari.dev/pack=grafana ...")
    core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=pack, labels={"nebari.dev/pack": "grafana"})
        )
    )
    story.step(
        f"{pack}/oidc-client appears without anyone touching the grant",
        lambda: secret_data(core, pack, "oidc-client") is not None,
    )
    core.delete_namespace(pack)

    story.say("someone edits the copy by hand ...")
    core.patch_namespaced_secret(
        "jupyterhub-contract", "dask-gateway", {"stringData": {"api-token": "tampered"}}
    )
    story.step(
        "projector restores it (drift correction)",
        lambda: secret_data(core, "dask-gateway", "jupyterhub-contract") == {"api-token": token},
    )
    return token


NODE_STEPS = 3
# The pod prints digests, never the token: a pod log is no place for a Secret's value.
READER = (
    'echo env=$(printf %s "$API_TOKEN" | busybox sha256sum | busybox cut -c1-64); '
    "while true; do echo file=$(busybox sha256sum /etc/contract/api-token | busybox cut -c1-64); "
    "sleep 0.2; done"
)


def _rotate(core: client.CoreV1Api, token: str) -> None:
    """JupyterHub rotates the token it gives dask-gateway (in its source, hub/jupyterhub)."""
    core.patch_namespaced_secret(
        "hub", "jupyterhub", {"stringData": {"hub.services.dask-gateway.apiToken": token}}
    )


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _last(log: str, key: str) -> str | None:
    found = re.findall(rf"^{key}=([0-9a-f]{{64}})$", log, re.M)
    return found[-1] if found else None


def pod_story(
    story: Story, core: client.CoreV1Api, plane: ControlPlane, tmp: Path, token: str
) -> None:
    """A node, and a dask-gateway pod reading its copy; or, where no node can start, why."""
    reason = missing_prerequisites()
    node = None
    if reason is None:
        try:
            node = Node(tmp / "node", plane, ensure_binaries(), ensure_node_binaries())
            node.start()
            image = import_busybox_image(node)
        except (NodeError, ControlPlaneError, ImageError) as exc:
            reason, node = str(exc).splitlines()[0], None
    if node is None:
        story.say(f"no node can start here, so no pod reads the copy: {reason}")
        return
    try:
        story.step(f"a node ({node.name}) joins with its own identity and is Ready", node.ready)
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="gateway-reader"),
            spec=consumer_spec(
                image,
                ["sh", "-c", READER],
                "jupyterhub-contract",
                "/etc/contract",
                env=("API_TOKEN", "api-token"),
            ),
        )
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod("gateway-reader", "dask-gateway", grace_period_seconds=0)
        eventually(lambda: _absent(core), 60)
        # A pod needs its namespace's default ServiceAccount, which kube-controller-manager makes
        # after the namespace, at its 20 writes a second: behind a backlog (a plane that the
        # benchmarks' smoke run has just filled with 2,000 namespaces), minutes after it.
        eventually(
            lambda: core.read_namespaced_service_account("default", "dask-gateway"),
            180,
            message="dask-gateway's default ServiceAccount never appeared",
        )
        core.create_namespaced_pod("dask-gateway", pod)

        def log() -> str:
            return str(core.read_namespaced_pod_log("gateway-reader", "dask-gateway"))

        story.step(
            "a dask-gateway pod reads the copy as a file and as an env var (its log, via the API)",
            lambda: _last(log(), "env") == _digest(token) == _last(log(), "file"),
            timeout=90,
        )
        story.say("JupyterHub rotates the token again ...")
        rotated = f"{token}-r"
        _rotate(core, rotated)
        story.step(
            "the file in the running pod follows; the env var keeps its start value",
            lambda: (
                _last(log(), "file") == _digest(rotated) and _last(log(), "env") == _digest(token)
            ),
        )
        core.delete_namespaced_pod("gateway-reader", "dask-gateway", grace_period_seconds=0)
    finally:
        node.stop()
        story.say("the node stopped; the host is as it was before it started")


def _absent(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespaced_pod("gateway-reader", "dask-gateway")
    except client.ApiException as exc:
        return exc.status == 404
    return False


if __name__ == "__main__":
    sys.exit(main())
