"""The latency users feel: source Secret written -> new value read inside a running pod.

On a real node (tests/bed/node: kubelet + containerd + runc) joined to a fresh local control plane,
a consumer pod mounts the copy as a volume. For each rotation (at a random moment, see
``rotations``), t0 is just before the write of the source; t1 is when the new value is read
from the file *inside the running container* (through ``/proc/<container pid>/root``: the
container's own mount namespace, the file the process in it reads). The floor (a pod mounting
the very Secret that is written: no controller between), projector and projection run on the
same node, one after the other, against the same control plane, with the same admin identity.

The kubelet's ``syncFrequency`` bounds how soon it rewrites a Secret volume after the copy
changed: the test node uses 100ms (``tests.bed.node.node.SYNC_FREQUENCY``); Kubernetes' default 1m
gives the documented 60-90 s, and that is then most of what users wait for, whatever the
controller.

``python -m benchmarks.pod_latency [--rotations 25] [--out benchmarks/results/pod-latency.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import summary, write_result
from benchmarks.harness import controller_python, own_namespace
from benchmarks.peers import PeerError, PeerUnavailable, Projection
from tests.bed.controlplane.plane import ControlPlane, ensure_binaries
from tests.bed.kube import api_client, b64, eventually
from tests.bed.launcher import launch
from tests.bed.node.images import import_busybox_image
from tests.bed.node.node import SYNC_FREQUENCY, Node, ensure_node_binaries, missing_prerequisites
from tests.bed.node.pods import consumer_spec

KEY = "password"
POLL = 0.002
METRIC = "source_write_to_file_in_pod"
JITTER = 1.5  # seconds: longer than the kubelet's pod-sync period (1 s)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def container_pid(node: Node, container_id: str) -> int:
    """The host pid of a running container's first process (``ctr tasks ls``)."""
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise RuntimeError(f"no task for container {container_id}")


def consumer_pod(
    core: client.CoreV1Api, node: Node, namespace: str, secret: str, image: str
) -> Path:
    """A pod mounting ``secret`` at /etc/db; the path of its key as the container sees it."""
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name="consumer"),
        spec=consumer_spec(image, ["sleep", "100000"], secret, "/etc/db", container="app"),
    )
    core.create_namespaced_pod(namespace, body)

    def running() -> str:
        pod = core.read_namespaced_pod("consumer", namespace)
        statuses = pod.status.container_statuses or []
        assert statuses and statuses[0].state.running is not None
        return str(statuses[0].container_id).removeprefix("containerd://")

    cid = eventually(running, 120, message="the consumer pod running")
    return Path(f"/proc/{container_pid(node, cid)}/root/etc/db/{KEY}")


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def rotations(
    core: client.CoreV1Api, namespace: str, name: str, path: Path, count: int
) -> list[float]:
    """Write ``count`` new values; for each, seconds until the container's file has it."""
    samples = []
    rng = random.Random(20261201)
    for _ in range(count):
        # A random pause before each write (not timed): writing right after the last value
        # appeared would phase-lock the samples to the kubelet's once-a-second pod sync and
        # measure that second every time, not what a rotation at an arbitrary moment waits.
        time.sleep(rng.uniform(0, JITTER))
        value = secrets.token_hex(8)
        t0 = time.monotonic()
        core.patch_namespaced_secret(name, namespace, {"data": {KEY: b64(value)}})
        deadline = t0 + 120
        while read(path) != value:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pod's file did not change within 120 s ({path})")
            time.sleep(POLL)
        samples.append(time.monotonic() - t0)
    return samples


def namespaces(core: client.CoreV1Api, *names: str) -> None:
    for n in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=n)))


def source(core: client.CoreV1Api, namespace: str, name: str, export_to: str) -> None:
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={"projector.nebari.dev/export": "true"},
                annotations={"projector.nebari.dev/export-to": export_to},
            ),
            data={KEY: b64("initial")},
        ),
    )


