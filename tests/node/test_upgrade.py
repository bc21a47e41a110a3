"""Upgrade from the previous release, as an operator does it, on the real node.

The previous release (its git tag, or the last commit before this version: tests/bed/release)
is built and published to the test bed's registry exactly as `make release` publishes this one,
installed from there, and given three grants (one through a ProjectionExport) into 100
namespaces: 300 copies. Then the documented steps: the new release's CRDs applied, ``helm
upgrade`` to this release from the registry; ``helm rollback`` to the previous one; ``helm
upgrade`` again. After each, once the old pods are gone and a new one leads, every source
changes once, so the new leader has reconciled every grant (the copies' writes for that change
must come from the new version, by User-Agent), and the API server's audit log of the step is
read:

- copy writes the step itself caused: none (each copy was written exactly once, for its
  source's change, and its labels, annotations other than the content hash, and uid are as
  before). A release that must rewrite copies says so in CHANGELOG.md's upgrade notes; then
  this test must be told (``REWRITES``);
- Secret deletes: none, so no copy was absent at any instant;
- two replicas never wrote in turn: the writers' sequence (by User-Agent, which names the
  version and the pod) never goes back to one that wrote before another;
- the CRDs the cluster serves are the new release's.

The figures are a row of docs/upgrade.md's table (written with PROJECTOR_UPDATE_DOCS=1).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from projector.core.model import HASH_ANNOTATION, MANAGED_BY_LABEL
from tests.bed.controlplane.plane import REPO_ROOT, ControlPlane
from tests.bed.kube import eventually
from tests.bed.node.node import Node
from tests.bed.release import Published
from tests.node.release import NAMESPACE, RELEASE, SELECTOR, Release
from tests.support import Cluster, NamespaceFactory, audit_writes

CONSUMERS = 100
REWRITES: dict[tuple[str, str], str] = {}
"""(from, to) -> why that upgrade rewrites every copy once (its CHANGELOG upgrade note)."""
DOC = REPO_ROOT / "docs" / "upgrade.md"
BEGIN = "<!-- upgrade rows: written by tests/node/test_upgrade.py; do not edit -->"
END = "<!-- upgrade rows: end -->"

Copies = dict[tuple[str, str], tuple[str, dict[str, str], dict[str, str], frozenset[str]]]
"""(namespace, name) -> (uid, labels, annotations without the content hash, data values)."""


@dataclass(frozen=True)
class Step:
    """What one helm step did to the copies, from the audit log."""

    step: str
    copies: int
    copy_writes: int
    """Writes of copies beyond the one each source change asked for, and changed metadata."""
    deletes: int
    writers: list[str]
    """The User-Agents that wrote, in the order they first wrote."""
    interleaved: bool
    rollout_seconds: float
    """From the helm command to the new pods Ready, the old ones gone and one of the new leading."""


def test_an_upgrade_from_the_previous_release_and_a_rollback_rewrite_and_delete_nothing(
    release: Release,
    previous_published: Published,
    published: Published,
    node: Node,
    control_plane: ControlPlane,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    audit_log: Path,
) -> None:
    old, new = previous_published, published
    assert old.version != new.version, "the previous release must be an earlier version"
    release.uninstall()
    try:
        release.install(published=old)
        assert images(release) == {old.image}
        sources = workload(k8s, make_namespace)
        eventually(lambda: len(copies(k8s, sources)) == 3 * CONSUMERS, 120, message="300 copies")

        def upgrade() -> None:
            apply_crds(release, node, new)
            release.install(published=new)

        def rollback() -> None:
            release.helm("rollback", RELEASE, "1", "-n", NAMESPACE, "--wait")
            release.wait_rolled_out()

        plan = [
            (f"upgrade {old.version} -> {new.version}", upgrade, new),
            (f"rollback {new.version} -> {old.version}", rollback, old),
            (f"upgrade {old.version} -> {new.version} again", upgrade, new),
        ]
        steps = [step(n, do, release, k8s, sources, audit_log, to) for n, do, to in plan]
    finally:
        release.install()  # the session's release, as the other node tests expect it
    served = control_plane_crds(release)
    for crd in chart_crds(release, new):
        name = crd["metadata"]["name"]
        assert schemas(served[name]) == schemas(crd["spec"]["versions"]), name
    report(old, new, steps)
    allowed = REWRITES.get((old.version, new.version))
    for s in steps:
        assert s.deletes == 0, s
        assert not s.interleaved, s
        assert s.copy_writes == (s.copies if allowed and "upgrade" in s.step else 0), s


def workload(k8s: Cluster, make_namespace: NamespaceFactory) -> dict[tuple[str, str], str]:
    """Three grants into CONSUMERS new namespaces: a labelled source by selector, the same
    source's first key under another name, and a source let out by a ProjectionExport alone.
    Returns each source (namespace, name) -> its data key."""
    run = uuid.uuid4().hex[:6]
    prefix = f"upgrade-{run}"
    producer = make_namespace(f"{prefix}-producer")
    for i in range(CONSUMERS):
        make_namespace(f"{prefix}-{i:03d}", labels={"upgrade": run})
    glob = f"{prefix}-0*"
    k8s.source(producer, "labelled", {"token": "v0", "other": "o0"}, export_to=glob)
    k8s.source(producer, "exported", {"url": "v0"}, exported=False)
    k8s.export(producer, "exported", to=[glob])
    selector = {"matchLabels": {"upgrade": run}}
    k8s.grant((producer, "labelled"), selector=selector)
    k8s.grant(
        (producer, "labelled"),
        selector=selector,
        target_name="labelled-token",
        keys=[{"from": "token"}],
    )
    k8s.grant((producer, "exported"), selector=selector)
    return {(producer, "labelled"): "token", (producer, "exported"): "url"}


def copies(k8s: Cluster, sources: dict[tuple[str, str], str]) -> Copies:
    """Every copy in the test's namespaces, with what an upgrade must not change."""
    prefix = next(iter(sources))[0].removesuffix("-producer")
    found = k8s.core.list_secret_for_all_namespaces(label_selector=f"{MANAGED_BY_LABEL}").items
    out: Copies = {}
    for s in found:
        m = s.metadata
        if m.namespace.startswith(prefix) and m.namespace != f"{prefix}-producer":
            notes = {str(k): str(v) for k, v in (m.annotations or {}).items()}
            notes.pop(HASH_ANNOTATION, None)
            values = frozenset(str(v) for v in (s.data or {}).values())
            out[str(m.namespace), str(m.name)] = (str(m.uid), dict(m.labels or {}), notes, values)
    return out


