"""Opt-in rollouts on the real node: env-var consumers get the new value, and nothing else rolls.

The chart's release runs here with `rollouts.enabled=true` (and debug logs, where each
decision about a workload is a line). A consumer Deployment reads the copy's key through a
`secretKeyRef` env var and prints its digest once at start (a pod log is no place for the
value); it names the copy in `projector.nebari.dev/rollout-on`. A rotation must reach it as a
new pod printing the new digest, by one rollout (the Deployment's revision counts them);
restarting projector twice and failing over to the standby must roll nothing; a burst of 100
source updates in 10 s must roll a few times at most. The counts are printed for the issue.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.bed.kube import eventually
from tests.node.consumers import Consumers
from tests.node.release import NAMESPACE, RELEASE, Release
from tests.workloads import consumer, revision

ROTATIONS = 5
PRINT_ENV = 'echo env=$(printf %s "$PASSWORD" | busybox sha256sum | busybox cut -c1-64); sleep 3600'


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture(scope="module")
def rollout_release(release: Release) -> Iterator[Release]:
    """The release upgraded with rollouts on; put back as the other node tests expect it."""
    release.install("--set=rollouts.enabled=true", "--set=controller.logLevel=debug")
    try:
        yield release
    finally:
        release.install()


class Reader:
    """The consumer Deployment `reader` in `namespace`, as the test sees it through the API."""

    def __init__(self, core: client.CoreV1Api, apps: client.AppsV1Api, namespace: str) -> None:
        self.core, self.apps, self.namespace = core, apps, namespace

    def pods(self) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector="app=reader").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def env(self) -> tuple[str, str] | None:
        """(pod, digest it printed) of the one Running pod, once it is the only pod."""
        pods = self.pods()
        if len(pods) != 1 or pods[0].status.phase != "Running":
            return None
        name = str(pods[0].metadata.name)
        log = str(self.core.read_namespaced_pod_log(name, self.namespace))
        found = re.findall(r"^env=([0-9a-f]{64})$", log, re.M)
        return (name, found[-1]) if found else None

    def showing(self, value: str) -> tuple[str, str] | None:
        """(pod, digest) once the one Running pod printed `value`'s digest."""
        e = self.env()
        return e if e is not None and e[1] == digest(value) else None

    def rolled_out(self) -> bool:
        d = self.apps.read_namespaced_deployment("reader", self.namespace)
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and s.updated_replicas == 1
            and s.available_replicas == 1
            and (s.replicas or 0) == 1
        )

    def revision(self) -> int:
        return revision(self.apps, self.namespace, "reader")


def decided(release: Release, namespace: str, not_by: str | None = None) -> str | None:
    """The Lease holder, if it is not `not_by` and has logged a decision about the reader.

    A replica decides only while it leads, and a pod's log starts with the pod: a new leader
    that logged one decided after it took over.
    """
    leader = release.leader()
    if leader is None or leader == not_by:
        return None
    log = str(release.core.read_namespaced_pod_log(leader, NAMESPACE))
    for line in log.splitlines():
        workload = json.loads(line).get("workload") if '"rollout checked"' in line else None
        if workload == f"deployments/{namespace}/reader":
            return leader
    return None


def opted_in_reader(c: Consumers, value: str) -> tuple[str, str, Reader, tuple[str, str] | None]:
    """A copy `db` holding `value` and a Deployment `reader` that opted in and prints it from
    an env var, Running: (producer, namespace, reader, what its first pod shows)."""
    producer, ns = c.make_namespace(), c.make_namespace()
    c.k8s.source(producer, "db", {"password": value}, export_to=ns)
    c.k8s.grant((producer, "db"), namespaces=[ns])
    eventually(lambda: c.k8s.copy_data(ns, "db") == {"password": value})
    deployment = consumer(
        "reader", c.busybox, replicas=1, rollout_on="db", command=["sh", "-c", PRINT_ENV]
    )
    c.apps.create_namespaced_deployment(ns, deployment)
    reader = Reader(c.core, c.apps, ns)
    shown = eventually(reader.env, 90, message="the reader Running with its env var")
    return producer, ns, reader, shown


def restart_projector(release: Release) -> None:
    """`kubectl rollout restart` of the chart's Deployment, then wait for its new replicas."""
    stamp = {"kubectl.kubernetes.io/restartedAt": f"{time.time():.0f}"}
    patch = {"spec": {"template": {"metadata": {"annotations": stamp}}}}
    release.apps.patch_namespaced_deployment(RELEASE, NAMESPACE, patch)
    release.wait_rolled_out()


def test_an_env_var_consumer_is_rolled_once_per_rotation_and_never_by_restarts_or_failover(
    consumers: Consumers, rollout_release: Release
) -> None:
    release, k8s = rollout_release, consumers.k8s
    producer, ns, reader, first = opted_in_reader(consumers, "CANARY-roll-1")
    assert first[1] == digest("CANARY-roll-1")
    leader = str(eventually(lambda: decided(release, ns), 30, message="projector saw the reader"))
    assert reader.revision() == 1  # opting in rolls nothing

    latencies = []
    second = first
    for n in range(2, 2 + ROTATIONS):  # each rotation: one rollout, a new pod, the new value
        value, before = f"CANARY-roll-{n}", second
        t0 = time.monotonic()
        k8s.patch_secret(producer, "db", {"data": {"password": value}})
        second = eventually(
            lambda: reader.showing(value),  # noqa: B023 (called before the loop goes on)
            90,
            message="a new pod with the new env var",
        )
        latencies.append(time.monotonic() - t0)
        assert second[0] != before[0] and reader.revision() == n  # one rollout
        eventually(reader.rolled_out, 60)
    print(
        f"\nrotation -> new env var in a new pod ({ROTATIONS} rotations, one rollout each): "
        f"median {statistics.median(latencies):.2f}s, max {max(latencies):.2f}s"
    )
    rolled = reader.revision()

    counts = {}
    for step in ("restart 1", "restart 2", "failover"):
        if step == "failover":  # SIGTERM: the leader releases the Lease, the standby takes it
            release.core.delete_namespaced_pod(leader, NAMESPACE)
        else:
            restart_projector(release)
        old = leader
        leader = str(eventually(lambda: decided(release, ns, not_by=old), 60, message=step))  # noqa: B023
        counts[step] = reader.revision() - rolled
        assert reader.env() == second  # the same pod, never restarted
    print(f"rollouts caused: {counts}")
    assert counts == {"restart 1": 0, "restart 2": 0, "failover": 0}
    release.wait_rolled_out()
    k8s.canaries.assert_absent("the chart's pod logs", release.logs())


def test_a_burst_of_100_updates_in_10_s_rolls_an_env_var_consumer_a_few_times(
    consumers: Consumers, rollout_release: Release
) -> None:
    k8s = consumers.k8s
    producer, ns, reader, _ = opted_in_reader(consumers, "CANARY-burst-start")
    eventually(lambda: decided(rollout_release, ns), 30, message="projector saw it")

    k8s.burst(producer, "db", "password", "CANARY-burst-")
    eventually(lambda: reader.showing("CANARY-burst-99"), 120, message="the last value")
    eventually(reader.rolled_out, 60)
    rollouts = reader.revision() - 1
    print(f"\nburst: 100 updates in 10 s -> {rollouts} rollouts of the env-var consumer")
    assert 1 <= rollouts <= 4  # measured 2, 3, 1
    k8s.canaries.assert_absent("the chart's pod logs", rollout_release.logs())
