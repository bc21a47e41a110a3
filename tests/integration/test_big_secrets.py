"""Large Secrets (issue 10): memory stays bounded, and payloads at the API's limits project.

The memory target is the Deployment's: 150 copies of a 1 MiB Secret must not push the
controller past 200 MiB, neither while it fans out nor when it restarts and relists them all
(before paging, one 190 MiB page of copies was held and parsed whole on every start).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.bed.kube import b64, eventually
from tests.bed.launcher import ControllerProcess
from tests.support import Cluster, NamespaceFactory, audit_writes

MAX_SECRET = 1024 * 1024
"""The API server's limit on a Secret's data (the sum of its values' sizes)."""
COPIES = 150
RSS_LIMIT_MIB = 200


def canary(size: int) -> str:
    """A canary value of exactly `size` ASCII bytes."""
    return ("CANARY-" + secrets.token_urlsafe(size))[:size]


def projected(k8s: Cluster, grant: str) -> int:
    return int((k8s.status(grant).get("targets") or {}).get("projected", 0))


def test_150_copies_of_a_1_mib_secret_stay_under_200_mib(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any
) -> None:
    src = make_namespace()
    label = {"projector-test/big": src}
    for _ in range(COPIES):
        make_namespace(labels=label)
    k8s.source(src, "big", {"blob": canary(MAX_SECRET - 1024)}, export_to="*")
    first: ControllerProcess = start_controller()
    g = k8s.grant((src, "big"), selector={"matchLabels": label})
    eventually(lambda: projected(k8s, g) == COPIES, timeout=240, message="150 copies written")
    eventually(first.idle, timeout=60)
    fan_out = first.peak_rss_mib()
    assert first.stop() == 0
    second: ControllerProcess = start_controller()  # lists 150 MiB of copies again
    eventually(lambda: second.reconciled(g) >= 1 and second.idle(), timeout=120)
    relist = second.peak_rss_mib()
    print(f"peak RSS (VmHWM): fan-out {fan_out:.0f} MiB, restart {relist:.0f} MiB")
    rewrites = sum(  # an earlier test's orphan may be deleted meanwhile: not counted
        second.metric("projector_writes_total", action=a) for a in ("Create", "Update", "Replace")
    )
    assert rewrites == 0  # every copy was up to date, and seen to be
    assert max(fan_out, relist) < RSS_LIMIT_MIB, (
        f"peak RSS: fan-out {fan_out:.0f} MiB, restart {relist:.0f} MiB"
    )


# --- payloads at the edges, on the real API server ----------------------------------------------


def raw_source(k8s: Cluster, namespace: str, name: str, data: dict[str, str]) -> None:
    """A contract Secret from base64 values as given (binary ones included), all canaries."""
    for v in data.values():
        k8s.canaries.add(v)
        with contextlib.suppress(UnicodeDecodeError):
            k8s.canaries.add(base64.b64decode(v).decode())
    meta = client.V1ObjectMeta(
        name=name,
        labels={"projector.nebari.dev/export": "true"},
        annotations={"projector.nebari.dev/export-to": "*"},
    )
    body = client.V1Secret(metadata=meta, data=dict[str, bytes | str](data))
    k8s.core.create_namespaced_secret(namespace, body)


def digest(data: Mapping[str, bytes | str] | None) -> tuple[int, str]:
    """Number of keys and a hash of the values, for assertions that print no value."""
    items = sorted((k, str(v)) for k, v in (data or {}).items())
    return len(items), hashlib.sha256(json.dumps(items).encode()).hexdigest()


def at_limit() -> dict[str, str]:
    """Values that add up to exactly the API's 1 MiB: the biggest source there can be."""
    half = MAX_SECRET // 2
    return {k: b64(canary(half)) for k in ("a", "b")}


def binary() -> dict[str, str]:
    """Values that are not UTF-8: every byte value, and random bytes."""
    return {
        "all-bytes": base64.b64encode(bytes(range(256)) * 4).decode(),
        "random": base64.b64encode(b"\xff\xfe" + os.urandom(4096)).decode(),
    }


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(at_limit(), id="1-MiB-at-the-limit"),
        pytest.param({f"key-{i:04}": b64(f"CANARY-{i:04}") for i in range(1000)}, id="1000-keys"),
        pytest.param(binary(), id="binary-values"),
    ],
)
def test_edge_payloads_are_projected_exactly(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    data: dict[str, str],
) -> None:
    """The copy holds exactly the source's bytes, with projector's metadata added on top."""
    src, dst = make_namespace(), make_namespace()
    raw_source(k8s, src, "edge", data)
    g = k8s.grant((src, "edge"), namespaces=[dst])
    eventually(lambda: projected(k8s, g) == 1, timeout=60)
    copy = k8s.copy(dst, "edge")
    assert copy is not None
    assert digest(copy.data) == digest(data)  # byte for byte, without printing a value
    assert copy.metadata.annotations["projector.nebari.dev/grant-uid"]
    eventually(controller.idle, timeout=30)
    # Created once, then seen to be in sync: no rewrite. This grant's writes, from its
    # reconciles' log lines (the controller also serves the grants earlier tests left).
    writes: Counter[str] = Counter()
    for line in controller.logs().splitlines():
        entry = json.loads(line) if line.startswith("{") else {}
        if entry.get("event") == "reconciled" and entry.get("grant") == g:
            writes.update(entry.get("writes") or {})
    assert (writes["Create"], writes["Update"]) == (1, 0), writes
    again = k8s.copy(dst, "edge")
    assert again is not None
    assert again.metadata.resource_version == copy.metadata.resource_version


