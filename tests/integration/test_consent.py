"""Consent, combination by combination, against the real API server and one running controller.

Each combination of the admin's targeting (a list, a selector, neither, the source's own
namespace), the producer's export label (`"true"`, missing, a wrong spelling) and its
`export-to` (a name, globs, `*`, missing, empty, entries that are neither names nor globs) has
its own source Secret, grant and consumer namespace; all are created at once and reconciled by
one controller, then each combination is asserted on its own: the copy exists or not, and the
grant's status says why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import ControllerProcess, launch
from tests.support import Canaries, Cluster

EXPORT_LABEL = "projector.nebari.dev/export"
SELECT = "consent-matrix"
"""The label key the selector combinations select consumer namespaces by."""
SELECT_ALL = "consent-matrix-all"
"""A label on the source namespace and one consumer: a selector that also selects the source's."""

COPY, DENIED, NOT_EXPORTED, UNTARGETED, SOURCE_NS, SOURCE_NS_AND_COPY = (
    "copy",
    "denied",
    "not-exported",
    "untargeted",
    "source-namespace",
    "source-namespace-and-copy",
)


@dataclass(frozen=True)
class Combination:
    id: str
    targeting: str
    """list | selector | unselected | source-ns | source-ns+list | selector+source-ns"""
    label: str | None
    """The export label's value on the source (None: no label)."""
    export_to: str | None
    """The annotation; `{ns}` is the consumer's name, `{stem}` all of it but 2 characters."""
    expect: str
    reported: tuple[str, ...] = ()
    """export-to entries the status must name as matching no namespace."""


COMBINATIONS = [
    Combination("list-exact", "list", "true", "{ns}", COPY),
    Combination("list-glob-star", "list", "true", "{stem}*", COPY),
    Combination("list-glob-question", "list", "true", "{stem}??", COPY),
    Combination("list-any", "list", "true", "*", COPY),
    Combination("list-second-entry", "list", "true", "elsewhere, {ns}", COPY),
    Combination("list-other-name", "list", "true", "elsewhere", DENIED),
    Combination("list-no-export-to", "list", "true", None, DENIED),
    Combination("list-empty-export-to", "list", "true", "", DENIED),
    Combination(
        "list-negations-match-nothing", "list", "true", "[!z]*,-{ns}", DENIED, ("[!z]*", "-{ns}")
    ),
    Combination("list-invalid-beside-valid", "list", "true", "[!z]*, {ns}", COPY, ("[!z]*",)),
    Combination("list-no-label", "list", None, "*", NOT_EXPORTED),
    Combination("list-label-True", "list", "True", "*", NOT_EXPORTED),
    Combination("list-label-false", "list", "false", "{ns}", NOT_EXPORTED),
    Combination("selector-exact", "selector", "true", "{ns}", COPY),
    Combination("selector-glob", "selector", "true", "{stem}*", COPY),
    Combination("selector-other-name", "selector", "true", "elsewhere", DENIED),
    Combination("selector-no-label", "selector", None, "*", NOT_EXPORTED),
    Combination("unselected", "unselected", "true", "*", UNTARGETED),
    Combination("source-ns-listed", "source-ns", "true", "*", SOURCE_NS),
    Combination("source-ns-and-consumer-listed", "source-ns+list", "true", "*", SOURCE_NS_AND_COPY),
    Combination("selector-selects-source-ns-too", "selector+source-ns", "true", "*", COPY),
]


@dataclass
class Placed:
    """Where one combination landed: its consumer namespace, source name, grant and data."""

    namespace: str
    source: str
    grant: str
    data: dict[str, str]
    export_to: str | None
    reported: tuple[str, ...] = field(default=())


@dataclass
class Matrix:
    k8s: Cluster
    controller: ControllerProcess
    source_namespace: str
    placed: dict[str, Placed]


TARGET_SUFFIX = "-copy"
"""Copies are named `<source>-copy`, so a copy in the source's own namespace would be seen."""