def step(
    name: str,
    do: Callable[[], None],
    release: Release,
    k8s: Cluster,
    sources: dict[tuple[str, str], str],
    audit_log: Path,
    to: Published,
) -> Step:
    """Run one helm step, then change every source once and wait for each copy to show it;
    what the audit log says the step wrote."""
    before = copies(k8s, sources)
    since = datetime.now(UTC)
    do()

    def handed_over() -> bool:
        # the old pods gone, terminating ones too (a leader being stopped may still write),
        # and a pod of the new ReplicaSet holding the Lease
        every = release.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
        names = {str(p.metadata.name) for p in every}
        return (
            images(release) == {to.image}
            and names == {str(p.metadata.name) for p in release.pods()}
            and release.leader() in names
        )

    eventually(handed_over, 120, interval=0.2, message=f"the {name} handed over")
    seconds = (datetime.now(UTC) - since).total_seconds()
    value = f"CANARY-{uuid.uuid4().hex[:8]}"
    changed_at = datetime.now(UTC)
    for (namespace, source), key in sources.items():
        k8s.patch_secret(namespace, source, {"data": {key: value}})
    encoded = base64.b64encode(value.encode()).decode()
    eventually(
        lambda: all(encoded in data for *_, data in copies(k8s, sources).values()),
        120,
        message=f"every copy shows the change after the {name}",
    )
    after = copies(k8s, sources)
    writes = [w for w in audit_writes(audit_log, since) if w.agent.startswith("projector/")]
    late = {w.agent for w in writes if w.resource == "secrets" and w.at >= changed_at}
    assert late and all(a.startswith(f"projector/{to.version} ") for a in late), late
    per_copy = Counter(
        (w.namespace, w.name) for w in writes if w.resource == "secrets" and w.verb != "delete"
    )
    changed = sum(1 for key in before if after.get(key, ())[:3] != before[key][:3])
    extra = sum(max(0, per_copy[key] - 1) for key in before)
    order: list[str] = []
    for w in writes:
        if w.resource != "leases" and (not order or order[-1] != w.agent):
            order.append(w.agent)
    return Step(
        step=name,
        copies=len(before),
        copy_writes=extra + changed,
        deletes=sum(1 for w in writes if w.verb == "delete" and w.resource == "secrets"),
        writers=list(dict.fromkeys(order)),
        interleaved=len(order) != len(set(order)),
        rollout_seconds=round(seconds, 1),
    )