def copied(core: client.CoreV1Api, namespace: str, name: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return bool(core.read_namespaced_secret(name, namespace).data)
        except client.ApiException:
            return False

    return check


@contextlib.contextmanager
def cluster(root: Path) -> Iterator[tuple[ControlPlane, Node]]:
    plane = ControlPlane(root / "plane", ensure_binaries())
    plane.start()
    try:
        node = Node(root / "node", plane, ensure_binaries(), ensure_node_binaries())
        node.start()
        try:
            yield plane, node
        finally:
            node.stop()
    finally:
        plane.stop()


def run(count: int, out: Path) -> dict[str, Any]:
    """Both systems on one node; the result document (also written to ``out``)."""
    reason = missing_prerequisites()
    if reason is not None:
        raise SystemExit(f"no node can run here: {reason}")
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="pod-latency-") as tmp,
        cluster(Path(tmp)) as (
            plane,
            node,
        ),
    ):
        image = import_busybox_image(node)
        api = api_client(plane.kubeconfig)
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)

        # the floor: the mounted Secret itself written, no controller between
        namespaces(core, "pb-app")
        source(core, "pb-app", "db", "pb-app")
        path = consumer_pod(core, node, "pb-app", "db", image)
        results["bare write"] = {METRIC: summary(rotations(core, "pb-app", "db", path, count), "s")}

        # projector
        namespaces(core, "pl-src", "pl-app")
        source(core, "pl-src", "db", "pl-app")
        own_namespace(plane.kubeconfig)
        proc = launch(plane.kubeconfig, Path(tmp) / "projector.log", python=controller_python())
        try:
            eventually(proc.ready, 60, message="projector /readyz")
            custom.create_cluster_custom_object(
                "projector.nebari.dev",
                "v1alpha1",
                "projectiongrants",
                {
                    "apiVersion": "projector.nebari.dev/v1alpha1",
                    "kind": "ProjectionGrant",
                    "metadata": {"name": "pod-latency"},
                    "spec": {
                        "source": {"namespace": "pl-src", "name": "db"},
                        "target": {"namespaces": ["pl-app"]},
                    },
                },
            )
            eventually(copied(core, "pl-app", "db"), 60, message="projector's copy")
            path = consumer_pod(core, node, "pl-app", "db", image)
            samples = rotations(core, "pl-src", "db", path, count)
            results["projector"] = {METRIC: summary(samples, "s")}
        finally:
            proc.stop(timeout=30)

        # projection
        peer = Projection()
        try:
            peer.ensure_built()
        except PeerUnavailable as exc:
            reason = str(exc).splitlines()[-1]
            results["projection"] = {"unavailable": {"value": reason, "unit": ""}}
        else:
            namespaces(core, "pp-src", "pp-app")
            source(core, "pp-src", "db", "pp-app")
            peer_proc = peer.start(plane.kubeconfig, Path(tmp) / "projection.log")
            try:
                peer.wait_ready(peer_proc)
                peer.setup_fanout(core, custom, "pp-src", "db", ["pp-app"], timeout=60)
                path = consumer_pod(core, node, "pp-app", peer.copy_name("db"), image)
                samples = rotations(core, "pp-src", "db", path, count)
                results["projection"] = {METRIC: summary(samples, "s")}
            except PeerError as exc:
                failed = str(exc).splitlines()[0]
                results["projection"] = {"failed": {"value": failed, "unit": ""}}
            finally:
                peer_proc.terminate()
                peer_proc.wait(30)
        api.close()
    parameters = {
        "what": "source Secret written -> new value read inside a running pod (volume)",
        "rotations": count,
        "kubelet_sync_frequency": SYNC_FREQUENCY,
        "kubelet_secret_change_detection": "Watch",
    }
    bare = results["bare write"][METRIC]["median"]
    ratios = {
        f"{name} / bare write p50": m[METRIC]["median"] / bare
        for name, m in results.items()
        if name != "bare write" and METRIC in m
    }
    path = write_result("pod-latency", parameters, results, ratios, out=out)
    return {"path": str(path), "systems": results}


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print p50/p99 per system."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pod_latency", description=__doc__)
    parser.add_argument("--rotations", type=int, default=25)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    args = parser.parse_args(argv)
    document = run(int(args.rotations), Path(args.out))
    for name, metrics in document["systems"].items():
        for metric, m in metrics.items():
            print(
                f"{name} {metric}: p50 {m.get('median')} p99 {m.get('p99')} ({m.get('value', '')})"
            )
    print(f"written: {document['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
