"""The periodic resync (--resync-period) on the real API server: every grant reconciled again
from the caches, and a world in sync costs no write at all.

Counted from the API server's audit log, not from the controller's word: over 1,000 synced
copies (50 grants x 20 namespaces), two resyncs of every grant issue zero writes (no copy, no
status, no Event).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bed.kube import eventually
from tests.support import Cluster, NamespaceFactory, audit_writes

GRANTS, NAMESPACES = 50, 20
PERIOD = 2.0
"""A short --resync-period, jittered by +-10%: a few resyncs fit in the test."""


def test_a_resync_over_1000_synced_copies_reconciles_every_grant_and_writes_nothing(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    audit_log: Path,
) -> None:
    ctl = start_controller(f"--resync-period={PERIOD:g}s")
    src = make_namespace()
    targets = [make_namespace() for _ in range(NAMESPACES)]
    k8s.source(src, "hub", {"token": "RESYNC-canary-1"}, export_to="*")
    grants = [
        k8s.grant((src, "hub"), namespaces=targets, target_name=f"hub-{i}") for i in range(GRANTS)
    ]

    def projected() -> bool:
        return all(k8s.observed(g)["targets"]["projected"] == NAMESPACES for g in grants)

    eventually(projected, timeout=180, interval=0.5, message="the 1,000 copies never landed")
    eventually(ctl.idle, timeout=60)
    assert ctl.metric("projector_writes_total", result="ok") == GRANTS * NAMESPACES
    since = datetime.now(UTC)
    before = {g: ctl.reconciled(g) for g in grants}
    resyncs = ctl.logs().count('"event": "resync"')

    def resynced_twice() -> bool:
        return all(ctl.reconciled(g) >= before[g] + 2 for g in grants)

    eventually(resynced_twice, timeout=60, interval=0.5, message="not every grant was resynced")
    eventually(ctl.idle, timeout=60)
    assert ctl.logs().count('"event": "resync"') >= resyncs + 2
    ours = [w for w in audit_writes(audit_log, since) if w.agent.startswith("projector/")]
    assert ours == [], f"a resync of a world in sync wrote: {ours[:5]}"
    assert ctl.metric("projector_writes_total", result="ok") == GRANTS * NAMESPACES