@pytest.fixture(scope="module")
def matrix(
    projector_kubeconfig: Path,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Matrix]:
    """Every combination at once, reconciled by one controller (stopped and scanned after)."""
    canaries = Canaries()
    k8s = Cluster(core_v1, custom_objects, canaries, "consent-matrix")
    run = unique_name("m")
    namespaces: list[str] = []

    def make_namespace(base: str, labels: dict[str, str] | None = None) -> str:
        name = unique_name(f"cm-{base}")
        core_v1.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
        )
        namespaces.append(name)
        return name

    src = make_namespace("source", {SELECT_ALL: run})
    placed: dict[str, Placed] = {}
    for i, c in enumerate(COMBINATIONS):
        labels = {SELECT: c.id} if c.targeting in ("selector", "unselected") else {}
        if c.targeting == "selector+source-ns":
            labels = {SELECT_ALL: run}
        ns = make_namespace(c.id[:40], labels)
        fill = {"ns": ns, "stem": ns[:-2]}
        export_to = None if c.export_to is None else c.export_to.format(**fill)
        name = f"s{i}"
        data = {"token": f"CANARY-consent-{run}-{i}"}
        k8s.source(
            src,
            name,
            data,
            export_to=export_to,
            exported=False,
            labels={EXPORT_LABEL: c.label} if c.label is not None else None,
        )
        selector: dict[str, Any] | None = None
        listed: list[str] | None = None
        if c.targeting == "list":
            listed = [ns]
        elif c.targeting == "selector":
            selector = {"matchLabels": {SELECT: c.id}}
        elif c.targeting == "unselected":
            selector = {"matchLabels": {SELECT: f"not-{c.id}"}}
        elif c.targeting == "source-ns":
            listed = [src]
        elif c.targeting == "source-ns+list":
            listed = [src, ns]
        elif c.targeting == "selector+source-ns":
            selector = {"matchLabels": {SELECT_ALL: run}}
        grant = k8s.grant(
            (src, name),
            name=unique_name(f"cm-{c.id[:40]}"),
            namespaces=listed,
            selector=selector,
            target_name=name + TARGET_SUFFIX,
        )
        reported = tuple(r.format(**fill) for r in c.reported)
        placed[c.id] = Placed(ns, name, grant, data, export_to, reported)

    log = tmp_path_factory.mktemp("consent-matrix") / "controller.log"
    cp = launch(projector_kubeconfig, log, "--debounce=0.02", "--debounce-max=0.2")
    try:
        eventually(cp.ready, timeout=30, message="controller /readyz")
        yield Matrix(k8s, cp, src, placed)
        metrics = cp.get("/metrics")[1]
        try:
            k8s.scan()
        finally:
            k8s.cleanup()
    finally:
        code = cp.stop()
        print(f"--- controller log (tail) {log} ---\n" + "\n".join(cp.logs().splitlines()[-40:]))
        for ns in namespaces:
            try:
                core_v1.delete_namespace(ns)
            except client.ApiException as e:
                if e.status != 404:
                    raise
    assert code == 0, f"controller exit code {code}:\n{cp.logs()[-3000:]}"
    canaries.assert_absent("controller logs", cp.logs())
    canaries.assert_absent("metrics", metrics)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or ()}


def verify(m: Matrix, c: Combination) -> bool:
    """True if the combination's outcome is right; else AssertionError with what was seen."""
    p = m.placed[c.id]
    target = p.source + TARGET_SUFFIX
    status = m.k8s.status(p.grant)
    conds = conditions(status)
    seen = json.dumps({"status": status, "export_to": p.export_to})
    assert status.get("observedGeneration") == 1 and "Ready" in conds, seen
    counts = status["targets"]
    failures = {(f["namespace"], f["reason"]) for f in status.get("failures") or ()}
    copy = m.k8s.copy_data(p.namespace, target)
    # the source's own namespace never holds a copy, whatever the combination
    assert m.k8s.copy(m.source_namespace, target) is None, seen
    if c.expect in (COPY, SOURCE_NS_AND_COPY):
        assert copy == p.data, seen
        assert counts["projected"] == 1 and counts["denied"] == 0, seen
    else:
        assert copy is None, seen
        assert counts["projected"] == 0, seen
    if c.expect == COPY:
        assert conds["Ready"]["status"] == "True" and counts["matched"] == 1, seen
        assert not failures, seen
    elif c.expect == DENIED:
        assert counts == {"matched": 1, "projected": 0, "conflicted": 0, "denied": 1}, seen
        assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "Denied"), seen
        assert conds["SourceAvailable"]["status"] == "True", seen
    elif c.expect == NOT_EXPORTED:
        assert counts["denied"] == 1, seen
        source = conds["SourceAvailable"]
        assert (source["status"], source["reason"]) == ("False", "NotExported"), seen
    elif c.expect == UNTARGETED:
        assert counts["matched"] == 0 and conds["Ready"]["status"] == "True", seen
    elif c.expect == SOURCE_NS:
        assert failures == {(m.source_namespace, "SourceNamespace")}, seen
        assert counts["matched"] == 0, seen
    elif c.expect == SOURCE_NS_AND_COPY:
        assert failures == {(m.source_namespace, "SourceNamespace")}, seen
        assert counts["matched"] == 1, seen
    message = conds["SourceAvailable"]["message"]
    for entry in p.reported:
        assert entry in message.split("match no namespace: ", 1)[-1], seen
    if not p.reported:
        assert "match no namespace" not in message, seen
    told = [e for e in m.k8s.events(p.grant) if e.reason == "InvalidExportTo"]
    assert len(told) == (1 if p.reported else 0), [e.message for e in told]
    assert not told or (told[0].count or 1) == 1, told[0]
    return True


def test_the_matrix_is_broad() -> None:
    assert len(COMBINATIONS) >= 16
    assert len({c.id for c in COMBINATIONS}) == len(COMBINATIONS)
    assert {c.expect for c in COMBINATIONS} == {
        COPY,
        DENIED,
        NOT_EXPORTED,
        UNTARGETED,
        SOURCE_NS,
        SOURCE_NS_AND_COPY,
    }


@pytest.mark.parametrize("combination", COMBINATIONS, ids=lambda c: c.id)
def test_consent_combination(matrix: Matrix, combination: Combination) -> None:
    eventually(lambda: verify(matrix, combination), timeout=90, message=combination.id)