def test_a_typed_secret_whose_required_key_is_filtered_out_becomes_opaque(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """Without `.dockerconfigjson` the API server would refuse the type: the copy is Opaque."""
    src, dst = make_namespace(), make_namespace()
    config = '{"auths":{"registry.example":{"auth":"CANARY-docker-auth"}}}'
    k8s.source(
        src,
        "pull",
        {".dockerconfigjson": config, "note": "CANARY-note"},
        export_to="*",
        type_="kubernetes.io/dockerconfigjson",
    )
    g = k8s.grant((src, "pull"), namespaces=[dst], keys=[{"from": "note"}])
    eventually(lambda: projected(k8s, g) == 1, timeout=60)
    copy = k8s.copy(dst, "pull")
    assert copy is not None and copy.type == "Opaque"
    assert k8s.copy_data(dst, "pull") == {"note": "CANARY-note"}


def test_a_copy_the_api_server_refuses_is_reported_without_a_hot_loop(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    audit_log: Path,
) -> None:
    """One source key mapped twice makes a copy over 1 MiB: the server says 422 (Invalid).

    The grant's status names the namespace and the server's reason; the grant is retried with
    the work queue's backoff (5 ms doubling: its 11th attempt comes >= 5.1 s after the first),
    one write per attempt, and its status is not rewritten per attempt (the attempt count is a
    metric); the controller lives on and other grants keep projecting.
    """
    src, bad, good = make_namespace(), make_namespace(), make_namespace()
    started = time.monotonic()
    since = datetime.now(UTC)
    k8s.source(src, "big", {"v": canary(MAX_SECRET * 3 // 5)}, export_to="*")
    k8s.source(src, "small", {"v": "CANARY-small-1"}, export_to="*")
    twice = [{"from": "v", "to": "one"}, {"from": "v", "to": "two"}]
    refused = k8s.grant((src, "big"), namespaces=[bad], keys=twice)
    fine = k8s.grant((src, "small"), namespaces=[good])
    failure = eventually(lambda: (k8s.status(refused).get("failures") or [None])[0], timeout=60)
    assert failure["namespace"] == bad and failure["reason"] == "WriteFailed"
    assert "422" in failure["message"] and "too long" in failure["message"].lower(), failure
    ready = k8s.condition(refused, "Ready")
    assert ready is not None and ready["status"] == "False"
    eventually(lambda: projected(k8s, fine) == 1, timeout=30)
    k8s.patch_secret(src, "small", {"data": {"v": "CANARY-small-2"}})
    eventually(lambda: k8s.copy_data(good, "small") == {"v": "CANARY-small-2"}, timeout=30)
    assert k8s.copy(bad, "big") is None
    assert controller.ready()
    eventually(lambda: attempt(controller, refused) >= 11, timeout=60, message="11th attempt")
    elapsed = time.monotonic() - started
    refusals = controller.metric(
        "projector_api_requests_total", verb="CREATE", resource="secrets", code="422"
    )
    assert elapsed >= 5.0 and refusals <= attempt(controller, refused) + 1, (elapsed, refusals)
    status_writes = [
        w
        for w in audit_writes(audit_log, since)
        if w.resource == "projectiongrants" and w.name == refused and w.verb == "patch"
    ]
    assert 1 <= len(status_writes) <= 2, status_writes  # the failure, maybe the first 422 apart


def attempt(controller: ControllerProcess, grant: str) -> int:
    """How many times in a row the grant has failed (projector_grant_retries), else 0."""
    return int(controller.metric("projector_grant_retries", grant=grant))
