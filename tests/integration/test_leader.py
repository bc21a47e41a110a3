"""High availability with real `projector run` replicas on the real API server.

Leases are short here (3 s, renew deadline 2 s, retry 0.5 s) so that takeovers fit in a test.
These tests assert behaviour (who takes over, how, who wrote what); how fast a takeover is, is
measured by `make bench` (benchmarks/failover.py, with these timings as its "3 s lease" and its
targets). Who wrote what is read from the API server's audit log (tests/conftest.py enables it
for writes): each replica names itself in its User-Agent, `projector/<version> (<id>)`, so "the
old leader wrote nothing after it lost the lease" is proven from the API side, not from the
replica's own word; that it wanted to, and its fence refused, from its own log.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubernetes import client, utils

from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import REPO, ControllerProcess
from tests.support import Cluster, NamespaceFactory, audit_writes

NS, LEASE = "projector-system", "projector-leader"
LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5
HA = (
    f"--lease-duration={LEASE_S:g}s",
    f"--renew-deadline={RENEW_S:g}s",
    f"--retry-period={RETRY_S:g}s",
)
Start = Callable[..., ControllerProcess]


@pytest.fixture
def coordination(admin_client: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(admin_client)


@pytest.fixture
def holder(coordination: client.CoordinationV1Api) -> Callable[[], str]:
    def read() -> str:
        try:
            lease = coordination.read_namespaced_lease(LEASE, NS)
        except client.ApiException as e:
            if e.status == 404:
                return ""
            raise
        return str(lease.spec.holder_identity or "")

    return read


@dataclass
class Replicas:
    """Replicas of one test, by identity."""

    start_controller: Start
    prefix: str
    by_id: dict[str, ControllerProcess] = field(default_factory=dict)

    def start(self, *extra: str, wait_ready: bool = True) -> str:
        rid = unique_name(self.prefix, max_len=30)
        self.by_id[rid] = self.start_controller(
            *HA, f"--id={rid}", *extra, leader_elect=True, wait_ready=wait_ready
        )
        return rid


@pytest.fixture
def replicas(start_controller: Start) -> Replicas:
    return Replicas(start_controller, "r")


def projection(k8s: Cluster, make_namespace: NamespaceFactory) -> tuple[str, str]:
    """A source exported to a consumer namespace by a grant: (source namespace, consumer)."""
    src, consumer = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": f"ha-canary-{src}-0"}, export_to="*")
    k8s.grant((src, "hub"), namespaces=[consumer])
    return src, consumer


def update(k8s: Cluster, src: str, version: int) -> str:
    value = f"ha-canary-{src}-{version}"
    k8s.patch_secret(src, "hub", {"data": {"token": value}})
    return value


def held_by(holder: Callable[[], str], ids: Iterable[str]) -> str:
    """The holder, once it is one of `ids` ('' until then)."""
    now = holder()
    return now if now in ids else ""


def successor(holder: Callable[[], str], gone: str) -> str:
    """The holder, once it is someone other than `gone` ('' until then)."""
    now = holder()
    return now if now not in ("", gone) else ""


def copy_is(k8s: Cluster, consumer: str, value: str) -> Callable[[], bool]:
    return lambda: k8s.copy_data(consumer, "hub") == {"token": value}


def log_events(cp: ControllerProcess, event: str) -> list[dict[str, object]]:
    """The JSON log lines of one replica with this `event`."""
    out = []
    for line in cp.logs().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == event:
                out.append(entry)
    return out


REFUSED = "write refused: this replica no longer holds the lease"
"""The controller's log line for a reconcile whose write its fence refused."""


def freeze_while_debouncing(cp: ControllerProcess) -> None:
    """SIGSTOP a replica once it has seen a change and not yet acted on it, so that it wakes
    wanting to write."""
    eventually(
        lambda: cp.metric("projector_queue_debouncing") >= 1,
        timeout=10,
        message="the leader never saw the change",
    )
    os.kill(cp.proc.pid, signal.SIGSTOP)


def leader_and_standby(
    replicas: Replicas,
    holder: Callable[[], str],
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    *extra: str,
) -> tuple[str, str, str, str]:
    """A leader that has projected, and a ready standby: (leader, standby, source ns, consumer)."""
    first = replicas.start(*extra)
    eventually(lambda: holder() == first, timeout=LEASE_S + 10)
    second = replicas.start(*extra)
    src, consumer = projection(k8s, make_namespace)
    eventually(copy_is(k8s, consumer, f"ha-canary-{src}-0"))
    return first, second, src, consumer


