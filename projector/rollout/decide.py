"""Opt-in rollouts, the decision: which workloads restart, and the annotations that do it.

A Deployment, StatefulSet or DaemonSet asks with the annotation
`projector.nebari.dev/rollout-on: <copy>[,<copy>...]` (copies in its own namespace), on its own
metadata or on its pod template (charts often let users annotate only the latter); it asks for
the union of the two (`asked_for`). When the
content hash (the copy's `content-hash` annotation, which projector writes with the data) of a
named copy that projector owns differs from the one its pods were started with, projector
server-side applies, as field manager `projector-rollout`, the pod-template annotation
`projector.nebari.dev/rollout-<copy>: <stamp>` (16 hex digits of the content hash keyed by
the copy's uid, `stamp_of`), and the workload's own rolling update restarts the pods.

The decision (`decide`) is a pure function of the cached workload and the copies' hashes; it
compares hashes, never events, so a restart, a leader change, a resync or a relist rolls
nothing. What the pods were started with is the template's stamp, or, before the first
rollout, the baseline `projector.nebari.dev/seen-<copy>` on the workload's own metadata: on
first sight projector records the hash there instead of rolling, so opting in restarts
nothing. A rollout is never started while the last one still progresses. Every apply carries
all of projector's stamps of the workload, so server-side apply never drops one (a dropped
template annotation would itself roll the pods), and never the user's `rollout-on` on the
template, which starts with the stamps' prefix but is no stamp: the apply neither drops it nor
takes it over, and no copy's stamp key is ever that key. No I/O here: `wing` does it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from projector.core.kinds import DAEMONSETS, DEPLOYMENTS, STATEFULSETS, Obj, Resource
from projector.core.model import HASH_ANNOTATION, PREFIX, Copy

ROLLOUT_ON = f"{PREFIX}rollout-on"
"""On a workload or its pod template: the copies (names in its namespace) whose content
changes roll it. The user's, never applied by projector."""
STAMP = f"{PREFIX}rollout-"
"""Prefix of the pod-template annotation that carries a copy's stamp (`stamp_of`); `ROLLOUT_ON`
shares it and is no stamp."""
SEEN = f"{PREFIX}seen-"
"""Prefix of the workload annotation that records a copy's stamp when first seen (no roll)."""
FIELD_MANAGER = "projector-rollout"
"""Owns exactly the annotations above: GitOps tools ignore this manager's fields."""
HASH_PREFIX = 16
"""Hex digits of a stamp: enough to tell a copy's versions apart."""
_NAME_MAX = 63
"""Longest name part of an annotation key."""


class WorkloadKind(StrEnum):
    """The kinds that may opt in (their informers' names)."""

    DEPLOYMENT = "deployments"
    STATEFULSET = "statefulsets"
    DAEMONSET = "daemonsets"


RESOURCES: Mapping[WorkloadKind, Resource] = {
    WorkloadKind.DEPLOYMENT: DEPLOYMENTS,
    WorkloadKind.STATEFULSET: STATEFULSETS,
    WorkloadKind.DAEMONSET: DAEMONSETS,
}


@dataclass(frozen=True, slots=True)
class Ref:
    """A workload's queue key."""

    kind: WorkloadKind
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Workload:
    """An opted-in workload, reduced to what `decide` reads (every other field is dropped)."""

    ref: Ref
    uid: str
    copies: tuple[str, ...]
    """The copies named by its rollout-on annotations, on its metadata and on its pod template
    (`asked_for`); empty: not opted in (never cached)."""
    stamps: tuple[tuple[str, str], ...]
    """Its pod template's rollout-<copy> annotations (not rollout-on): what its pods were rolled
    for."""
    seen: tuple[tuple[str, str], ...]
    """Its own seen-* annotations: the baselines recorded on first sight."""
    busy: bool
    """A rollout is still progressing (status behind spec, or replicas not yet updated)."""
    resource_version: str = field(default="", compare=False)
    """Not compared: status updates that change nothing above are no news."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What to apply: every stamp and baseline the workload should carry, and why."""

    stamps: tuple[tuple[str, str], ...]
    seen: tuple[tuple[str, str], ...]
    rolled: tuple[str, ...]
    """Copies whose new content this apply rolls out (empty: nothing restarts)."""
    held: tuple[str, ...]
    """Copies that changed while the last rollout still progresses: rolled once it is done."""

    def needed(self, w: Workload) -> bool:
        """Something differs from what the workload carries."""
        return self.stamps != w.stamps or self.seen != w.seen


