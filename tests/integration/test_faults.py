"""Faults injected into real processes: the API server goes away in the middle of a fan-out, the
controller is killed in the middle of one, a watch expires for real (410 Gone after an etcd
compaction), a watch goes silent without closing.

What must hold is DESIGN §3's last row: no deletes on uncertainty, and convergence once the
fault ends. Deletes are read from the API server's audit log (every write it received)
and from the copies' uids (a copy deleted and re-created would have a new one). Each test
records what it injected and observed for docs/reliability.md (tests/reliability.py).
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests import reliability, support
from tests.bed import kube
from tests.bed.controlplane.plane import APISERVER, ControlPlane
from tests.bed.kube import api_client, b64, eventually, unique_name
from tests.bed.launcher import ControllerProcess
from tests.bed.proxy import Relay, relay_to
from tests.conftest import AUDIT_POLICY
from tests.support import (
    AuditWrite,
    Canaries,
    Cluster,
    NamespaceFactory,
    audit_writes,
    deletes_since,
)

pytestmark = pytest.mark.fault

FANOUT = 200


def copies(core: client.CoreV1Api, grant: str) -> dict[str, tuple[str, str]]:
    """(uid, token) of every copy of `grant`, by namespace, from one list."""
    items = core.list_secret_for_all_namespaces(
        label_selector=f"projector.nebari.dev/grant={grant}"
    ).items
    return {
        str(s.metadata.namespace): (str(s.metadata.uid), str((s.data or {}).get("token", "")))
        for s in items
    }


def all_hold(core: client.CoreV1Api, grant: str, value: str, n: int = FANOUT) -> Callable[[], bool]:
    want = b64(value)

    def check() -> bool:
        c = copies(core, grant)
        return len(c) == n and all(token == want for _, token in c.values())

    return check


def missed(core: client.CoreV1Api, grant: str, targets: set[str], value: str) -> int:
    """Target namespaces whose copy does not hold `value` (or is missing)."""
    want, c = b64(value), copies(core, grant)
    return sum(1 for ns in targets if ns not in c or c[ns][1] != want)


def test_api_server_down_during_a_fan_out_deletes_nothing_and_converges(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    control_plane: ControlPlane,
    audit_log: Path,
) -> None:
    team = unique_name("outage")
    src = make_namespace()
    targets = {make_namespace(labels={"outage": team}) for _ in range(FANOUT)}
    k8s.source(src, "hub", {"token": "outage-canary-0"}, export_to="*")
    grant = k8s.grant((src, "hub"), selector={"matchLabels": {"outage": team}})
    eventually(all_hold(k8s.core, grant, "outage-canary-0"), timeout=180)
    before = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    relists = controller.metric("projector_informer_events_total", type="RELIST")
    started = datetime.now(UTC)
    k8s.patch_secret(src, "hub", {"data": {"token": "outage-canary-1"}})  # a fan-out begins
    with control_plane.apiserver_down():
        # Down until the controller has seen it: every cache behind, so it is not Ready.
        eventually(lambda: controller.get("/readyz")[0] == 503, timeout=60)
    back = time.monotonic()
    # Back: a change made while the informers are still reconnecting (relisting after 410).
    k8s.patch_secret(src, "hub", {"data": {"token": "outage-canary-2"}})
    eventually(all_hold(k8s.core, grant, "outage-canary-2"), timeout=180)
    converged = time.monotonic() - back
    deletes = deletes_since(audit_log, started)
    after = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    relisted = controller.metric("projector_informer_events_total", type="RELIST") - relists
    reliability.record(
        "API server stopped mid fan-out",
        injected=(
            f"kube-apiserver stopped (etcd kept running) right after a source change began a "
            f"fan-out to {FANOUT} namespaces; restarted once the controller reported itself not "
            "Ready; a second change made while its informers reconnected."
        ),
        observed={
            "deletes": len(deletes),
            "missed_updates": missed(k8s.core, grant, targets, "outage-canary-2"),
            "converge_seconds": converged,
            "copies_recreated": sum(1 for ns, uid in after.items() if before.get(ns) != uid),
            "relists": int(relisted),
        },
    )
    assert deletes == []
    assert after == before  # no copy was deleted and re-created either
    assert relisted > 0
    eventually(lambda: controller.get("/readyz")[0] == 200)


def test_controller_killed_mid_fan_out_converges_without_strays_or_duplicates(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    audit_log: Path,
) -> None:
    """kill -9 while the first copies are being created; a new process finishes the job: one
    copy per target, the right content, nothing elsewhere, nothing deleted or created twice."""
    team = unique_name("crash")
    src = make_namespace()
    targets = {make_namespace(labels={"crash": team}) for _ in range(FANOUT)}
    others = {make_namespace(labels={"crash": f"not-{team}"}) for _ in range(3)}
    k8s.source(src, "hub", {"token": "crash-canary-1"}, export_to="*")
    started = datetime.now(UTC)
    # A slow first process (40 requests/s) so that the kill lands mid fan-out.
    first = start_controller("--qps=40", "--burst=1")
    grant = k8s.grant((src, "hub"), selector={"matchLabels": {"crash": team}})
    eventually(lambda: len(copies(k8s.core, grant)) >= 30, timeout=60)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    killed = datetime.now(UTC)
    before = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    assert 0 < len(before) < FANOUT, "the kill did not land mid fan-out"
    restarted = time.monotonic()
    start_controller(wait_ready=False)
    eventually(all_hold(k8s.core, grant, "crash-canary-1"), timeout=180)
    converged = time.monotonic() - restarted
    after = copies(k8s.core, grant)
    everywhere = k8s.core.list_secret_for_all_namespaces(
        label_selector="projector.nebari.dev/managed-by=projector"
    ).items
    seen = (str(s.metadata.namespace) for s in everywhere)
    managed = Counter(ns for ns in seen if ns in targets | others | {src})
    # The API server logs a request after answering it: wait until a create is on record for
    # every target before counting them.
    creates = eventually(lambda: _creates_into(audit_log, started, targets), timeout=30)
    created = Counter(w.namespace for w in creates if w.code == 201)
    # A create the kill cut off may have landed without a 201 on record; the new process then
    # finds the copy and keeps it. Only such a create may stand in for a successful one.
    cut = {w.namespace for w in creates if w.code != 201 and w.at < killed} - set(created)
    deletes = deletes_since(audit_log, started)
    recreated = sorted(ns for ns, uid in before.items() if after[ns][0] != uid)
    reliability.record(
        "Controller killed (SIGKILL) mid fan-out",
        injected=(
            f"the controller process killed with SIGKILL while creating {FANOUT} copies "
            f"({len(before)} existed); a new process started at once."
        ),
        observed={
            "deletes": len(deletes),
            "missed_updates": missed(k8s.core, grant, targets, "crash-canary-1"),
            "converge_seconds": converged,
            "copies_before_kill": len(before),
            "copies_recreated": len(recreated),
            "namespaces_created_into_twice": sum(1 for n in created.values() if n > 1),
            "creates_cut_by_kill": len(cut),
            "copies_outside_targets": sum(n for ns, n in managed.items() if ns not in targets),
        },
    )
    assert set(after) == targets  # a copy in every target, and none anywhere else
    assert managed == Counter(dict.fromkeys(targets, 1))  # exactly one copy each
    assert deletes == []
    assert recreated == []  # the first process' copies were kept, not re-created
    assert set(created) <= targets and set(created.values()) == {1}  # once each, nowhere else
    unmade = targets - set(created) - cut
    # (a cut-off create's copy may even land after `before` was listed: the server finishes it)
    assert not unmade, [w for w in creates if w.namespace in unmade]  # each copy had its create


def _creates_into(audit_log: Path, since: datetime, targets: set[str]) -> list[AuditWrite]:
    """Every create of a Secret `hub` (the copies' name) since `since`, once a create into each
    target is on record; else []. Not the controller's hash key: the first controller on a new
    plane creates it (projector-system/projector-hash-key), which is not a copy."""
    writes = audit_writes(audit_log, since)
    creates = [
        w for w in writes if w.resource == "secrets" and w.verb == "create" and w.name == "hub"
    ]
    return creates if targets <= {w.namespace for w in creates} else []


def _change_in_a_black_hole(
    k8s: Cluster, relay: Relay, src: str, target: str, token: str, *, at_least: tuple[int, str]
) -> tuple[int, float]:
    """Silence every connection through the relay (at least this many, for this reason), change
    the source at once, and wait for the copy in `target`: (connections silenced, seconds from
    the silence to the change landing)."""
    silenced = relay.blackhole()
    assert silenced >= at_least[0], f"{silenced} connections silenced: {at_least[1]}"
    holed = time.monotonic()
    k8s.patch_secret(src, "hub", {"data": {"token": token}})
    eventually(lambda: k8s.copy_data(target, "hub") == {"token": token}, timeout=60)
    return silenced, time.monotonic() - holed


def test_silent_watch_through_a_black_hole_is_restarted_and_the_change_lands(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    audit_log: Path,
    relayed: tuple[Relay, Path],
) -> None:
    """Every established connection stops carrying bytes but stays open (no FIN, no RST): only
    the watches' read deadline (half of --informer-stall-after) can tell; they reconnect, resume
    and deliver the change made meanwhile."""
    relay, kubeconfig = relayed
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "stall-canary-1"}, export_to="*")
    ctl = start_controller(
        f"--kubeconfig={kubeconfig}", "--watch-timeout=2", "--informer-stall-after=10s"
    )
    k8s.grant((src, "hub"), namespaces=[a])
    eventually(lambda: k8s.copy_data(a, "hub") == {"token": "stall-canary-1"})
    uid = k8s.copy(a, "hub").metadata.uid
    started = datetime.now(UTC)
    errors = ctl.metric("projector_informer_events_total", kind="sources", type="ERROR")
    silenced, converged = _change_in_a_black_hole(
        k8s,
        relay,
        src,
        a,
        "stall-canary-2",
        at_least=(4, "every informer's watch runs over the relay"),
    )
    detected = ctl.metric("projector_informer_events_total", kind="sources", type="ERROR")
    deletes = deletes_since(audit_log, started)
    copy = k8s.copy(a, "hub")
    reliability.record(
        "Watch silently black-holed",
        injected=(
            f"every connection between the controller and the API server ({silenced}, its "
            "watches included) stopped carrying bytes without being closed, through a "
            "loopback TCP relay; a source change made at once. Controller flags: "
            "--watch-timeout=2 --informer-stall-after=10s (read deadline 5 s)."
        ),
        observed={
            "deletes": len(deletes),
            "missed_updates": 0 if k8s.copy_data(a, "hub") == {"token": "stall-canary-2"} else 1,
            "converge_seconds": converged,
            "stalls_detected_by_read_deadline": int(detected - errors),
            "copies_recreated": 0 if copy is not None and copy.metadata.uid == uid else 1,
        },
    )
    assert detected > errors  # the sources watch ended on its read deadline
    assert deletes == []
    assert copy is not None and copy.metadata.uid == uid


# --- 410 Gone, for real -------------------------------------------------------------------------


@pytest.fixture
def uncached_plane(binaries: Path, tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of its own whose API server has no watch cache: a watch is served by etcd
    itself, so a resourceVersion older than etcd's last compaction is answered 410 Gone (the
    session's plane serves any old resourceVersion of a young cluster from its cache)."""
    root = tmp_path / "uncached"
    root.mkdir()
    policy = root / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    plane = ControlPlane(
        root,
        binaries,
        die_with_parent=True,
        extra_args={
            APISERVER: [
                "--watch-cache=false",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={root / 'audit.log'}",
            ]
        },
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(root / "etcd-data", ignore_errors=True)  # keep logs, drop the WAL


def etcd_compact(etcd_url: str) -> int:
    """Compact etcd at its current revision (v3 JSON gateway, loopback); returns the revision."""

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{etcd_url}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    key = base64.b64encode(b"/registry").decode()
    revision = int(post("/v3/kv/range", {"key": key, "limit": 1})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def test_watch_expired_after_etcd_compaction_relists_and_deletes_nothing(
    uncached_plane: ControlPlane, start_controller: Any, canaries: Canaries, tmp_path: Path
) -> None:
    """The controller's connections are cut; meanwhile a source changes, a new target namespace
    appears, and etcd is compacted past every resourceVersion the informers hold. Back, their
    watches get 410 Gone: they relist, the changes land, nothing is deleted."""
    plane = uncached_plane
    api = api_client(plane.kubeconfig)
    try:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        k8s = Cluster(core, custom, canaries, "gone")
        kubeconfig = kube.projector_kubeconfig(api, tmp_path / "projector.kubeconfig")
        with relay_to(plane.server, kubeconfig, tmp_path / "relayed") as (relay, relayed):

            def namespace(**labels: str) -> str:
                name = unique_name("gone")
                core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
                )
                return name

            src, a, b = namespace(), namespace(pack="gone"), namespace(pack="gone")
            k8s.source(src, "hub", {"token": "gone-canary-1"}, export_to="*")
            grant = k8s.grant((src, "hub"), selector={"matchLabels": {"pack": "gone"}})
            ctl = start_controller(f"--kubeconfig={relayed}", scraper=support.scraper_token(api))
            eventually(all_hold(core, grant, "gone-canary-1", n=2), timeout=60)
            before = {ns: uid for ns, (uid, _) in copies(core, grant).items()}
            started = datetime.now(UTC)
            relists = ctl.metric("projector_informer_events_total", type="RELIST")
            try:
                relay.cut()
                eventually(
                    lambda: ctl.metric("projector_informer_events_total", type="ERROR") >= 4,
                    message="every informer noticed the cut",
                )
                k8s.patch_secret(src, "hub", {"data": {"token": "gone-canary-2"}})
                c = namespace(pack="gone")
                revision = etcd_compact(plane.etcd_url)
            finally:
                relay.restore()
            back = time.monotonic()
            eventually(all_hold(core, grant, "gone-canary-2", n=3), timeout=90)
            converged = time.monotonic() - back
            expired = ctl.logs().count("watch expired; relisting")
            relisted = ctl.metric("projector_informer_events_total", type="RELIST") - relists
            deletes = deletes_since(plane.root / "audit.log", started)
            after = copies(core, grant)
            reliability.record(
                "Watch expired (410 Gone) after etcd compaction",
                injected=(
                    "the controller's connections to an API server without a watch cache cut; "
                    "meanwhile a source change, a new target namespace, and an etcd compaction at "
                    f"revision {revision}, past every resourceVersion the informers held; then "
                    "connections allowed again."
                ),
                observed={
                    "deletes": len(deletes),
                    "missed_updates": missed(core, grant, {a, b, c}, "gone-canary-2"),
                    "converge_seconds": converged,
                    "watches_expired_410": expired,
                    "relists": int(relisted),
                    "copies_recreated": sum(1 for ns, uid in before.items() if after[ns][0] != uid),
                },
            )
            assert expired >= 1, "no watch was answered 410 Gone"
            assert relisted >= expired
            assert deletes == []
            assert {ns: after[ns][0] for ns in before} == before
            k8s.scan()
    finally:
        api.close()


# --- outages survived in place (leader election on, default timings) ----------------------------

LEASE_NS, LEASE = "projector-system", "projector-leader"


def _holder(admin: client.ApiClient) -> str:
    try:
        lease = client.CoordinationV1Api(admin).read_namespaced_lease(LEASE, LEASE_NS)
    except client.ApiException as e:
        if e.status == 404:
            return ""
        raise
    return str(lease.spec.holder_identity or "")


def _led_by(admin: client.ApiClient, ids: list[str]) -> str:
    """The Lease's holder once it is one of `ids`, else ''."""
    holder = _holder(admin)
    return holder if holder in ids else ""


@pytest.mark.parametrize(
    "replicas, outage",
    [
        pytest.param(1, "lease", id="one-replica-10s"),
        pytest.param(2, "lease", id="two-replicas-10s"),
        pytest.param(1, "3m", id="one-replica-3m", marks=pytest.mark.long),
        pytest.param(2, "3m", id="two-replicas-3m", marks=pytest.mark.long),
    ],
)
def test_api_server_outage_mid_fan_out_is_survived_in_place(
    replicas: int,
    outage: str,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    control_plane: ControlPlane,
    admin_client: client.ApiClient,
    audit_log: Path,
) -> None:
    """Replicas with leader election and its default timings (lease 15 s, renew deadline 10 s):
    the API server stopped mid fan-out until the leader's lease has run out (about 10 s), or
    for 3 minutes. Nobody exits or fails /healthz, nothing is deleted or re-created; back, a
    replica leads again from warm caches and the next change lands at once."""
    team = unique_name("survive")
    src = make_namespace()
    targets = {make_namespace(labels={"survive": team}) for _ in range(FANOUT)}
    k8s.source(src, "hub", {"token": "survive-canary-0"}, export_to="*")
    ids = [unique_name(f"survivor-{i}", max_len=30) for i in range(replicas)]
    procs = [start_controller(f"--id={rid}", leader_elect=True) for rid in ids]
    leader = eventually(lambda: _led_by(admin_client, ids), timeout=40)
    grant = k8s.grant((src, "hub"), selector={"matchLabels": {"survive": team}})
    eventually(all_hold(k8s.core, grant, "survive-canary-0"), timeout=180)
    before = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    terms = sum(cp.metric("projector_leader_transitions_total") for cp in procs)
    probes: list[int] = []

    def every_replica_alive() -> bool:
        codes = [cp.get("/healthz")[0] for cp in procs]
        probes.extend(codes)
        return all(cp.proc.poll() is None for cp in procs) and all(c == 200 for c in codes)

    def nobody_leads() -> bool:
        assert every_replica_alive(), "a replica exited or failed /healthz during the outage"
        return all(cp.metric("projector_leader") == 0 for cp in procs)

    started = datetime.now(UTC)
    k8s.patch_secret(src, "hub", {"data": {"token": "survive-canary-1"}})  # a fan-out begins
    down = time.monotonic()  # kube-apiserver refuses new connections from here on
    with control_plane.apiserver_down():
        # Down at least until the leader's renew deadline has passed: its term is over.
        eventually(nobody_leads, timeout=60, message="the leader's term ended")
        if outage == "3m":
            support.consistently(every_replica_alive, duration=180 - (time.monotonic() - down))
    back = time.monotonic()  # ready again (its /readyz answered)
    down_for = back - down
    k8s.patch_secret(src, "hub", {"data": {"token": "survive-canary-2"}})  # the next change
    sent = time.monotonic()
    first = eventually(
        lambda: (
            any(t == b64("survive-canary-2") for _, t in copies(k8s.core, grant).values())
            and time.monotonic()
        ),
        timeout=60,
    )
    eventually(all_hold(k8s.core, grant, "survive-canary-2"), timeout=120)
    landed_all = time.monotonic() - back
    new_leader = eventually(lambda: _led_by(admin_client, ids))
    after = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    deletes = deletes_since(audit_log, started)
    exits = [cp.proc.poll() for cp in procs if cp.proc.poll() is not None]
    unhealthy = sum(1 for c in probes if c != 200)
    tracebacks = sum(cp.logs().count("Traceback") for cp in procs)
    # Each term lost had its workers stopped then, not left running as the old term's zombies.
    terms_lost = [cp.logs().count('"lost the lease; campaigning again"') for cp in procs]
    workers_stopped = [cp.logs().count('"workers stopped; caches kept warm"') for cp in procs]
    won = sum(cp.metric("projector_leader_transitions_total") for cp in procs) - terms
    reliability.record(
        f"API server down {'3 min' if outage == '3m' else '~10 s'} mid fan-out, "
        f"{replicas} replica{'s' if replicas > 1 else ''} with leader election",
        injected=(
            f"kube-apiserver stopped (etcd kept running) right after a source change began a "
            f"fan-out to {FANOUT} namespaces; {replicas} replica(s), leader election with its "
            f"default timings; down {down_for:.0f} s, from the stop to /readyz (at least until the "
            f"leader's lease had run out"
            f"{', then 3 minutes in all' if outage == '3m' else ''}); a change made once the "
            "API server was ready again."
        ),
        observed={
            "deletes": len(deletes),
            "missed_updates": missed(k8s.core, grant, targets, "survive-canary-2"),
            "converge_seconds": landed_all,
            "exits": len(exits),
            "healthz_failures": unhealthy,
            "tracebacks": tracebacks,
            "down_seconds": round(down_for, 1),
            "first_copy_landed_seconds": round(first - sent, 2),
            "copies_recreated": sum(1 for ns, uid in after.items() if before.get(ns) != uid),
            "leader_before_after": f"{ids.index(leader)} -> {ids.index(new_leader)}",
            "terms_won_after": int(won),
            "terms_lost_workers_stopped": f"{terms_lost} {workers_stopped}",
        },
    )
    assert exits == [] and unhealthy == 0 and tracebacks == 0
    assert deletes == []
    assert after == before  # no copy deleted and re-created either
    assert won >= 1  # a new term was won (the old one ended with the outage)
    assert terms_lost == workers_stopped and sum(terms_lost) >= 1
    assert first - sent <= support.OUTAGE_LANDS_WITHIN, (
        f"the next change took {first - sent:.1f} s to land"
    )
    for cp in procs:
        assert cp.ready()


def _slow_requests(ctl: ControllerProcess, over: float) -> float:
    """Requests (watches aside) that took longer than `over` seconds (a histogram bucket)."""
    total = slow = 0.0
    for (name, labels), value in ctl.metrics().items():
        if name != "projector_api_request_duration_seconds_bucket":
            continue
        lab = dict(labels)
        if lab.get("verb") == "WATCH":
            continue
        if lab.get("le") == "+Inf":
            total += value
        elif float(lab.get("le", "0")) == over:
            slow -= value
    return total + slow


def test_a_black_hole_costs_no_lease_term_and_no_request_waits_on_a_dead_connection(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    admin_client: client.ApiClient,
    audit_log: Path,
    relayed: tuple[Relay, Path],
) -> None:
    """Every connection of a leader (default lease timings) silenced at once, idle pooled ones
    included: no request waits on one of them past its read timeout (10 s; a Lease call 1.5 s),
    the leader renews on a fresh connection well within its renew deadline (its term goes on),
    and a change made at once lands when the watches' read deadline has reconnected them."""
    relay, kubeconfig = relayed
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "hole-canary-1"}, export_to="*")
    rid = unique_name("hole", max_len=30)
    ctl = start_controller(
        f"--kubeconfig={kubeconfig}",
        f"--id={rid}",
        "--informer-stall-after=10s",
        leader_elect=True,
    )
    eventually(lambda: _holder(admin_client) == rid, timeout=40)
    k8s.grant((src, "hub"), namespaces=[a])
    eventually(lambda: k8s.copy_data(a, "hub") == {"token": "hole-canary-1"})
    uid = k8s.copy(a, "hub").metadata.uid
    terms = ctl.metric("projector_leader_transitions_total")
    renewals = ctl.metric("projector_lease_renew_seconds_count")
    slow_before = _slow_requests(ctl, 10.0)
    started = datetime.now(UTC)
    silenced, converged = _change_in_a_black_hole(
        k8s,
        relay,
        src,
        a,
        "hole-canary-2",
        at_least=(5, "the watches and the Lease's connection run over the relay"),
    )
    eventually(lambda: ctl.metric("projector_lease_renew_seconds_count") >= renewals + 2)
    slow = _slow_requests(ctl, 10.0) - slow_before
    lost = ctl.logs().count("lost the lease")
    deletes = deletes_since(audit_log, started)
    reliability.record(
        "Every connection of a leader black-holed, idle pooled ones included",
        injected=(
            f"all {silenced} connections between a leader (default lease timings) and the "
            "API server, its watches, its Lease session and its idle pooled connections, "
            "stopped carrying bytes without being closed (a loopback TCP relay); a source "
            "change made at once. --informer-stall-after=10s (watch read deadline 5 s)."
        ),
        observed={
            "deletes": len(deletes),
            "missed_updates": int(k8s.copy_data(a, "hub") != {"token": "hole-canary-2"}),
            "converge_seconds": converged,
            "requests_over_10s": int(slow),
            "lease_terms_lost": lost,
            "copies_recreated": int(k8s.copy(a, "hub").metadata.uid != uid),
        },
    )
    assert slow == 0, "a request waited on a dead connection past its read timeout"
    assert lost == 0 and ctl.metric("projector_leader") == 1
    assert ctl.metric("projector_leader_transitions_total") == terms
    assert deletes == []