def images(release: Release) -> set[str]:
    """The image every current pod of the release runs."""
    return {str(p.spec.containers[0].image) for p in release.pods()}


def show_crds(release: Release, published: Published) -> str:
    """``helm show crds`` of a published chart: the manifests the upgrade step applies."""
    return release.helm("show", "crds", *release.chart(published))


def chart_crds(release: Release, published: Published) -> list[dict[str, Any]]:
    """The CRDs of a published chart, parsed."""
    return [d for d in yaml.safe_load_all(show_crds(release, published)) if d]


def apply_crds(release: Release, node: Node, published: Published) -> None:
    """The documented first step of an upgrade (docs/upgrade.md): the new release's CRDs,
    applied server-side, taking over the fields an earlier install wrote."""
    text = show_crds(release, published)
    subprocess.run(
        [
            str(node.kube_binaries / "kubectl"),
            "--kubeconfig",
            str(release.kubeconfig),
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
        ],
        input=text,
        text=True,
        check=True,
        capture_output=True,
        env={**os.environ, "KUBECACHEDIR": str(release.kubeconfig.parent / "kube-cache")},
    )


def control_plane_crds(release: Release) -> dict[str, Any]:
    """The versions (schemas included) of the CRDs the API server serves, by name."""
    api = client.ApiextensionsV1Api(release.api)
    out: dict[str, Any] = {}
    for crd in api.list_custom_resource_definition().items:
        raw = release.api.sanitize_for_serialization(crd)
        out[str(crd.metadata.name)] = raw["spec"]["versions"]
    return out


def schemas(versions: list[dict[str, Any]]) -> dict[str, Any]:
    """Each version's name -> its OpenAPI schema."""
    return {v["name"]: v["schema"] for v in versions}


def report(old: Published, new: Published, steps: list[Step]) -> None:
    """Print the row; write it into docs/upgrade.md with PROJECTOR_UPDATE_DOCS=1 (rows of other
    releases are kept, a row of the same versions replaced)."""
    record = {
        "from": old.version,
        "to": new.version,
        "revision": new.revision,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "steps": [asdict(s) for s in steps],
    }
    print("\n" + json.dumps(record, indent=2))
    if os.environ.get("PROJECTOR_UPDATE_DOCS") != "1":
        return
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN + "\n")
    body, _, tail = rest.partition(END)
    header = body.splitlines()[:2]
    same = f"| {old.version} | {new.version} |"
    rows = [r for r in body.splitlines()[2:] if r and not r.startswith(same)]

    def each(field: Callable[[Step], object]) -> str:
        return " / ".join(str(field(s)) for s in steps)

    cells = [
        old.version,
        new.version,
        str(record["at"])[:10],
        str(steps[0].copies),
        each(lambda s: s.copy_writes),
        each(lambda s: s.deletes),
        each(lambda s: "yes" if s.interleaved else "no"),
        each(lambda s: f"{s.rollout_seconds:.0f} s"),
    ]
    rows.insert(0, "| " + " | ".join(cells) + " |")
    DOC.write_text(head + BEGIN + "\n" + "\n".join([*header, *rows]) + "\n" + END + tail)