def _part(copy: str, room: int, *, digest: bool = False) -> str:
    """A copy's name as the tail of an annotation key; a long name is cut and made unique.

    `digest`: add the name's digest even if it fits.
    """
    if len(copy) <= room and not digest:
        return copy
    tail = hashlib.sha256(copy.encode()).hexdigest()[:8]
    return f"{copy[: room - 9]}-{tail}"


def stamp_key(copy: str) -> str:
    """The pod-template annotation of `copy` (`projector.nebari.dev/rollout-<copy>`).

    Never `ROLLOUT_ON`: a copy named `on` gets `rollout-on-<digest>`, so its stamp is not read
    as the opt-in, and projector never writes the user's annotation.
    """
    room = _NAME_MAX - len("rollout-")
    key = STAMP + _part(copy, room)
    return STAMP + _part(copy, room, digest=True) if key == ROLLOUT_ON else key


def seen_key(copy: str) -> str:
    """The baseline annotation of `copy` on the workload (`projector.nebari.dev/seen-<copy>`)."""
    return SEEN + _part(copy, _NAME_MAX - len("seen-"))


def stamp_of(content_hash: str, copy_uid: str) -> str:
    """What goes on the template for a copy's content: its hash, keyed by the copy's uid.

    Workloads are readable by many more people than Secrets (the `view` role reads them, not
    Secrets), and a bare content hash would let them test guesses of a weak value offline
    (the rest of what it covers is readable from the grant). The annotation is an HMAC under
    the install's hash key (`model.HashKey`), which nobody outside projector holds; a copy
    written before the key carries its unkeyed hash, and its stamp stays what it was (an
    upgrade rolls nothing) until its content changes. The copy's uid changes only if the copy
    is recreated.
    """
    keyed = f"{content_hash}/{copy_uid}".encode()
    return hashlib.sha256(keyed).hexdigest()[:HASH_PREFIX]


def decide(w: Workload, hashes: Mapping[str, str]) -> Decision:
    """What `w` should carry, given the stamps of the copies projector owns.

    `hashes` maps a copy name (in `w`'s namespace) to its stamp; a copy missing from it
    (absent, or not projector's) is left alone. A copy whose hash equals what the pods were
    started with (stamp, else baseline) needs nothing; one never seen gets a baseline (no
    roll); one that differs is stamped (a rollout), unless the last rollout still progresses.
    """
    stamps, seen = dict(w.stamps), dict(w.seen)
    rolled: list[str] = []
    held: list[str] = []
    for copy in w.copies:
        h = hashes.get(copy)
        if h is None:
            continue
        sk, bk = stamp_key(copy), seen_key(copy)
        started = stamps.get(sk) or seen.get(bk)
        if started is None:
            seen[bk] = h
        elif started != h:
            if w.busy:
                held.append(copy)
            else:
                stamps[sk] = seen[bk] = h
                rolled.append(copy)
    return Decision(
        tuple(sorted(stamps.items())), tuple(sorted(seen.items())), tuple(rolled), tuple(held)
    )


def manifest(w: Workload, d: Decision) -> Obj:
    """The apply body: only projector's annotations (metadata and pod template), nothing else.

    Never the user's rollout-on, in either place: as a field of this manager's apply it would
    be taken over (the apply is forced) and outlive its removal from the user's manifests.
    """
    return {
        "apiVersion": RESOURCES[w.ref.kind].version,
        "kind": RESOURCES[w.ref.kind].kind,
        "metadata": {"name": w.ref.name, "namespace": w.ref.namespace, "annotations": dict(d.seen)},
        "spec": {"template": {"metadata": {"annotations": dict(d.stamps)}}},
    }


# --- parsing: raw workload -> Workload -----------------------------------------------------------


MAX_ROLLOUT_ON_ENTRIES = 64
"""More copies than this in a rollout-on annotation, and it is ignored as a whole (not opted
in): a tenant writes it, and every event of its workload parses it."""
MAX_ROLLOUT_ON_LENGTH = 16384
"""Characters of a rollout-on annotation past which it is ignored as a whole (64 names of 253)."""


