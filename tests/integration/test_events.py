"""Events are aggregated on the real API server, under the shipped RBAC (issue 36 item 6): the
same Event again counts on the one recorded (count, lastTimestamp), as client-go's recorder
does, never a new object for each time it is told."""

from __future__ import annotations

from collections import Counter
from typing import Any

from projector.core.model import EXPORT_LABEL
from tests.bed.kube import eventually
from tests.support import Cluster, NamespaceFactory


def test_an_event_told_again_is_counted_on_the_one_recorded(
    controller: Any, k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    src, ns = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": "EVENTS-canary-1"}, export_to=ns)
    grant = k8s.grant((src, "hub"), namespaces=[ns])
    eventually(lambda: k8s.copy_data(ns, "hub") == {"token": "EVENTS-canary-1"})
    for _ in range(2):  # the producer withdraws its opt-in, then gives it again: twice
        k8s.patch_secret(src, "hub", {"metadata": {"labels": {EXPORT_LABEL: None}}})
        eventually(lambda: k8s.copy(ns, "hub") is None, message="revoked")
        k8s.patch_secret(src, "hub", {"metadata": {"labels": {EXPORT_LABEL: "true"}}})
        eventually(lambda: k8s.copy(ns, "hub") is not None, message="projected again")

    def told() -> dict[str, tuple[int, int]]:
        """Per reason: how many Event objects, and the count they add up to."""
        objects: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for e in k8s.events(grant):
            objects[e.reason] += 1
            counts[e.reason] += e.count or 1
        return {r: (objects[r], counts[r]) for r in objects}

    want = {"Created": (1, 3), "Deleted": (1, 2), "NotExported": (1, 2)}
    eventually(lambda: told() == want, message=f"not one object per Event: {told()} != {want}")
    (created,) = [e for e in k8s.events(grant) if e.reason == "Created"]
    first, last = created.first_timestamp, created.last_timestamp
    assert first is not None and last is not None and last >= first  # seconds: often equal