def test_three_replicas_have_exactly_one_leader_and_all_are_ready(
    replicas: Replicas, holder: Callable[[], str], k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    ids = [replicas.start() for _ in range(3)]
    leader = eventually(functools.partial(held_by, holder, ids), timeout=LEASE_S + 10)
    for rid, cp in replicas.by_id.items():
        assert cp.ready(), f"{rid} is not ready"  # standbys are ready too: their caches are warm
        want = 1.0 if rid == leader else 0.0
        eventually(lambda cp=cp, want=want: cp.metric("projector_leader") == want)  # type: ignore[misc]
    src, consumer = projection(k8s, make_namespace)
    eventually(copy_is(k8s, consumer, f"ha-canary-{src}-0"))
    standbys = [cp for rid, cp in replicas.by_id.items() if rid != leader]
    assert all(cp.metric("projector_writes_total") == 0 for cp in standbys)
    assert holder() == leader


def test_kill_9_of_the_leader_hands_over_once_its_lease_expires(
    replicas: Replicas, holder: Callable[[], str], k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    first, second, src, consumer = leader_and_standby(replicas, holder, k8s, make_namespace)
    assert replicas.by_id[first].stop(signal.SIGKILL) == -signal.SIGKILL
    value = update(k8s, src, 1)
    eventually(copy_is(k8s, consumer, value), timeout=LEASE_S + 30)
    assert holder() == second
    taken = log_events(replicas.by_id[second], "lease taken")
    assert [t["previous"] for t in taken] == [first]  # it waited for first's lease to expire


def test_sigterm_releases_the_lease_and_the_standby_takes_it_released(
    replicas: Replicas, holder: Callable[[], str], k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    first, second, src, consumer = leader_and_standby(replicas, holder, k8s, make_namespace)
    assert replicas.by_id[first].stop() == 0
    assert "lease released" in replicas.by_id[first].logs()
    assert holder() in ("", second)  # released before the process exited
    value = update(k8s, src, 1)
    eventually(copy_is(k8s, consumer, value), timeout=LEASE_S + 30)
    assert holder() == second
    taken = log_events(replicas.by_id[second], "lease taken")
    assert [t["previous"] for t in taken] == [None]  # taken released, not expired


def test_a_frozen_leader_that_lost_its_lease_writes_nothing_when_it_wakes_and_follows(
    replicas: Replicas,
    holder: Callable[[], str],
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    audit_log: Path,
) -> None:
    # A long debounce keeps a change queued in the old leader while it is frozen, so that it
    # has a write to want when it wakes.
    slow = ("--debounce=2", "--debounce-max=2", "--debounce-hot-max=2")
    old, new, src, consumer = leader_and_standby(replicas, holder, k8s, make_namespace, *slow)
    value = update(k8s, src, 1)
    frozen = replicas.by_id[old]
    freeze_while_debouncing(frozen)
    try:
        eventually(lambda: holder() == new, timeout=LEASE_S + 10)
        eventually(copy_is(k8s, consumer, value), timeout=10)
        woke = datetime.now(UTC)
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    # Awake, it finds its term over: it stops its workers and follows, without exiting.
    eventually(lambda: "lost the lease" in frozen.logs(), timeout=RENEW_S + 10)
    eventually(lambda: frozen.metric("projector_leader") == 0)
    assert frozen.proc.poll() is None and frozen.get("/healthz")[0] == 200
    assert holder() == new
    writes = audit_writes(audit_log)
    before = [w for w in writes if w.replica == old and w.at < woke]
    after = [w for w in writes if w.replica == old and w.at >= woke]
    assert any(w.resource == "secrets" for w in before)  # the filter does see its writes
    assert after == [], f"the old leader wrote after it lost the lease: {after}"
    assert any(w.replica == new and w.resource == "secrets" for w in writes)
    # It woke wanting to write the change it had queued, and its fence refused that write.
    assert [r["grant"] for r in log_events(frozen, REFUSED)] == k8s.grants


TAKEOVERS = 6


def test_leaders_frozen_mid_change_never_overlap_with_their_successors_nor_flap_a_copy(
    replicas: Replicas,
    holder: Callable[[], str],
    coordination: client.CoordinationV1Api,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    audit_log: Path,
) -> None:
    """Real contention: each leader is frozen (SIGSTOP) with a change queued, a standby takes
    over and writes it, then the old leader wakes (SIGCONT) still wanting to write: its fence
    refuses (or its workers stopped first), it follows, and the API server saw no write of it
    after its successor's."""
    slow = ("--debounce=2", "--debounce-max=2", "--debounce-hot-max=2")
    for _ in range(3):
        replicas.start(*slow)
    leader = eventually(functools.partial(held_by, holder, replicas.by_id), timeout=LEASE_S + 10)
    src, consumer = projection(k8s, make_namespace)
    eventually(copy_is(k8s, consumer, f"ha-canary-{src}-0"), timeout=30)
    transitions = coordination.read_namespaced_lease(LEASE, NS).spec.lease_transitions or 0
    for version in range(1, TAKEOVERS + 1):
        frozen = replicas.by_id[leader]
        value = update(k8s, src, version)
        freeze_while_debouncing(frozen)
        try:
            nxt = eventually(functools.partial(successor, holder, leader), timeout=LEASE_S + 30)
            eventually(copy_is(k8s, consumer, value), timeout=30)  # the successor wrote it
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        # Awake, it finds its term over and follows; then it is stopped, as a rollout would,
        # so that each replica leads at most once and its writes form one run.
        eventually(lambda f=frozen: "lost the lease" in f.logs(), timeout=RENEW_S + 30)  # type: ignore[misc]
        assert frozen.proc.poll() is None, "losing the lease ended the process"
        # Its queued write was refused by its fence, or its term's workers stopped before
        # sending it (a lost term cancels them at once): either way it wrote nothing after.
        eventually(
            lambda f=frozen: bool(log_events(f, REFUSED)) or "workers stopped" in f.logs(),  # type: ignore[misc]
            timeout=RENEW_S + 30,
        )
        assert frozen.stop() == 0
        assert nxt in replicas.by_id, f"an unknown holder {nxt}"
        leader = nxt
        replicas.start(*slow)  # the replaced replica comes back, as its pod would
    lease = coordination.read_namespaced_lease(LEASE, NS).spec
    assert (lease.lease_transitions or 0) >= transitions + TAKEOVERS
    ours = set(replicas.by_id)
    writes = [w for w in audit_writes(audit_log) if w.replica in ours]
    # One leader at a time: each replica's Secret writes, refused ones too (a request sent is
    # a request sent), and every write the server accepted form one run, never interleaved
    # with another's. A woken follower's Lease update that the server refused (409: the
    # successor holds it) is how optimistic concurrency keeps it out, not an overlap.
    runs: list[str] = []
    for w in writes:
        if w.resource == "leases" and w.code >= 400:
            continue
        if not runs or runs[-1] != w.replica:
            runs.append(w.replica)
    assert len(runs) == len(set(runs)), f"leaders interleaved: {runs}"
    # No flapping: the copy was created once and updated exactly once per source change.
    copy_writes = [
        w for w in writes if w.resource == "secrets" and (w.namespace, w.name) == (consumer, "hub")
    ]
    assert sorted(w.verb for w in copy_writes if w.code < 400) == ["create"] + ["update"] * (
        TAKEOVERS
    )


def test_the_shipped_deployment_and_budget_are_accepted_by_the_api_server(
    admin_client: client.ApiClient,
) -> None:
    """Two replicas with leader election, a PodDisruptionBudget: valid objects (dry run).

    deploy/install.yaml is the chart rendered with its defaults (tests/integration/test_helm.py
    proves the chart itself on a fresh API server).
    """
    rendered = yaml.safe_load_all((REPO / "deploy" / "install.yaml").read_text())
    docs = [d for d in rendered if d and d["kind"] in ("Deployment", "PodDisruptionBudget")]
    kinds = {d["kind"]: d for d in docs}
    deployment = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--no-leader-elect" not in args
    assert kinds["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    core = client.CoreV1Api(admin_client)
    ns = deployment["metadata"]["namespace"]
    with contextlib.suppress(client.ApiException):  # shared with the tests' RBAC fixture
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    for doc in docs:
        utils.create_from_dict(admin_client, doc, dry_run="All")