def rollout_on(annotations: Mapping[str, Any]) -> tuple[str, ...]:
    """The copy names of one rollout-on annotation (comma-separated, blanks ignored).

    Bounded before it is split: past `MAX_ROLLOUT_ON_LENGTH` characters or
    `MAX_ROLLOUT_ON_ENTRIES` entries it names nothing.
    """
    raw = annotations.get(ROLLOUT_ON)
    if not isinstance(raw, str):
        return ()
    if len(raw) > MAX_ROLLOUT_ON_LENGTH or raw.count(",") >= MAX_ROLLOUT_ON_ENTRIES:
        return ()
    return tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))


def asked_for(*places: Mapping[str, Any]) -> tuple[str, ...]:
    """The copies a workload asks for: the union of the rollout-on annotations of `places`.

    The places are its metadata's, then its pod template's annotations; names come in order,
    each once. Each annotation is bounded on its own (`rollout_on`: one past the caps names
    nothing, and the other still counts), and so is the union: past `MAX_ROLLOUT_ON_ENTRIES`
    names or `MAX_ROLLOUT_ON_LENGTH` characters (joined by commas) it names nothing, so two
    places ask for no more than one may.
    """
    lists = [names for notes in places if (names := rollout_on(notes))]
    if len(lists) <= 1:  # one place (or none): already bounded
        return lists[0] if lists else ()
    names = tuple(dict.fromkeys(n for each in lists for n in each))
    if len(names) > MAX_ROLLOUT_ON_ENTRIES:
        return ()
    if sum(map(len, names)) + len(names) - 1 > MAX_ROLLOUT_ON_LENGTH:
        return ()
    return names


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) else default


def progressing(kind: WorkloadKind, obj: Mapping[str, Any]) -> bool:
    """Tell whether the workload's last rollout is still under way (as `kubectl rollout status`).

    A Deployment past its progress deadline no longer counts: it is stuck, and a newer content
    may be what unsticks it.
    """
    meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    if _int(st.get("observedGeneration")) < _int(meta.get("generation")):
        return True
    if kind is WorkloadKind.DAEMONSET:
        want = _int(st.get("desiredNumberScheduled"))
        return (
            _int(st.get("updatedNumberScheduled")) < want or _int(st.get("numberAvailable")) < want
        )
    want = _int(spec.get("replicas"), 1)
    updated = _int(st.get("updatedReplicas"))
    if kind is WorkloadKind.STATEFULSET:
        if (spec.get("updateStrategy") or {}).get("type") == "OnDelete":
            return False
        revision = st.get("updateRevision")
        behind = revision is not None and st.get("currentRevision") != revision
        return behind or _int(st.get("readyReplicas")) < want
    for c in st.get("conditions") or ():
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return False
    return (
        updated < want
        or _int(st.get("replicas")) > updated
        or _int(st.get("availableReplicas")) < updated
    )


def _ours(annotations: Mapping[str, Any], prefix: str) -> tuple[tuple[str, str], ...]:
    """Projector's annotations under `prefix`, never the user's rollout-on.

    The stamps' prefix is also rollout-on's, and an apply carrying it would take it over.
    """
    return tuple(
        sorted(
            (k, str(v)) for k, v in annotations.items() if k.startswith(prefix) and k != ROLLOUT_ON
        )
    )


def parser(kind: WorkloadKind) -> Callable[[Obj], Workload]:
    """The informer's parser for one kind."""

    def parse(obj: Obj) -> Workload:
        meta = obj["metadata"]
        notes = meta.get("annotations") or {}
        template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
        template_notes = template.get("annotations") or {}
        return Workload(
            ref=Ref(kind, meta["namespace"], meta["name"]),
            uid=str(meta.get("uid", "")),
            copies=asked_for(notes, template_notes),
            stamps=_ours(template_notes, STAMP),
            seen=_ours(notes, SEEN),
            busy=progressing(kind, obj),
            resource_version=str(meta.get("resourceVersion", "")),
        )

    return parse


def key_of(kind: WorkloadKind) -> Callable[[Obj], Ref]:
    """The cache key of a workload object of `kind`."""

    def key(obj: Obj) -> Ref:
        meta = obj["metadata"]
        return Ref(kind, meta["namespace"], meta["name"])

    return key


def copy_stamp(c: Copy) -> str | None:
    """A copy's stamp if projector owns it (its field manager wrote the owner mark)."""
    h = c.annotations.get(HASH_ANNOTATION)
    return stamp_of(h, c.uid) if h and c.grant_uid is not None and not c.deleting else None
